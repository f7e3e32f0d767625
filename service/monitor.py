"""The composition root of the pure core: the pipeline, and the view of its windows.

The stream core (:mod:`service.stream`) turns records into closed windows and never
imports the detector; detection (:mod:`service.detect`) consumes closed windows. A
:class:`Monitor` wires the two through a :class:`WindowView`, which keeps the rolling
views and the listing (merged over partitions, each window once) and runs the detector
at every boundary up to which all windows have closed: fed by the pipeline's confirmed
windows in one process (``demo``, ``replay``), by the windows topic and the group's
progress in ``run`` (every replica: the global view). The HTTP API and the rolling and
regression series read the view. ``run``, ``demo``,
``replay`` and the tests build the same Monitor, so they reach the same verdicts on the
same events.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from service.detect.detector import Detector
from service.detect.model import DetectorConfig
from service.metrics.ir import metric_keys
from service.stream.counters import Counts
from service.stream.pipeline import Pipeline, PipelineConfig
from service.stream.watermark import NEVER
from service.stream.windows import ClosedWindow, ClosedWindows, WindowIdent
from service.times import HOUR_MS, duration_field


@dataclass(frozen=True, slots=True)
class MonitorConfig:
    """The core's parameters: the pipeline's and the detector's (milliseconds).

    The detector is given the pipeline's window, attribution window and metric keys here,
    once (whether built from the settings, :func:`service.config.monitor_config`, or by
    hand)."""

    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    detector: DetectorConfig = field(default_factory=DetectorConfig)
    progress_stall_ms: int = duration_field("15m")
    """A partition whose progress has not moved for this long (wall clock) while others
    moved is left out of the global boundary (``--progress-stall``)."""

    def __post_init__(self) -> None:
        # the detector reads the pipeline's windows: their width, attribution and metrics
        join = self.pipeline.join
        keys = metric_keys(self.pipeline.ks)
        watched = tuple(m for m in self.detector.metrics if m in keys) or ("mrr",)
        fitted = replace(
            self.detector,
            window_ms=join.window_ms,
            attribution_ms=join.attribution_ms,
            metrics=watched,
        )
        object.__setattr__(self, "detector", fitted)


class WindowView:
    """Closed windows merged over partitions, each once: rolling views, listing, detector.

    Fed in one of two ways. *Local* (``demo``, ``replay``, a single process's own
    windows): the pipeline adds the windows it confirms and advances the detector to
    the boundary its partitions have closed; the rolling views end at its watermark.
    *Global* (``run``): the windows-topic follower adds every replica's windows and
    applies the progress every input partition has committed
    (:meth:`apply_progress`); the boundary is the smallest progress over all input
    partitions, and the rolling views end at that boundary plus the attribution window.
    """

    def __init__(
        self,
        window_ms: int,
        rolling_ms: tuple[int, ...],
        detector: Detector,
        watermark_ms: Callable[[], int | None] | None = None,
        *,
        attribution_ms: int = 0,
        stall_ms: int,
    ) -> None:
        self.closed = ClosedWindows(window_ms, max(rolling_ms))
        self.rolling_ms = rolling_ms
        self.detector = detector
        self._watermark_ms = watermark_ms
        self.attribution_ms = attribution_ms
        self.stall_ms = stall_ms
        self.progress: dict[int, int] = {}
        """Global mode: input partition -> the progress it committed (event time)."""
        self.behind: set[int] = set()
        """Global mode: partitions left out of the boundary (stalled, unowned)."""
        self._moved_ms: dict[int, int] = {}
        """Global mode: wall time at which each partition's progress last moved."""
        self.boundary_ms: int | None = None
        """Global mode: every window ending at or before this is in the view."""
        self.delay_ms: int | None = None
        """Global mode: wall time from the last window's publication to its arrival here."""
        self.bad_records = 0
        """Global mode: records of the windows topic that were not window records."""
        self._seen: dict[WindowIdent, int] = {}
        """The windows merged lately (by ident), with their end (a repeat is identical)."""
        self._check = 100_000

    @property
    def is_global(self) -> bool:
        """Fed from the windows topic and the group's progress (``run``)."""
        return self._watermark_ms is None

    @property
    def watermark_ms(self) -> int | None:
        """Where the rolling views end (None before any event time)."""
        if self._watermark_ms is not None:
            return self._watermark_ms()
        return None if self.boundary_ms is None else self.boundary_ms + self.attribution_ms

    def apply_progress(
        self, progress: Mapping[int, int], partitions: int, now_ms: int
    ) -> int | None:
        """Global mode: the committed progress of the input partitions; run the detector.

        The boundary is the smallest progress over all ``partitions``. A partition that
        has not committed any progress yet is waited for. One whose progress has not
        moved for ``stall_ms`` of wall time while another's did (its owner died and no
        one took it over yet, or it is stuck) is left out and listed in :attr:`behind`,
        so it cannot hold detection for ever; its windows join the view when they come,
        but boundaries already evaluated are not evaluated again. A partition that is
        catching up a backlog, or has no traffic (idleness moves its watermark), commits
        moving progress and is never left out.
        """
        for p, closed in progress.items():
            if closed > self.progress.get(p, NEVER):
                self.progress[p] = closed
                self._moved_ms[p] = now_ms
        known = [self.progress.get(p) for p in range(partitions)]
        if not known or any(v is None for v in known):
            return self.boundary_ms
        values = [v for v in known if v is not None]
        moved = [self._moved_ms[p] for p in range(partitions)]
        latest = max(moved)
        self.behind = {
            p for p, at in enumerate(moved) if now_ms - at > self.stall_ms and at < latest
        }
        boundary = min(v for p, v in enumerate(values) if p not in self.behind)
        if self.boundary_ms is None or boundary > self.boundary_ms:
            self.boundary_ms = boundary
            self.detector.advance(boundary)
        return self.boundary_ms

    def add(self, windows: Sequence[ClosedWindow]) -> None:
        """Merge windows in; one seen before (a repeat of an identical record) is skipped."""
        new = []
        for w in windows:
            ident = w.ident
            if ident not in self._seen:
                self._seen[ident] = w.end_ms
                new.append(w)
        if len(self._seen) > self._check:
            horizon = max(self._seen.values()) - 2 * self.closed.retention_ms
            self._seen = {k: end for k, end in self._seen.items() if end >= horizon}
            self._check = max(100_000, 2 * len(self._seen))
        self.closed.add(new)
        self.detector.add(new)

    def advance(self, closed_through_ms: int) -> object:
        """Every window ending at or before ``closed_through_ms`` is in: run the detector."""
        return self.detector.advance(closed_through_ms)


class Monitor:
    """The pipeline of one process and the view of its windows."""

    def __init__(
        self,
        config: MonitorConfig,
        now_ms: Callable[[], int],
        counts: Counts | None = None,
        keep_opened: int | None = 10_000,
        *,
        global_view: bool = False,
    ) -> None:
        self.config = config
        self.pipeline = Pipeline(config.pipeline, now_ms, counts)
        join = config.pipeline.join
        self.detector = Detector(config.detector, keep_opened=keep_opened)
        self.view = WindowView(
            join.window_ms,
            config.pipeline.rolling_ms,
            self.detector,
            None if global_view else lambda: self.pipeline.watermark_ms,
            attribution_ms=join.attribution_ms,
            stall_ms=config.progress_stall_ms,
        )
        if not global_view:  # in run, the follower feeds the view from the topic
            self.pipeline.sinks.append(self.view)

    @property
    def history_ms(self) -> int:
        """How much published history the rolling views and the detector use (plus slack)."""
        d = self.detector.config
        reach = d.reach_ms + d.window_ms
        return max(reach, *self.config.pipeline.rolling_ms) + 2 * d.attribution_ms + HOUR_MS
