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
from collections.abc import Iterable
from dataclasses import dataclass, field

from service.detect.history import SliceHistory
from service.detect.model import (
    BoundaryTest,
    ComparisonKind,
    Deploy,
    DetectorConfig,
    Plan,
    Regression,
    RegressionKey,
    Side,
    Sums,
)
from service.metrics.aggregates import Moments
from service.metrics.stats import holm_adjust, welch_test
from service.stream.windows import ClosedWindow, SliceKey

DEPLOY = ComparisonKind.DEPLOY
DRIFT = ComparisonKind.DRIFT


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
    latest: dict[RegressionKey, BoundaryTest] = field(default_factory=dict)
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
        planned: list[Plan] = []
        for key, series in self._series.items():
            candidate = series.total(boundary - cfg.candidate_ms, boundary)
            deploy = self._deploy(key, series, boundary)
            drift_hi = boundary - cfg.candidate_ms
            drift = series.total(drift_hi - cfg.baseline_ms, drift_hi)
            sides = [Side(DRIFT, cfg.drift_label, drift, candidate)]
            if deploy is not None and boundary <= deploy.at_ms + cfg.deploy_watch_ms:
                # everything since the deploy: evidence accumulates instead of sliding
                since = series.total(deploy.at_ms, boundary)
                sides.append(Side(DEPLOY, deploy.previous, deploy.baseline, since))
            for index, metric in enumerate(cfg.metrics):
                for kind, label, base_sums, cand_sums in sides:
                    base, cand = _moments(base_sums, index), _moments(cand_sums, index)
                    if min(base.count, cand.count) >= cfg.min_labelled:
                        planned.append(Plan(key, metric, kind, label, base, cand))
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

    def _test(self, planned: list[Plan]) -> list[BoundaryTest]:
        cfg = self.config
        raw = []
        for plan in planned:
            base, cand = plan.base, plan.candidate
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
            members = [i for i, plan in enumerate(planned) if plan.kind == kind]
            for i, p in zip(members, holm_adjust([raw[i].p_lower for i in members]), strict=True):
                adjusted[i] = p
        out = []
        for plan, r, p in zip(planned, raw, adjusted, strict=True):
            key, metric, kind, label, base, cand = plan
            out.append(
                BoundaryTest(
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

    def snapshot(self) -> list[tuple[RegressionKey, bool, BoundaryTest]]:
        """What to expose: every key tested at the last boundary and every open regression."""
        rows: dict[RegressionKey, tuple[bool, BoundaryTest]] = {
            key: (key in self.open, c) for key, c in self.latest.items()
        }
        for key, regression in self.open.items():
            if key not in rows:
                rows[key] = (True, regression.latest)
        return [(key, flag, c) for key, (flag, c) in sorted(rows.items())]
