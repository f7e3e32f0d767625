"""Regression detection on merged closed-window aggregates: deploy comparison and drift.

The detector sees the same closed windows that are published (merged over partitions)
and evaluates once per window boundary ``T`` of event time, in order, so the result
depends only on the windows and not on how they were batched: ``run``, ``demo`` and
``replay`` open the same regressions for the same events.

At boundary ``T`` every window ending at or before ``T`` is closed, which means its
queries are final: the attribution window has passed and labels no longer change.
Windows still maturing are never compared. For each (retriever, segment) and each
watched metric the *candidate* is the last ``candidate_ms`` of closed windows, compared
with two baselines:

* **deploy**: when a retriever version first appears in a segment that already had
  traffic, the version that served most of the segment's labelled queries in the
  ``candidate_ms`` before the switch is the previous version; its last ``baseline_ms``
  before the switch is frozen as the baseline for ``deploy_watch_ms``, and the new
  version's candidate is everything since the switch (evidence accumulates, so a real
  drop stays detected and a short-lived blip is diluted);
* **drift**: the same slice's ``baseline_ms`` just before the candidate.

Each comparison is a one-sided Welch t-test of "the candidate mean is lower". The
deploy comparisons of one boundary form one family and the drift tests another, each
corrected with Holm's method over its metrics x slices; a boundary's family-wise error
is at most ``alpha + drift_alpha``. A regression opens when the adjusted p-value is
below its family's level *and* the drop is at least ``min_effect`` *and* both sides
have at least ``min_labelled`` values;
it closes once that has been false (or untestable) for ``close_after_ms`` of event time.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from service.detect.history import SliceHistory
from service.metrics.aggregates import Moments
from service.metrics.stats import WelchResult, holm_adjust, welch_test
from service.stream.windows import ClosedWindow, SliceKey
from service.times import DAY_MS, HOUR_MS, duration_label, rfc3339

DEPLOY = "deploy"
DRIFT = "drift"

Sums = list[int] | tuple[int, ...]
"""Flat (count, sum_fx, sum_sq_fx) per watched metric."""
RegressionKey = tuple[str, str, str, str]
"""(retriever, segment, metric, baseline label)."""


@dataclass(frozen=True, slots=True)
class DetectorConfig:
    """What to test and how strictly; times in event-time milliseconds."""

    metrics: tuple[str, ...] = ("recall@5", "hit_rate@5", "mrr", "ndcg@10")
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
class Comparison:
    """One test at one boundary."""

    retriever: str
    segment: str
    metric: str
    baseline: str
    """The previous version's name (deploy) or ``previous_24h`` (drift)."""
    kind: str
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

    opening: Comparison
    latest: Comparison
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


def _moments(flat: Sums, index: int) -> Moments:
    return Moments(flat[3 * index], flat[3 * index + 1], flat[3 * index + 2])


@dataclass(slots=True)
class Detector:
    """Evaluates every window boundary in order; keeps the open regressions."""

    config: DetectorConfig = field(default_factory=DetectorConfig)
    open: dict[RegressionKey, Regression] = field(default_factory=dict)
    opened: deque[Regression] = field(default_factory=deque)
    """Regressions opened, in order: all of them (replay), or the last ``keep_opened``."""
    keep_opened: int | None = 10_000
    latest: dict[RegressionKey, Comparison] = field(default_factory=dict)
    """The comparisons of the last evaluated boundary."""
    through_ms: int | None = None
    """The last evaluated boundary."""
    _series: dict[SliceKey, SliceHistory] = field(default_factory=dict)
    _deploys: dict[SliceKey, Deploy | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.opened = deque(maxlen=self.keep_opened)

    def add(self, windows: Iterable[ClosedWindow]) -> None:
        """Merge closed windows (any partition, any order; a repeat replaces its copy)."""
        metrics = self.config.metrics
        width = 3 * len(metrics)
        empty = Moments()
        for w in windows:
            row: list[int] = []
            for name in metrics:
                m = w.metrics.get(name, empty)
                row += (m.count, m.sum_fx, m.sum_sq_fx)
            key = (w.retriever, w.segment)
            series = self._series.get(key)
            if series is None:
                series = self._series[key] = SliceHistory(width)
            series.add(w.start_ms, w.partition, row)

    def advance(self, closed_through_ms: int) -> list[Regression]:
        """Evaluate every boundary up to ``closed_through_ms``; return the regressions opened."""
        step = self.config.window_ms
        last = closed_through_ms - closed_through_ms % step
        firsts = [s.first_start_ms for s in self._series.values() if s.first_start_ms is not None]
        if not firsts:
            return []
        boundary = min(firsts) + step
        if self.through_ms is not None:
            boundary = max(boundary, self.through_ms + step)
        reach = max(self.config.candidate_ms + self.config.baseline_ms, self.config.deploy_watch_ms)
        # most calls have no new boundary (a commit without a newly closed window)
        starts = (
            sorted({start for s in self._series.values() for start in s.starts})
            if boundary <= last
            else []
        )
        opened: list[Regression] = []
        while boundary <= last:
            # nothing within reach and nothing open: jump to the next window (a gap in time)
            i = bisect.bisect_left(starts, boundary - reach)
            if not self.open and (i == len(starts) or starts[i] >= boundary):
                if i == len(starts):
                    break
                boundary = starts[i] + step
                continue
            opened += self._evaluate(boundary)
            self.through_ms = boundary
            boundary += step
        self.through_ms = max(self.through_ms or last, last)
        self._forget(last)
        return opened

    # -- one boundary ---------------------------------------------------------------------

    def _evaluate(self, boundary: int) -> list[Regression]:
        cfg = self.config
        planned: list[tuple[SliceKey, str, str, str, Moments, Moments]] = []
        for key, series in self._series.items():
            candidate = series.total(boundary - cfg.candidate_ms, boundary)
            deploy = self._deploy(key, series, boundary)
            drift_hi = boundary - cfg.candidate_ms
            drift = series.total(drift_hi - cfg.baseline_ms, drift_hi)
            sides: list[tuple[str, str, Sums, Sums]] = [(DRIFT, cfg.drift_label, drift, candidate)]
            if deploy is not None and boundary <= deploy.at_ms + cfg.deploy_watch_ms:
                # everything since the deploy: evidence accumulates instead of sliding
                since = series.total(deploy.at_ms, boundary)
                sides.append((DEPLOY, deploy.previous, deploy.baseline, since))
            for index, metric in enumerate(cfg.metrics):
                for kind, label, base_sums, cand_sums in sides:
                    base, cand = _moments(base_sums, index), _moments(cand_sums, index)
                    if min(base.count, cand.count) >= cfg.min_labelled:
                        planned.append((key, metric, kind, label, base, cand))
        results = self._test(planned)
        self.latest = {c.key: c for c in results}
        opened: list[Regression] = []
        for c in results:
            current = self.open.get(c.key)
            if c.regressed:
                if current is None:
                    regression = Regression(
                        opening=c,
                        latest=c,
                        opened_ms=boundary + cfg.attribution_ms,
                        evidence_end_ms=boundary,
                        last_true_ms=boundary,
                    )
                    self.open[c.key] = regression
                    self.opened.append(regression)
                    opened.append(regression)
                else:
                    current.latest = c
                    current.last_true_ms = boundary
            elif current is not None:
                current.latest = c
        for open_key, regression in list(self.open.items()):
            if boundary - regression.last_true_ms >= cfg.close_after_ms:
                regression.closed_ms = boundary + cfg.attribution_ms
                del self.open[open_key]
        return opened

    def _test(
        self, planned: list[tuple[SliceKey, str, str, str, Moments, Moments]]
    ) -> list[Comparison]:
        cfg = self.config
        raw = []
        for _, _, _, _, base, cand in planned:
            raw.append(
                welch_test(
                    (base.mean or 0.0, base.variance or 0.0, base.count),
                    (cand.mean or 0.0, cand.variance or 0.0, cand.count),
                )
            )
        # two families, each Holm-corrected over its metrics x slices: deploy comparisons
        # (a bounded watch after each deploy) and drift (tested at every boundary)
        adjusted = [1.0] * len(raw)
        for kind in (DEPLOY, DRIFT):
            members = [i for i, plan in enumerate(planned) if plan[2] == kind]
            for i, p in zip(members, holm_adjust([raw[i].p_lower for i in members]), strict=True):
                adjusted[i] = p
        out = []
        for plan, r, p in zip(planned, raw, adjusted, strict=True):
            key, metric, kind, label, base, cand = plan
            out.append(
                Comparison(
                    retriever=key[0],
                    segment=key[1],
                    metric=metric,
                    baseline=label,
                    kind=kind,
                    baseline_mean=base.mean or 0.0,
                    candidate_mean=cand.mean or 0.0,
                    n_baseline=base.count,
                    n_candidate=cand.count,
                    delta=r.delta,
                    se=r.se,
                    df=r.df,
                    p_value=p,
                    p_raw=r.p_lower,
                    regressed=p < (cfg.alpha if kind == DEPLOY else cfg.drift_alpha)
                    and -r.delta >= cfg.min_effect,
                )
            )
        return out

    # -- deploys and retention ------------------------------------------------------------

    def _deploy(self, key: SliceKey, series: SliceHistory, boundary: int) -> Deploy | None:
        """The deploy of this slice's version, decided once its first window is closed."""
        if key in self._deploys:
            return self._deploys[key]
        at = series.first_start_ms
        if at is None or at + self.config.window_ms > boundary:
            return None  # not decided yet
        deploy = self._find_previous(key, at)
        self._deploys[key] = deploy
        return deploy

    def _find_previous(self, key: SliceKey, at: int) -> Deploy | None:
        cfg = self.config
        best: tuple[int, str] | None = None
        history_from = None
        for (retriever, segment), other in self._series.items():
            if segment != key[1] or retriever == key[0]:
                continue
            first = other.first_start_ms
            if first is not None and (history_from is None or first < history_from):
                history_from = first
            recent = other.total(at - cfg.candidate_ms, at)
            labelled = max(recent[0::3], default=0)
            if labelled and (best is None or (labelled, retriever) > best):
                best = (labelled, retriever)
        # a version seen within the first hour of any history is not a deploy but a start
        if best is None or history_from is None or history_from > at - cfg.candidate_ms:
            return None
        previous = self._series[best[1], key[1]]
        return Deploy(best[1], at, tuple(previous.total(at - cfg.baseline_ms, at)))

    def _forget(self, boundary: int) -> None:
        cfg = self.config
        reach = max(cfg.candidate_ms + cfg.baseline_ms, cfg.deploy_watch_ms)
        keep_from = boundary - reach - cfg.window_ms
        for key, series in list(self._series.items()):
            series.drop_before(keep_from)
            deploy = self._deploys.get(key)
            watched = deploy is not None and boundary <= deploy.at_ms + cfg.deploy_watch_ms
            if not series and not watched:
                del self._series[key]
                self._deploys.pop(key, None)

    # -- reading ----------------------------------------------------------------------------

    def snapshot(self) -> list[tuple[RegressionKey, bool, Comparison]]:
        """What to expose: every key tested at the last boundary and every open regression."""
        rows: dict[RegressionKey, tuple[bool, Comparison]] = {
            key: (key in self.open, c) for key, c in self.latest.items()
        }
        for key, regression in self.open.items():
            if key not in rows:
                rows[key] = (True, regression.latest)
        return [(key, flag, c) for key, (flag, c) in sorted(rows.items())]


def compare_metrics(
    baseline: Mapping[str, Moments],
    candidate: Mapping[str, Moments],
    *,
    min_labelled: int,
    min_effect: float,
    alpha: float = 0.05,
) -> list[dict[str, Any]]:
    """Two-sided Welch tests per metric, Holm-adjusted, with a verdict each (``/api/v1/compare``).

    Verdicts: ``regression`` / ``improvement`` (adjusted p < alpha and |delta| >=
    min_effect), ``no_significant_difference``, or ``insufficient_data`` (fewer than
    ``min_labelled`` values on a side).
    """
    rows: list[dict[str, Any]] = []
    tested: list[int] = []
    p_values: list[float] = []
    for metric in sorted(set(baseline) | set(candidate)):
        b, c = baseline.get(metric, Moments()), candidate.get(metric, Moments())
        row: dict[str, Any] = {
            "metric": metric,
            "baseline": {"n": b.count, "mean": b.mean},
            "candidate": {"n": c.count, "mean": c.mean},
            "delta": None,
            "ci_low": None,
            "ci_high": None,
            "p_value": None,
            "verdict": "insufficient_data",
        }
        if b.count >= max(2, min_labelled) and c.count >= max(2, min_labelled):
            r = welch_test(
                (b.mean or 0.0, b.variance or 0.0, b.count),
                (c.mean or 0.0, c.variance or 0.0, c.count),
            )
            row.update(delta=r.delta, ci_low=r.ci[0], ci_high=r.ci[1])
            tested.append(len(rows))
            p_values.append(r.p_two_sided)
        rows.append(row)
    for index, p in zip(tested, holm_adjust(p_values), strict=True):
        row = rows[index]
        row["p_value"] = p
        delta = row["delta"]
        if p < alpha and abs(delta) >= min_effect:
            row["verdict"] = "regression" if delta < 0 else "improvement"
        else:
            row["verdict"] = "no_significant_difference"
    return rows
