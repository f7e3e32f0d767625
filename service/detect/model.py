"""What the detector is configured with and what it finds: tests, regressions, deploys."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NamedTuple

from service.detect.budget import DRIFT_BUDGET_SPAN_MS, drift_alpha
from service.detect.recovery import Recovery
from service.metrics.aggregates import Moments
from service.metrics.ir import MetricKey
from service.metrics.sequential import SequentialResult
from service.stream.join_state import JoinConfig
from service.stream.windows import SliceKey
from service.times import DAY_MS, duration_field, rfc3339

Sums = list[int] | tuple[int, ...]
"""Flat (count, sum_fx, sum_sq_fx) per watched metric."""
RegressionKey = tuple[str, str, MetricKey, str]
"""(retriever, segment, metric, baseline label)."""


class ComparisonKind(StrEnum):
    """Which test a comparison is: it says against what a slice is compared.

    ``deploy``: a new version against the previous one's past (the previous version no
    longer serves). ``canary``: a new version against the previous one over the same
    span while both serve. ``drift``: a version against itself at the same hours of the
    days before.
    """

    DEPLOY = "deploy"
    CANARY = "canary"
    DRIFT = "drift"
    LABEL_SHIFT = "label_shift"
    """Not of retrieval: one label source's labelled share against the same hours the day
    before, dropping while the slice's other sources hold (:mod:`.label_shift`)."""


class CloseReason(StrEnum):
    """Why a regression closed (a regression never closes because its test stopped).

    ``rolled_back``: the version stopped serving in the slice and a version that served
    before it serves instead. ``superseded``: a version that appeared after it serves
    instead. ``recovered``: it still serves, and the recovery test showed the drop gone
    (:mod:`service.detect.lifecycle`).
    """

    ROLLED_BACK = "rolled_back"
    SUPERSEDED = "superseded"
    RECOVERED = "recovered"


LABELLED_SHARE: MetricKey = "labelled_share"
"""Finalised queries with at least one relevant label / all finalised queries: a retriever
that stops finding the answer often leaves no click at all, so its queries leave the
means of the other metrics instead of lowering them."""


MAX_BASELINE_DAYS = 28
"""The most previous days a deploy's baseline may span (the detector keeps their windows)."""
MAX_DRIFT_BUDGET = 100.0
"""The most false drift alarms per 30 days a deployment may budget."""


@dataclass(frozen=True, slots=True)
class DetectorConfig:
    """What to test and how strictly; times in event-time milliseconds.

    The defaults and the checks of the ``--regression-*`` settings are these
    (:mod:`service.config` reads them here, and reports a failed check by its flag).
    """

    metrics: tuple[MetricKey, ...] = ("recall@5", "hit_rate@5", "mrr", "ndcg@10")
    labelled_share: bool = True
    """Also watch :data:`LABELLED_SHARE` (with the same guarantees)."""
    window_ms: int = JoinConfig().window_ms
    """The join's (a monitor gives the detector its pipeline's)."""
    attribution_ms: int = JoinConfig().attribution_ms
    """Only for ``opened_at``: the evidence is complete that long after its last window."""
    candidate_ms: int = duration_field("1h")
    """Which version a new one replaces (the one with most labelled queries in this span
    before the switch), and whether it still serves beside it (any query in this span)."""
    baseline_ms: int = duration_field("24h")
    """Without a day of the previous version's history, a deploy is compared with the
    previous version over as long a span before the switch as the new version has served
    since (at least ``no_history_span_ms``, at most this)."""
    deploy_watch_ms: int = duration_field("24h")
    """How long after a version first appears it is compared with the previous one."""
    no_history_watch_ms: int = duration_field("4h")
    """Without a day of the previous version's history, how long after the switch the
    deploy comparison runs. It fits one straight line in time to both versions, with a
    jump at the switch (:mod:`service.detect.trend`): a daily cycle's slope cancels, and
    what biases it is the cycle's curvature, more the longer it runs. Within 4 h any cycle
    whose curvature is at most a +-4-point 24-hour sinusoid's biases it by less than 1.8
    points (a sinusoid itself: 0.8; at 6 h: 4.5 and 1.1), below ``min_effect``."""
    no_history_span_ms: int = duration_field("4h")
    """Without a day of the previous version's history, the least span of its hours
    before the switch that the line is fitted on (once the new version has served longer,
    as long a span as it has served): a longer span fixes the slope better and lets the
    cycle's curvature bias it more."""
    baseline_days: int = 7
    """With days of history, a deploy is compared with the previous version's same hours
    on up to this many previous days, and a slice's drift test with its own, day-to-day
    variation counted (:mod:`service.detect.days`)."""
    min_labelled: int = 200
    min_effect: float = 0.02
    """The smallest drop (absolute, in metric units) worth a regression."""
    alpha: float = 0.01
    """Per deploy of a version: the probability that a deploy which changes nothing ever
    opens a regression, in any of its comparisons and metrics, during its whole watch;
    three quarters to the primary test pooled over its segments, the rest to the
    segments' own (:mod:`service.detect.budget`)."""
    tau: float = 0.05
    """Scale of the mixture over effects: drops near it are found fastest."""
    drift_budget: float = 0.5
    """Expected false drift alarms per 30 days for the whole deployment (all slices and
    metrics together)."""
    label_shift_budget: float = 0.2
    """Expected false label shifts (tickets, not pages) per 30 days for the whole
    deployment, spent in the drift periods as ``drift_budget`` is, over every slice and
    label source tested (:mod:`service.detect.label_shift`); beside ``drift_budget``. With
    a deploy a day (``alpha`` each, 0.3 per 30 days), the defaults bound every false
    alarm, pages and tickets together, by 0.5 + 0.3 + 0.2 = 1 per 30 days."""
    drift_period_ms: int = duration_field("6h")
    """Drift tests restart every period (epoch-aligned), each spending its share of the
    budget; a slice is compared with itself over the same hours of up to
    ``baseline_days`` previous days."""
    close_after_ms: int = duration_field("1h")
    """A regression closes as ``recovered`` once its recovery test has shown the drop gone
    at every boundary for this long (:mod:`service.detect.lifecycle`)."""

    def __post_init__(self) -> None:
        for name in (
            "candidate_ms",
            "baseline_ms",
            "deploy_watch_ms",
            "no_history_watch_ms",
            "no_history_span_ms",
            "close_after_ms",
            "drift_period_ms",
        ):
            value = getattr(self, name)
            if value <= 0 or value % self.window_ms:
                raise ValueError(f"{name} must be a positive multiple of the window, got {value}")
        if self.drift_period_ms > DAY_MS:
            raise ValueError(f"drift_period_ms must be at most a day, got {self.drift_period_ms}")
        if not 1 <= self.baseline_days <= MAX_BASELINE_DAYS:
            raise ValueError(
                f"baseline_days must lie in [1, {MAX_BASELINE_DAYS}], got {self.baseline_days}"
            )
        if self.min_labelled < 2:
            raise ValueError(f"min_labelled must be at least 2, got {self.min_labelled}")
        if not 0.0 < self.alpha < 1.0:
            raise ValueError(f"alpha must lie in (0, 1), got {self.alpha}")
        for name in ("drift_budget", "label_shift_budget"):
            budget = getattr(self, name)
            if not (
                0.0 < budget <= MAX_DRIFT_BUDGET
                and budget < DRIFT_BUDGET_SPAN_MS / self.drift_period_ms
            ):
                raise ValueError(
                    f"{name} must be positive, at most {MAX_DRIFT_BUDGET} and below 30 days "
                    f"over drift_period_ms, got {budget}"
                )
        if not 0.0 < self.tau < 1.0:
            raise ValueError(f"tau must lie in (0, 1), got {self.tau}")
        if not 0.0 <= self.min_effect < 1.0:
            raise ValueError(f"min_effect must lie in [0, 1), got {self.min_effect}")
        if not self.metrics:
            raise ValueError("at least one metric must be watched")

    @property
    def watched(self) -> tuple[MetricKey, ...]:
        """Every metric tested: the configured ones, then the labelled share."""
        return (*self.metrics, LABELLED_SHARE) if self.labelled_share else self.metrics

    @property
    def drift_alpha(self) -> float:
        """One drift period's share of the budget, for all slices and metrics together."""
        return drift_alpha(self.drift_budget, self.drift_period_ms)

    @property
    def label_shift_alpha(self) -> float:
        """One drift period's share of the label-shift budget (all slices and sources)."""
        return drift_alpha(self.label_shift_budget, self.drift_period_ms)

    def drift_period_start(self, boundary_ms: int) -> int:
        """Start of the drift period whose windows end at ``boundary_ms`` (epoch-aligned)."""
        return (boundary_ms - 1) // self.drift_period_ms * self.drift_period_ms

    @property
    def reach_ms(self) -> int:
        """How far back the detector reads windows."""
        return max(
            self.candidate_ms + self.baseline_ms,
            self.deploy_watch_ms + self.baseline_days * DAY_MS,
            self.baseline_days * DAY_MS + self.drift_period_ms,
        )


DRIFT_LABEL = "previous_day"
"""The ``baseline`` label of drift comparisons (kept since the baseline became up to
``baseline_days`` previous days, so that alerts and dashboards keep their series)."""
POOLED_SEGMENT = "*"
"""The ``segment`` label of a deploy or canary comparison pooled over every segment the
new version was deployed to (a deploy to one segment has none)."""


@dataclass(frozen=True, slots=True)
class BoundaryTest:
    """One look of one sequential test of one metric of one slice, at one boundary."""

    retriever: str
    segment: str
    metric: MetricKey
    baseline: str
    """The previous version's name (deploy, canary) or ``previous_day`` (drift)."""
    kind: ComparisonKind
    baseline_mean: float
    candidate_mean: float
    n_baseline: int
    n_candidate: int
    delta: float
    look: SequentialResult
    """The look's test (its confidence sequence, :attr:`ci`, is computed from it when
    asked for)."""
    log_e: float
    """log of this look's e-value: the one-sided mixture likelihood ratio (evidence of a
    drop against "the candidate is not worse")."""
    closed_log_e: float
    """log of the e-value closed over the slice's metrics: the smallest mean of the
    e-values of any set of them containing this one (it opens the regression)."""
    level: float
    """The level of this test: its family's alpha over the family's slices."""
    family_alpha: float
    """The family's error rate: a deploy's, or a drift period's share of the budget."""
    p_value: float
    """Always valid: the smallest ``1 / closed e-value`` so far in this test's run, times
    the family's slices (at most the family's alpha once it opened)."""
    regressed: bool
    """The closed e-value is at least ``1 / level`` and the drop at least the minimum
    effect."""

    @property
    def key(self) -> RegressionKey:
        return (self.retriever, self.segment, self.metric, self.baseline)

    @property
    def ci(self) -> tuple[float, float]:
        """The confidence sequence of the delta at the test's level: it covers the true
        difference at every look at once."""
        return self.look.ci

    @property
    def ci_low(self) -> float:
        return self.ci[0]

    @property
    def ci_high(self) -> float:
        return self.ci[1]

    @property
    def e_value(self) -> float:
        return math.exp(min(self.log_e, 700.0))

    @property
    def closed_e_value(self) -> float:
        return math.exp(min(self.closed_log_e, 700.0))


@dataclass(slots=True)
class Regression:
    """A regression of one metric of one slice against one baseline: open until its
    version stops serving or its recovery test shows the drop gone (never because a test
    stopped running)."""

    opening: BoundaryTest
    latest: BoundaryTest
    """The latest look of its comparison (the opening one, or a later one while the
    comparison still runs)."""
    opened_ms: int
    """Event time at which the evidence was complete (its last window end + attribution)."""
    evidence_end_ms: int
    since_ms: int
    """When the regressed version began serving in the slice (its deploy), as the detector
    saw it: a version first seen before this that serves instead of it is a rollback."""
    slices: tuple[SliceKey, ...]
    """The regressed version's slices: its own, or each segment of a pooled deploy."""
    recovery: Recovery | None
    """The recovery test (None: the baseline's profile covers no hour of the day)."""
    recovery_log_e: float = 0.0
    """The recovery test's statistic at the last boundary (log of its e-value)."""
    recovered_since_ms: int | None = None
    """The first boundary of the current run of boundaries at which the recovery test
    showed the drop gone."""
    run_start_ms: int = 0
    """When the run of the test that opened it began (its deploy, or drift period)."""
    closed_ms: int | None = None
    closed_reason: CloseReason | None = None

    @property
    def key(self) -> RegressionKey:
        return self.opening.key

    @property
    def run(self) -> tuple[str, str, MetricKey, ComparisonKind, int]:
        """The run of the sequential test that opened it."""
        c = self.opening
        return (c.retriever, c.segment, c.metric, c.kind, self.run_start_ms)

    def to_record(self) -> dict[str, Any]:
        """The ``replay --regressions-out`` line (``closed_at`` and ``closed_reason`` are
        null while it is open)."""
        c = self.opening
        ci_low, ci_high = c.ci  # (computed when asked for: once)
        return {
            "retriever": c.retriever,
            "segment": c.segment,
            "metric": c.metric,
            "baseline": c.baseline,
            "kind": c.kind,
            "baseline_mean": c.baseline_mean,
            "candidate_mean": c.candidate_mean,
            "delta": c.delta,
            "ci_low": ci_low,
            "ci_high": ci_high,
            "p_value": c.p_value,
            "e_value": c.e_value,
            "closed_e_value": c.closed_e_value,
            "alpha": c.family_alpha,
            "level": c.level,
            "n_baseline": c.n_baseline,
            "n_candidate": c.n_candidate,
            "opened_at": rfc3339(self.opened_ms),
            "evidence_end": rfc3339(self.evidence_end_ms),
            "closed_at": None if self.closed_ms is None else rfc3339(self.closed_ms),
            "closed_reason": None if self.closed_reason is None else str(self.closed_reason),
        }


@dataclass(frozen=True, slots=True)
class Deploy:
    """A retriever version that appeared in a segment."""

    previous: str
    at_ms: int
    days: int = 0
    """The whole days before the switch the previous version had served, at most
    ``baseline_days``: the deploy comparison uses its same hours on each of them
    (:mod:`service.detect.days`); none, a line across the switch."""
    segments: int = 1
    """The segments the previous version served queries in during the hour before the
    switch: the deploy's diagnosis tests share their budget over them."""


class Family(NamedTuple):
    """A family of sequential tests sharing one error rate: Bonferroni over its slices,
    closed testing over each slice's metrics."""

    kind: ComparisonKind
    baseline: str
    """The ``baseline`` label of its tests."""
    alpha: float
    slices: int
    """How many slices share the family (each with every watched metric)."""
    start_ms: int
    """When this run of the tests began (the deploy, or the drift period)."""


Stratum = tuple[Moments, Moments]
"""One segment's (baseline, candidate) sums of one metric."""


class Plan(NamedTuple):
    """One look of one test to make at a boundary."""

    slice: SliceKey
    metric: MetricKey
    family: Family
    strata: tuple[Stratum, ...]
    """One (baseline, candidate) per segment: one for a slice, several for a version's
    deploy pooled over its segments."""
