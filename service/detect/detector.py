"""Regression detection on merged closed-window aggregates: sequential tests whose
false-alarm rate holds however often they look.

It sees the closed windows that are published (merged over partitions) and evaluates
each window boundary of event time in order, so ``run``, ``demo`` and ``replay`` open
the same regressions for the same events, however they were batched.

Every comparison is a one-sided mixture sequential probability ratio test
(:mod:`service.metrics.sequential`) of "candidate mean minus baseline mean", looked at
every boundary. The e-values of a slice's metrics are closed over them (the smallest
mean over any set of them containing the metric), and a regression opens when that
reaches ``slices / alpha`` of its family (Bonferroni over the family's slices), the drop
is at least ``min_effect`` and both sides have ``min_labelled`` values. By Ville's
inequality a family whose versions do not differ opens nothing, at any look, with
probability at least ``1 - alpha``.
Metrics: the configured ones plus the labelled share (queries with a relevant label).

* **deploy / canary**: when a retriever version first appears in a segment that already
  had traffic, the version that served most of the segment's labelled queries in the
  ``candidate_ms`` before the switch is the previous one; the new version's windows
  since the switch are watched for ``deploy_watch_ms``, one family of ``alpha`` per
  deploy. While the previous version still serves beside it (a *canary*), the two are
  compared over the same span since the switch: the same traffic mix, hours and label
  maturity. Once it no longer serves (a full rollout, or a promoted canary), the new
  version is compared with the previous one over the same hours of up to
  ``baseline_days`` previous days, day-to-day variation counted
  (:mod:`service.detect.days`; with less than a day of its history: as long a span just
  before the switch as the new version has served, at least ``no_history_span_ms`` and
  at most ``baseline_ms``, plus whatever the previous version served after, through a
  straight line in time that both versions share, so that a daily cycle's slope cancels
  (:mod:`service.detect.trend`); and only for ``no_history_watch_ms`` after the switch,
  since its curvature biases the line more the longer it runs). Both sides end at the
  new version's last closed window; a version that served nothing for ``candidate_ms``
  (rolled back) is no longer tested.
  A promoted canary keeps one comparison (one key): two thirds of its alpha in the
  canary phase, the rest after (:mod:`service.detect.budget`).
* **pooled deploy**: a version deployed to several segments is also tested once over all
  of them (segment ``*``), a stratified difference (each segment's difference weighted
  by its share of the new version's values) with twice or more the evidence of any one
  segment: the deploy's primary test, with three quarters of its ``alpha``; the
  segments' own tests share the rest, and a version's only segment carries the primary
  share itself until a second one is compared (:mod:`service.detect.budget`).
* **drift**: outside deploys, a false-alarm budget for the whole deployment
  (``drift_budget`` per 30 days) is spent in epoch-aligned periods of
  ``drift_period_ms``: in each, a slice's windows since the period start are compared
  with its own windows over the same hours of up to ``baseline_days`` previous days (so
  a daily cycle of traffic and quality cancels, and the days' spread is counted as for
  a deploy), one sequential test per slice and metric, restarted every period; the
  period's share of the budget is split over the slices that had ``min_labelled``
  queries the day before the period began (fixed for the period).
* **label shift**: in the same periods, each slice's label sources' shares against the
  same hours a day earlier, on their own budget; one falling while the others hold opens a
  ``label_shift`` and holds the slice's drift openings back (:mod:`.label_shift`).

A regression stays open while its version serves, whether or not its comparison still
runs; it closes only as ``rolled_back``, ``superseded`` or ``recovered``
(:mod:`service.detect.lifecycle`). Every comparison held, running or not and why not:
:mod:`service.detect.status`.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from service.detect.budget import drift_family
from service.detect.days import same_hours
from service.detect.deploys import deploy_comparison, deploy_plans, find_previous
from service.detect.history import SliceHistory, window_row
from service.detect.label_shift import LabelShifts
from service.detect.ledger import Decisions, Ledger, Recorder
from service.detect.lifecycle import Lifecycle
from service.detect.model import (
    DRIFT_LABEL,
    LABELLED_SHARE,
    BoundaryTest,
    ComparisonKind,
    Deploy,
    DetectorConfig,
    Family,
    Plan,
    Regression,
    RegressionKey,
)
from service.detect.plans import Comparison, RunKey, look, run_key, slice_plans
from service.detect.status import ComparisonBook, WhyNot
from service.metrics.ir import MetricKey
from service.stream.windows import ClosedWindow, SliceKey
from service.times import DAY_MS

DEPLOY = ComparisonKind.DEPLOY
CANARY = ComparisonKind.CANARY
DRIFT = ComparisonKind.DRIFT
LABEL_SHIFT = ComparisonKind.LABEL_SHIFT


@dataclass(slots=True)
class Detector:
    """Evaluates every window boundary in order; keeps the open regressions."""

    config: DetectorConfig = field(default_factory=DetectorConfig)
    open: dict[RegressionKey, Regression] = field(default_factory=dict)
    opened: deque[Regression] = field(default_factory=deque)
    """Regressions opened, in order: all of them (replay), or the last ``keep_opened``."""
    keep_opened: int | None = 10_000
    closed: deque[Regression] = field(default_factory=deque)
    """Regressions closed, in order of closing (as many as ``opened`` keeps)."""
    latest: dict[RegressionKey, BoundaryTest] = field(default_factory=dict)
    """The comparisons of the last evaluated boundary."""
    through_ms: int | None = None
    """The last evaluated boundary."""
    recorder: Recorder | None = None
    """``run``: the decisions go to a ledger (:mod:`service.detect.ledger`)."""
    _series: dict[SliceKey, SliceHistory] = field(default_factory=dict)
    _deploys: dict[SliceKey, Deploy | None] = field(default_factory=dict)
    _canaried: set[SliceKey] = field(default_factory=set)
    """New versions that served beside their previous one (a canary phase)."""
    _pooled: set[tuple[str, str]] = field(default_factory=set)
    """Deploys (version, previous version) whose pooled test has looked: none of their
    segments' own tests carries the primary share any more."""
    _spent: set[RunKey] = field(default_factory=set)
    """Runs whose regression closed: a run's evidence includes the bad hours, so it never
    opens again (a new run, the next drift period or deploy, may)."""
    _running: dict[RunKey, float] = field(default_factory=dict)
    """The smallest 1 / closed e-value so far of each run of a sequential test."""
    _last_log_e: dict[RunKey, float] = field(default_factory=dict)
    """The latest log e-value of each run (a metric not tested at a look keeps it: the
    e-process stopped there)."""
    _period: int | None = None
    _family: frozenset[SliceKey] = frozenset()
    _watched: tuple[MetricKey, ...] = ()
    comparisons: ComparisonBook = field(init=False)
    """Every comparison held, running or not (``/api/v1/tests``)."""
    _life: Lifecycle = field(init=False)
    _shifts: LabelShifts = field(init=False)

    def __post_init__(self) -> None:
        self.opened = deque(maxlen=self.keep_opened)
        self.closed = deque(maxlen=self.keep_opened)
        self._watched = self.config.watched
        self.comparisons = ComparisonBook(self._watched)
        self._life = Lifecycle(self.config, self._series, self._deploys, self._watched)
        self._shifts = LabelShifts(self.config)

    def add(self, windows: Iterable[ClosedWindow]) -> None:
        """Merge closed windows (any partition, any order; a repeat replaces its copy)."""
        metrics, share = self.config.metrics, self.config.labelled_share
        for w in (w for w in windows if w.queries):  # (a window of audits only: no values)
            key = (w.retriever, w.segment)
            series = self._series.get(key)
            if series is None:
                series = self._series[key] = SliceHistory(3 * len(self._watched))
            series.add(w.start_ms, w.partition, window_row(w, metrics, share))
            self._shifts.add(w)

    def advance(self, closed_through_ms: int) -> list[Regression]:
        """Evaluate every boundary up to ``closed_through_ms``; return the regressions opened."""
        step = self.config.window_ms
        last = closed_through_ms - closed_through_ms % step
        firsts = [s.first_start_ms for s in self._series.values() if s.first_start_ms is not None]
        if not firsts:
            self._take_ledger(last + step)
            return []
        boundary = min(firsts) + step
        if self.through_ms is not None:
            boundary = max(boundary, self.through_ms + step)
        reach = self.config.reach_ms
        # most calls have no new boundary (a commit without a newly closed window)
        starts = (
            sorted({start for s in self._series.values() for start in s.starts})
            if boundary <= last
            else []
        )
        opened: list[Regression] = []
        was = self.through_ms
        while boundary <= last:
            self._take_ledger(boundary)
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
        self._take_ledger(last + step)  # (evaluated through the ledger's last: at once)
        self._forget(last)
        if self.recorder is not None and self.through_ms != was:
            self.closed, self.opened = self.recorder.advanced(last, self.closed, self.opened)
        return opened

    def restore(self, ledger: Ledger) -> None:
        """Take back a ledger read at start (``run``): see :mod:`service.detect.ledger`."""
        if self.recorder is None:
            raise ValueError("restore needs a detector that records its decisions")
        self.recorder.pending = ledger

    def _take_ledger(self, boundary: int) -> None:
        """Install a ledger waiting to be, before ``boundary`` if it speaks for none after."""
        if self.recorder and (d := self.recorder.due(boundary, self.latest, self._resume)):
            self._install(d)

    def _resume(self, regression: Regression, boundary: int) -> None:
        kind = regression.opening.kind
        (self._shifts.resume if kind == LABEL_SHIFT else self._life.resume)(regression, boundary)

    def _install(self, decisions: Decisions) -> None:
        """The ledger's decisions as of its last boundary (its own were scratch until then)."""
        self.open = {r.key: r for r in decisions.open}
        self.opened = deque(decisions.opened, self.keep_opened)
        self.closed = deque(decisions.closed, self.keep_opened)
        self._spent = {r.run for r in decisions.closed}
        self._shifts.install([*decisions.open, *decisions.closed])

    # -- one boundary ---------------------------------------------------------------------

    def _evaluate(self, boundary: int) -> list[Regression]:
        plans = self._plan(boundary)
        period = self.config.drift_period_start(boundary)
        # label shifts first: one opening now holds back the slice's drift openings now
        shifts = self._shifts.look(boundary, period, self._drift_family(period))
        results = [c for _, c in shifts] + self._look(plans)
        plans = [p for p, _ in shifts] + plans
        before, self.latest = self.latest, {c.key: c for c in results}
        self.comparisons.looked(results, boundary)
        opened: list[Regression] = []
        for plan, c in zip(plans, results, strict=True):
            current = self.open.get(c.key)
            if current is not None:
                current.latest = c
            elif c.regressed and run_key(plan) not in self._spent:
                kind = plan.family.kind
                if kind == DRIFT and self._shifts.held(plan.slice, plan.family.start_ms):
                    continue  # (a change of the labels, not of retrieval)
                shift = kind == LABEL_SHIFT
                if shift and self._retrieval_open(plan.slice):
                    continue  # (its sources moved apart because retrieval changed)
                regression = (self._shifts.opened if shift else self._life.open)(plan, c, boundary)
                self.open[c.key] = regression
                self.opened.append(regression)
                opened.append(regression)
        closing = []
        for regression in list(self.open.values()):
            reason = self._life.age(regression, boundary)
            if reason is None and regression.opening.kind == LABEL_SHIFT:
                reason = self._shifts.age(regression, boundary)
            if reason is not None:
                regression.closed_ms = boundary + self.config.attribution_ms
                regression.closed_reason = reason
                del self.open[regression.key]
                self.closed.append(regression)
                closing.append(regression)
                self._spent.add(regression.run)
        if self.recorder is not None:
            left = [self.open[k] for k in before if k not in self.latest and k in self.open]
            self.recorder.evaluated(boundary, opened, closing, left)
        return opened

    def _retrieval_open(self, key: SliceKey) -> bool:
        """A regression of retrieval is open in this slice (a label shift then does not
        open: a drop of the answers found lowers clicks more than citations that also
        reach chunks retrieval missed)."""
        return any(key in r.slices and r.opening.kind != LABEL_SHIFT for r in self.open.values())

    def _plan(self, boundary: int) -> list[Plan]:
        """Every look to make at this boundary: deploys, pooled deploys, drift."""
        cfg = self.config
        planned: list[Plan] = []
        period = cfg.drift_period_start(boundary)
        drift_family = self._drift_family(period)
        groups: dict[tuple[str, str], list[tuple[SliceKey, Comparison]]] = {}
        book = self.comparisons
        for key, series in self._series.items():
            deploy = self._deploy(key, series, boundary)
            if deploy is None:
                if key in self._deploys:  # decided: seen from the start of the history
                    book.stopped(key, DEPLOY, None, WhyNot.NO_BASELINE)
            elif boundary > deploy.at_ms + cfg.deploy_watch_ms:
                book.stopped(key, book.kind_of(key), deploy.previous, WhyNot.WATCH_ENDED)
            else:
                comparison = deploy_comparison(
                    cfg, self._series, self._canaried, key, deploy=deploy, boundary=boundary
                )
                if isinstance(comparison, WhyNot):
                    book.stopped(key, book.kind_of(key), deploy.previous, comparison)
                else:
                    groups.setdefault((key[0], deploy.previous), []).append((key, comparison))
            if key in drift_family:
                base = same_hours(series, period, boundary, cfg.baseline_days)
                candidate = series.total(period, boundary)
                family = Family(DRIFT, DRIFT_LABEL, cfg.drift_alpha, len(drift_family), period)
                book.compared(key, family, base, candidate)
                planned += slice_plans(
                    key, (family, base, candidate), self._watched, cfg.min_labelled
                )
            else:
                young = series.first_start_ms is None or series.first_start_ms > period - DAY_MS
                why = WhyNot.NO_BASELINE if young else WhyNot.TOO_FEW_VALUES
                book.stopped(key, DRIFT, DRIFT_LABEL, why)
        planned += deploy_plans(
            cfg,
            groups,
            deploys=self._deploys,
            canaried=self._canaried,
            pooled=self._pooled,
            book=book,
            watched=self._watched,
        )
        return planned

    def _look(self, plans: list[Plan]) -> list[BoundaryTest]:
        cfg, caps = self.config, self._shifts.caps
        # the labelled share's drift test: an intersection-union test over the sources
        union = {
            run_key(p): caps[p.slice]
            for p in plans
            if p.family.kind == DRIFT and p.metric == LABELLED_SHARE and p.slice in caps
        }
        return look(
            plans,
            self._watched,
            cfg.tau,
            cfg.min_effect,
            last_log_e=self._last_log_e,
            running=self._running,
            caps=union,
        )

    def _drift_family(self, period: int) -> frozenset[SliceKey]:
        """The slices drift-tested in the period starting at ``period`` (fixed for it)."""
        if self._period != period:
            self._period = period
            self._family = drift_family(self._series, period, self.config.min_labelled)
        return self._family

    # -- deploys and retention ------------------------------------------------------------

    def _deploy(self, key: SliceKey, series: SliceHistory, boundary: int) -> Deploy | None:
        """The deploy of this slice's version, decided once its first window is closed."""
        if key in self._deploys:
            return self._deploys[key]
        at = series.first_start_ms
        if at is None or at + self.config.window_ms > boundary:
            return None  # not decided yet
        deploy = find_previous(self._series, key, at, self.config)
        self._deploys[key] = deploy
        return deploy

    def _forget(self, boundary: int) -> None:
        cfg = self.config
        keep_from = boundary - cfg.reach_ms - cfg.window_ms
        for key, series in list(self._series.items()):
            series.drop_before(keep_from)
            deploy = self._deploys.get(key)
            watched = deploy is not None and boundary <= deploy.at_ms + cfg.deploy_watch_ms
            if not series and not watched:
                del self._series[key]
                self._deploys.pop(key, None)
                self._canaried.discard(key)
        deployed = {retriever for retriever, _ in self._deploys}
        self._canaried = {k for k in self._canaried if k[0] in deployed}
        self._pooled = {k for k in self._pooled if k[0] in deployed}
        self._running = {k: p for k, p in self._running.items() if self._live(k, boundary)}
        self._spent = {k for k in self._spent if self._live(k, boundary)}
        self._last_log_e = {k: e for k, e in self._last_log_e.items() if self._live(k, boundary)}
        self.comparisons.forget(set(self._series))
        self._shifts.forget(keep_from, boundary)

    def _live(self, run: RunKey, boundary: int) -> bool:
        """This drift period's runs, and deploys still watched."""
        if run[3] in (DRIFT, LABEL_SHIFT):
            return run[4] == self.config.drift_period_start(boundary)
        return boundary <= run[4] + self.config.deploy_watch_ms

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
