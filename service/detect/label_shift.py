"""Label shifts: a drop of one label source that the slice's other sources do not show.

Live labels come from several sources (clicks, citations in generated answers,
judgments). A prompt that cites less, or a page that shows results differently, lowers
one source's labels while retrieval is unchanged; the labelled share and, through the
mix of labels, the other metrics then move with no change of retrieval behind them.
A real retrieval drop lowers every source at once.

* **The test**: in every drift period, each slice of the drift family is tested per
  source: the source's labelled share (finalised queries with a relevant label from that
  source; a 0/1 value per query) since the period began against the same hours one day
  earlier, with the drift tests' mixture SPRT. Tested are the sources with
  ``min_labelled`` labelled queries the day before the period (fixed for the period);
  the period's share of ``label_shift_budget`` is split evenly over those (slice,
  source) pairs, so a deployment whose labels do not change opens a label shift about
  ``label_shift_budget`` times per 30 days at most (Ville, union bound). The e-values
  are not closed over the slice's metrics, and the metrics' are not over the sources.
* **A label shift** of a source opens when its test reaches its level, its share fell by
  at least ``min_effect``, and every other source of the slice with ``min_labelled``
  labels on both sides fell by less than half as much, relatively (``HOLD_SHARE``): at
  least one other source must hold. Not while a regression of retrieval of the slice is
  open (:class:`service.detect.detector.Detector`): retrieval is then known to have
  changed, and a drop of the answers found lowers clicks more than citations, which also
  reach chunks retrieval missed. ``kind`` ``label_shift``, ``metric``
  ``source_labelled_share:<source>``, ``baseline`` ``previous_day``.
* **What it holds back**: while a slice has a label shift open, and for the rest of every
  drift period in which it had one, the slice's drift regressions of retrieval metrics
  do not open (its deploy and canary comparisons run as before). And the drift test of
  the labelled share is an intersection-union test over the major sources: its e-value
  is the smallest of its own and theirs (:attr:`LabelShifts.caps`), which under "some
  source's share did not drop" is still an e-value (and never above its own), so a drop
  of one major source alone never opens a labelled-share regression, whatever the timing.
* **Closing**: as ``rolled_back`` or ``superseded`` when its version stops serving
  (:mod:`service.detect.lifecycle`, as any regression); as ``recovered`` once, at every
  boundary for ``close_after_ms``, the source's share over the last ``candidate_ms``
  is no longer below the same hours a day earlier by half the opening's relative drop:
  a source that came back, or (a day after a lasting change) a day-before baseline that
  has the new level. Both are pure functions of the windows (:meth:`LabelShifts.resume`).
  The drift period in which it closed opens no label shift of its key again (its run's
  baseline may still hold hours before the change); the next period's baseline, a day
  before it, comes after the change.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from service.detect.history import SliceHistory
from service.detect.lifecycle import recovered_run
from service.detect.model import (
    DRIFT_LABEL,
    BoundaryTest,
    CloseReason,
    ComparisonKind,
    DetectorConfig,
    Family,
    Plan,
    Regression,
    RegressionKey,
)
from service.detect.plans import Measured, RunKey, conclude, measure, moments, run_key
from service.metrics.aggregates import SCALE
from service.metrics.ir import MetricKey
from service.stream.labels import SOURCES
from service.stream.windows import ClosedWindow, SliceKey
from service.times import DAY_MS

LABEL_SHIFT = ComparisonKind.LABEL_SHIFT
SOURCE_METRIC = "source_labelled_share:"
"""The ``metric`` of a label shift: this and the source's name."""
HOLD_SHARE = 0.5
"""Another source holds when its relative drop is less than this share of the tested
source's (a retrieval drop lowers every source: none holds)."""
MAJOR_SHARE = 0.25
"""A source takes part in the labelled share's intersection-union test when its share is
at least this part of the largest source's (:func:`_union_cap`)."""
CATCH_UP_MIN = 30
"""Labelled queries from the source the day-before hour needs for the closing check."""


def source_metric(source: str) -> MetricKey:
    return SOURCE_METRIC + source


def source_row(window: ClosedWindow) -> list[int]:
    """A window's row: (queries, labelled * SCALE, labelled * SCALE) per source."""
    row: list[int] = []
    for source in SOURCES:
        labelled = window.sources.get(source, 0) * SCALE
        row += (window.queries, labelled, labelled)
    return row


def _union_cap(measured: Iterable[tuple[Plan, Measured]]) -> float:
    """The smallest drop log e-value of the slice's major sources: those whose baseline
    share is at least ``MAJOR_SHARE`` of the largest one's. A minor source (a few
    judgments) barely moves the labelled share when it shifts, and under a real drop its
    small share gathers evidence slowly: it would only slow the labelled share's test."""
    ms = [m for _, m in measured]
    largest = max(m.baseline_mean for m in ms)
    return min(m.result.log_e_drop for m in ms if m.baseline_mean >= MAJOR_SHARE * largest)


def relative(m: Measured) -> float:
    """Candidate share over baseline share (1: held)."""
    return m.candidate_mean / m.baseline_mean if m.baseline_mean > 0 else 1.0


class LabelShifts:
    """The label-shift tests of every slice, and what they hold back."""

    def __init__(self, config: DetectorConfig) -> None:
        self.config = config
        self.series: dict[SliceKey, SliceHistory] = {}
        """Each slice's per-source rows (the same windows as the detector's histories)."""
        self.caps: dict[SliceKey, float] = {}
        """Per slice, at the last boundary: the smallest log e-value of its sources' drop
        tests (the labelled share's drift test takes no more: an intersection-union test)."""
        self.known: list[Regression] = []
        """Label shifts open, or closed within the last day (what :meth:`held` reads)."""
        self._period: int | None = None
        self._tested: dict[SliceKey, tuple[int, ...]] = {}
        self._pairs = 0
        self._running: dict[RunKey, float] = {}

    def add(self, window: ClosedWindow) -> None:
        key = (window.retriever, window.segment)
        series = self.series.get(key)
        if series is None:
            series = self.series[key] = SliceHistory(3 * len(SOURCES))
        series.add(window.start_ms, window.partition, source_row(window))

    def look(
        self, boundary: int, period: int, drift_family: frozenset[SliceKey]
    ) -> list[tuple[Plan, BoundaryTest]]:
        """The label-shift looks of this boundary (a drift family's slices)."""
        cfg = self.config
        self._fix_family(period, drift_family)
        family = Family(LABEL_SHIFT, DRIFT_LABEL, cfg.label_shift_alpha, self._pairs, period)
        self.caps = {}
        out = []
        for key, indices in self._tested.items():
            series = self.series.get(key)
            if series is None:
                continue
            base = series.total(period - DAY_MS, boundary - DAY_MS)
            candidate = series.total(period, boundary)
            measured: dict[int, tuple[Plan, Measured]] = {}
            for i in indices:
                b, c = moments(base, i), moments(candidate, i)
                if min(b.count, c.count) >= cfg.min_labelled:
                    plan = Plan(key, source_metric(SOURCES[i]), family, ((b, c),))
                    measured[i] = plan, measure(plan, cfg.tau)
            if not measured:
                continue
            self.caps[key] = _union_cap(measured.values())
            for i, (plan, m) in measured.items():
                run = run_key(plan)
                test, smallest = conclude(
                    plan, m, m.result.log_e_drop, cfg.min_effect, self._running.get(run)
                )
                self._running[run] = smallest
                if test.regressed and (
                    not self._others_hold(i, m, measured, base, candidate)
                    or self._closed_since(test.key, period)
                ):
                    test = replace(test, regressed=False)
                out.append((plan, test))
        return out

    def held(self, key: SliceKey, period: int) -> bool:
        """Whether the slice had a label shift open at a boundary of the drift period
        starting at ``period`` (its drift regressions of retrieval then do not open)."""
        attribution = self.config.attribution_ms
        return any(
            key in r.slices
            and r.evidence_end_ms <= period + self.config.drift_period_ms
            and (r.closed_ms is None or r.closed_ms - attribution > period)
            for r in self.known
        )

    def opened(self, plan: Plan, c: BoundaryTest, boundary: int) -> Regression:
        """The regression of a label shift that opens at ``boundary``."""
        series = self.series[plan.slice]
        regression = Regression(
            opening=c,
            latest=c,
            opened_ms=boundary + self.config.attribution_ms,
            evidence_end_ms=boundary,
            since_ms=series.first_start_ms if series.first_start_ms is not None else boundary,
            slices=(plan.slice,),
            recovery=None,
            run_start_ms=plan.family.start_ms,
        )
        self.known.append(regression)
        return regression

    def install(self, regressions: Iterable[Regression]) -> None:
        """The label shifts among a ledger's open and closed regressions."""
        self.known = [r for r in regressions if r.opening.kind == LABEL_SHIFT]

    def age(self, regression: Regression, boundary: int) -> CloseReason | None:
        """Whether a label shift whose version still serves (or that nothing replaced:
        :meth:`service.detect.lifecycle.Lifecycle.age`) closes as recovered at
        ``boundary``, or None."""
        gone = self._caught_up(regression, boundary)
        return recovered_run(regression, boundary, gone, self.config.close_after_ms)

    def resume(self, regression: Regression, boundary: int) -> None:
        """Set ``recovered_since_ms`` as :meth:`age` left it at ``boundary``, from the
        windows alone (a replica that takes the label shift from the ledger)."""
        regression.recovered_since_ms = None
        b, step = boundary, self.config.window_ms
        while b > regression.evidence_end_ms and boundary - b < self.config.close_after_ms:
            if not self._caught_up(regression, b):
                break
            regression.recovered_since_ms = b
            b -= step

    def forget(self, keep_from: int, boundary: int) -> None:
        """Forget windows before ``keep_from``, and label shifts closed a day before."""
        for key, series in list(self.series.items()):
            series.drop_before(keep_from)
            if not series:
                del self.series[key]
        self.known = [
            r for r in self.known if r.closed_ms is None or r.closed_ms > boundary - DAY_MS
        ]
        self._running = {k: p for k, p in self._running.items() if k[4] == self._period}

    # -- inside ---------------------------------------------------------------------------

    def _fix_family(self, period: int, drift_family: frozenset[SliceKey]) -> None:
        """The (slice, source) pairs tested in this period: fixed at its start."""
        if self._period == period:
            return
        self._period, self._tested = period, {}
        for key in sorted(drift_family):
            series = self.series.get(key)
            if series is None:
                continue
            before = series.total(period - DAY_MS, period)
            indices = tuple(
                i
                for i in range(len(SOURCES))
                if moments(before, i).sum_fx >= self.config.min_labelled * SCALE
            )
            if indices:
                self._tested[key] = indices
        self._pairs = sum(len(v) for v in self._tested.values())

    def _closed_since(self, key: RegressionKey, period: int) -> bool:
        """A label shift of this key closed at a boundary of this drift period: its run
        (whose baseline may still hold hours before the change) opens nothing more."""
        after = period + self.config.attribution_ms
        return any(
            r.key == key and r.closed_ms is not None and r.closed_ms > after for r in self.known
        )

    def _others_hold(
        self,
        index: int,
        m: Measured,
        measured: dict[int, tuple[Plan, Measured]],
        base: list[int],
        candidate: list[int],
    ) -> bool:
        """Every other source with ``min_labelled`` labels on both sides fell by less than
        ``HOLD_SHARE`` of this one's relative drop, and there is at least one."""
        need = self.config.min_labelled * SCALE
        others = [
            other
            for j, (_, other) in measured.items()
            if j != index
            and moments(base, j).sum_fx >= need
            and moments(candidate, j).sum_fx >= need
        ]
        drop = 1.0 - relative(m)
        return bool(others) and all(1.0 - relative(o) < HOLD_SHARE * drop for o in others)

    def _caught_up(self, regression: Regression, boundary: int) -> bool:
        """The source's share over the last ``candidate_ms`` is below the same hours a day
        earlier by less than half the opening's relative drop."""
        series = self.series.get(regression.slices[0])
        if series is None:
            return False
        c = regression.opening
        index = SOURCES.index(c.metric.removeprefix(SOURCE_METRIC))
        lo = boundary - self.config.candidate_ms
        before = moments(series.total(lo - DAY_MS, boundary - DAY_MS), index)
        now = moments(series.total(lo, boundary), index)
        if before.sum_fx < CATCH_UP_MIN * SCALE or not now.count:
            return False
        opening_drop = 1.0 - (c.candidate_mean / c.baseline_mean if c.baseline_mean else 1.0)
        share_before, share_now = before.sum_fx / before.count, now.sum_fx / now.count
        return share_now >= share_before * (1.0 - HOLD_SHARE * opening_drop)
