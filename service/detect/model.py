"""What the detector is configured with and what it finds: tests, regressions, deploys."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NamedTuple

from service.metrics.aggregates import Moments
from service.metrics.ir import MetricKey
from service.metrics.stats import WelchResult
from service.stream.windows import SliceKey
from service.times import DAY_MS, HOUR_MS, duration_label, rfc3339

Sums = list[int] | tuple[int, ...]
"""Flat (count, sum_fx, sum_sq_fx) per watched metric."""
RegressionKey = tuple[str, str, MetricKey, str]
"""(retriever, segment, metric, baseline label)."""


class ComparisonKind(StrEnum):
    """Against what a slice is compared: the previous version (deploy) or its own past."""

    DEPLOY = "deploy"
    DRIFT = "drift"


@dataclass(frozen=True, slots=True)
class DetectorConfig:
    """What to test and how strictly; times in event-time milliseconds."""

    metrics: tuple[MetricKey, ...] = ("recall@5", "hit_rate@5", "mrr", "ndcg@10")
    window_ms: int = 300_000
    attribution_ms: int = 1_800_000
    """Only for ``opened_at``: the evidence is complete that long after its last window."""
    candidate_ms: int = HOUR_MS
    baseline_ms: int = DAY_MS
    deploy_watch_ms: int = DAY_MS
    """How long after a version first appears it is compared with the previous one."""
    min_labelled: int = 200
    min_effect: float = 0.02
    """The smallest drop (absolute, in metric units) worth a regression."""
    alpha: float = 0.005
    """Family-wise error rate of the deploy comparisons of one boundary (Holm)."""
    drift_alpha: float = 0.001
    """Family-wise error rate of the drift tests of one boundary (Holm); drift is tested
    all the time, deploys only for a while after each, so drift gets the stricter level."""
    close_after_ms: int = HOUR_MS

    def __post_init__(self) -> None:
        for name in ("candidate_ms", "baseline_ms", "deploy_watch_ms", "close_after_ms"):
            value = getattr(self, name)
            if value <= 0 or value % self.window_ms:
                raise ValueError(f"{name} must be a positive multiple of the window, got {value}")
        if self.min_labelled < 2:
            raise ValueError(f"min_labelled must be at least 2, got {self.min_labelled}")
        for name in ("alpha", "drift_alpha"):
            if not 0.0 < getattr(self, name) < 1.0:
                raise ValueError(f"{name} must lie in (0, 1), got {getattr(self, name)}")
        if not 0.0 <= self.min_effect < 1.0:
            raise ValueError(f"min_effect must lie in [0, 1), got {self.min_effect}")
        if not self.metrics:
            raise ValueError("at least one metric must be watched")

    @property
    def drift_label(self) -> str:
        """The ``baseline`` label of drift comparisons: ``previous_24h``."""
        return f"previous_{duration_label(self.baseline_ms)}"


@dataclass(frozen=True, slots=True)
class BoundaryTest:
    """One one-sided test of one metric of one slice against one baseline, at one boundary."""

    retriever: str
    segment: str
    metric: MetricKey
    baseline: str
    """The previous version's name (deploy) or ``previous_24h`` (drift)."""
    kind: ComparisonKind
    baseline_mean: float
    candidate_mean: float
    n_baseline: int
    n_candidate: int
    delta: float
    se: float
    df: float
    p_value: float
    """One-sided Welch p-value, Holm-adjusted over the boundary's family."""
    p_raw: float
    regressed: bool
    """Significant and at least the minimum effect."""

    @property
    def key(self) -> RegressionKey:
        return (self.retriever, self.segment, self.metric, self.baseline)

    @property
    def ci(self) -> tuple[float, float]:
        """95% interval of the delta (computed when asked: the quantile is the costly part)."""
        return WelchResult(self.delta, self.se, self.df, self.p_raw, 1.0).ci


@dataclass(slots=True)
class Regression:
    """An open (or closed) regression of one metric of one slice against one baseline."""

    opening: BoundaryTest
    latest: BoundaryTest
    opened_ms: int
    """Event time at which the evidence was complete (its last window end + attribution)."""
    evidence_end_ms: int
    last_true_ms: int
    closed_ms: int | None = None

    def to_record(self) -> dict[str, Any]:
        """The ``replay --regressions-out`` line."""
        c = self.opening
        return {
            "retriever": c.retriever,
            "segment": c.segment,
            "metric": c.metric,
            "baseline": c.baseline,
            "kind": c.kind,
            "baseline_mean": c.baseline_mean,
            "candidate_mean": c.candidate_mean,
            "delta": c.delta,
            "ci_low": c.ci[0],
            "ci_high": c.ci[1],
            "p_value": c.p_value,
            "n_baseline": c.n_baseline,
            "n_candidate": c.n_candidate,
            "opened_at": rfc3339(self.opened_ms),
            "evidence_end": rfc3339(self.evidence_end_ms),
        }


@dataclass(frozen=True, slots=True)
class Deploy:
    """A retriever version that appeared in a segment, with its frozen baseline."""

    previous: str
    at_ms: int
    baseline: tuple[int, ...]


class Plan(NamedTuple):
    """One test to make at a boundary, before the family's correction."""

    slice: SliceKey
    metric: MetricKey
    kind: ComparisonKind
    baseline: str
    base: Moments
    candidate: Moments


class Side(NamedTuple):
    """The sums of one comparison of a slice: what it is against, and both sides."""

    kind: ComparisonKind
    label: str
    base: Sums
    candidate: Sums
