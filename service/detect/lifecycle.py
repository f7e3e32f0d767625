"""A regression's life after it opens: what keeps it open and the three things that close it.

A regression stays open while the version it names serves and no test has shown it
recovered. The end of its comparison's watch, too few values, or any other reason a
test stops never closes it. It closes (contract, "A regression's life") when:

* **rolled_back**: the version served nothing in the slice (every segment of a pooled
  deploy) for ``candidate_ms`` while a version that served before it did;
* **superseded**: the same, but the version serving instead appeared after it;
* **recovered**: it still serves, and its recovery test (:mod:`service.detect.recovery`)
  has shown the drop gone at every boundary for ``close_after_ms``.

Traffic that stops altogether is no evidence: the regression stays open.
"""

from __future__ import annotations

import bisect

from service.detect.history import SliceHistory, plus
from service.detect.model import (
    POOLED_SEGMENT,
    BoundaryTest,
    CloseReason,
    ComparisonKind,
    Deploy,
    DetectorConfig,
    Plan,
    Regression,
)
from service.detect.recovery import (
    RECOVERY_MEMORY_MS,
    Recovery,
    Row,
    profile,
    recovery_drop,
    recovery_threshold,
)
from service.metrics.ir import MetricKey
from service.stream.windows import SliceKey
from service.times import DAY_MS


def replacement(
    retriever: str,
    baseline: str,
    since_ms: int,
    serving: dict[str, int | None],
) -> CloseReason | None:
    """Why a version that stopped serving closes, given the versions serving instead
    (name -> the start of their first window the detector holds): a rollback when the
    baseline or a version seen before it serves, else superseded; None when nothing
    serves instead (no traffic is no evidence)."""
    others = {name: first for name, first in serving.items() if name != retriever}
    if not others:
        return None
    if baseline in others or any(
        first is not None and first < since_ms for first in others.values()
    ):
        return CloseReason.ROLLED_BACK
    return CloseReason.SUPERSEDED


def recovered_run(
    regression: Regression, boundary: int, gone: bool, close_after_ms: int
) -> CloseReason | None:
    """``recovered`` once the drop has been shown ``gone`` at every boundary for
    ``close_after_ms`` (the run's first boundary kept in ``recovered_since_ms``), else
    None."""
    if not gone:
        regression.recovered_since_ms = None
        return None
    if regression.recovered_since_ms is None:
        regression.recovered_since_ms = boundary
    if boundary - regression.recovered_since_ms >= close_after_ms:
        return CloseReason.RECOVERED
    return None


class Lifecycle:
    """Ages the open regressions at each boundary, over the detector's slice histories."""

    def __init__(
        self,
        config: DetectorConfig,
        series: dict[SliceKey, SliceHistory],
        deploys: dict[SliceKey, Deploy | None],
        watched: tuple[MetricKey, ...],
    ) -> None:
        self.config = config
        self.series = series
        """The detector's own histories (the same mapping, read only here)."""
        self.deploys = deploys
        """The detector's deploys (the same mapping, read only here)."""
        self.watched = watched
        self.threshold = recovery_threshold(config.window_ms)

    def open(self, plan: Plan, c: BoundaryTest, boundary: int) -> Regression:
        """A regression of this look: its slices, since when its version serves, and the
        frozen baseline of its recovery test."""
        family = plan.family
        retriever, segment = plan.slice
        if segment == POOLED_SEGMENT:
            segments = sorted(
                s
                for (r, s), d in self.deploys.items()
                if r == retriever and d is not None and d.previous == family.baseline
            )
        else:
            segments = [segment]
        slices = tuple((retriever, s) for s in segments)
        if family.kind == ComparisonKind.DRIFT:  # against itself, the day before the period
            series = self.series[plan.slice]
            since = series.first_start_ms if series.first_start_ms is not None else boundary
            baseline = series.rows(family.start_ms - DAY_MS, family.start_ms)
        else:  # the previous version's last day of serving
            since = family.start_ms
            baseline = []
            for s in segments:
                previous = self.series.get((family.baseline, s))
                last = bisect.bisect_left(previous.starts, boundary) if previous else 0
                if previous is not None and last:  # (its last window before the boundary)
                    end = previous.starts[last - 1] + self.config.window_ms
                    baseline += previous.rows(end - DAY_MS, end)
        recovery = profile(
            baseline,
            self.watched.index(plan.metric),
            recovery_drop(c.delta, self.config.min_effect),
        )
        return Regression(
            opening=c,
            latest=c,
            opened_ms=boundary + self.config.attribution_ms,
            evidence_end_ms=boundary,
            since_ms=since,
            slices=slices,
            recovery=recovery,
            run_start_ms=family.start_ms,
        )

    def age(self, regression: Regression, boundary: int) -> CloseReason | None:
        """Why the regression closes at this boundary, or None: it stays open (and its
        recovery statistic is brought up to date)."""
        lo = boundary - self.config.candidate_ms
        retriever = regression.opening.retriever
        if not any(self._serves(key, lo, boundary) for key in regression.slices):
            segments = {segment for _, segment in regression.slices}
            serving = {
                r: series.first_start_ms
                for (r, s), series in self.series.items()
                if s in segments and self._serves((r, s), lo, boundary)
            }
            return replacement(retriever, regression.opening.baseline, regression.since_ms, serving)
        recovery = regression.recovery
        if recovery is None:
            return None
        regression.recovery_log_e = self._statistic(regression, recovery, boundary)
        gone = regression.recovery_log_e >= self.threshold
        return recovered_run(regression, boundary, gone, self.config.close_after_ms)

    def resume(self, regression: Regression, boundary: int) -> None:
        """Set the recovery statistic and ``recovered_since_ms`` of a regression open at
        ``boundary`` as :meth:`age` left them there, from the windows alone (a restarted
        replica that takes the regression from the ledger: :mod:`service.detect.ledger`).

        Both are pure functions of the recent windows: the statistic at a boundary looks
        back at most ``RECOVERY_MEMORY_MS``, and the run of boundaries at which it showed
        the drop gone is found by walking back from ``boundary`` (a boundary at which no
        slice of the version served left both as they were; the run is shorter than
        ``close_after_ms``, or it would have closed)."""
        recovery = regression.recovery
        regression.recovery_log_e, regression.recovered_since_ms = 0.0, None
        if recovery is None:
            return
        step, close_after = self.config.window_ms, self.config.close_after_ms
        latest: int | None = None  # the last boundary at which the version served
        b = boundary
        while b > regression.evidence_end_ms and b > boundary - self.config.reach_ms:
            if latest is not None and latest - b >= close_after:
                break
            lo = b - self.config.candidate_ms
            if any(self._serves(key, lo, b) for key in regression.slices):
                log_e = self._statistic(regression, recovery, b)
                if latest is None:
                    latest, regression.recovery_log_e = b, log_e
                if log_e < self.threshold:
                    break
                regression.recovered_since_ms = b
            b -= step

    def _statistic(self, regression: Regression, recovery: Recovery, boundary: int) -> float:
        """The recovery statistic at ``boundary``: the version's windows since its
        evidence ended, within ``RECOVERY_MEMORY_MS``, merged over its slices."""
        start = max(regression.evidence_end_ms, boundary - RECOVERY_MEMORY_MS)
        merged: dict[int, Row] = {}
        for key in regression.slices:
            series = self.series.get(key)
            for window_start, row in series.rows(start, boundary) if series else ():
                current = merged.get(window_start)
                merged[window_start] = row if current is None else plus(current, row)
        return recovery.statistic(sorted(merged.items()))

    def _serves(self, key: SliceKey, lo: int, hi: int) -> bool:
        series = self.series.get(key)
        return series is not None and series.served(lo, hi)
