"""The view of closed windows that the API, the rolling, regression and estimate series read.

Merged over partitions, each window once, it keeps the rolling views (with their audited
estimates: :meth:`WindowView.estimates`) and the listing and runs the detector at every
boundary up to which all windows have closed. *Local* (``demo``, ``replay``): fed by the
pipeline's confirmed windows, its boundary the one the pipeline's partitions have
closed. *Global* (``run``, every replica alike): fed by the windows topic and the
progress every input partition committed, its boundary the smallest progress, a stalled
partition left out after a while.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence

from service.audit.book import slice_estimates
from service.audit.estimate import Estimate
from service.core.judges import JudgeBook
from service.detect.detector import Detector
from service.stream.rolling import ClosedWindows, SliceTotals
from service.stream.watermark import NEVER
from service.stream.windows import ClosedWindow, SliceKey, WindowIdent

EstimateKey = tuple[str, str, str]
"""(retriever, segment or ``*`` for all its segments, metric key)."""


class ViewMode(enum.Enum):
    """How a :class:`WindowView` is fed."""

    LOCAL = "local"
    """The pipeline of this process (``demo``, ``replay``, the tests)."""
    GLOBAL = "global"
    """The windows topic and the group's progress (``run``)."""


class WindowView:
    """Closed windows merged over partitions, each once: rolling views and their audited
    estimates, listing, detector.

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
        mode: ViewMode,
        *,
        watermark_ms: Callable[[], int | None] | None = None,
        attribution_ms: int = 0,
        stall_ms: int,
        metric_keys: tuple[str, ...] = (),
        early: bool = False,
    ) -> None:
        if (mode is ViewMode.LOCAL) != (watermark_ms is not None):
            raise ValueError("a local view needs the pipeline's watermark, a global one none")
        self.mode = mode
        self.closed = ClosedWindows(window_ms, max(rolling_ms))
        self.judges = JudgeBook(window_ms, max(rolling_ms))
        """Judge agreement of the windows, for the same spans as the rolling views."""
        self.rolling_ms = rolling_ms
        self.detector = detector
        self._watermark_ms = watermark_ms
        """Local mode: the pipeline's watermark (where the rolling views end)."""
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
        self.early = early
        """The detector reads the early windows (``add_early``), not the final ones."""
        self.early_progress: dict[int, int] = {}
        """Global mode: input partition -> its early windows' committed progress."""
        self.detected_ms: int | None = None
        """Global mode: the detector's boundary (the early windows' one, when it reads them)."""
        self.delay_ms: int | None = None
        """Global mode: wall time from the last window's publication to its arrival here."""
        self.bad_records = 0
        """Global mode: records of the windows topic that were not window records."""
        self._seen: dict[WindowIdent, int] = {}
        """The windows merged lately (by ident), with their end (a repeat is identical)."""
        self._check = 100_000
        self.metric_keys = metric_keys
        """The metric keys of the audited estimates (the pipeline's)."""
        self._estimates: dict[int, tuple[dict[SliceKey, SliceTotals], dict[EstimateKey, Estimate]]]
        self._estimates = {}
        """Span -> the rolling view its estimates were computed from, and them."""

    @property
    def is_global(self) -> bool:
        """Fed from the windows topic and the group's progress (``run``)."""
        return self.mode is ViewMode.GLOBAL

    @property
    def watermark_ms(self) -> int | None:
        """Where the rolling views end (None before any event time)."""
        if self._watermark_ms is not None:
            return self._watermark_ms()
        return None if self.boundary_ms is None else self.boundary_ms + self.attribution_ms

    def estimates(self, span_ms: int) -> dict[EstimateKey, Estimate]:
        """The audited estimates over the windows ending within ``span_ms`` of the view's
        end (the rolling view's windows, merged over partitions), per (retriever, segment)
        and pooled over segments (``*``), for every metric key; empty before any event time.

        Computed from the rolling view's merged totals, and again only when that view is
        (a window added, the end crossing a window end): scrapes are frequent. The result
        must not be modified.
        """
        wm = self.watermark_ms
        if wm is None:
            return {}
        view = self.closed.rolling(span_ms, wm)
        cached = self._estimates.get(span_ms)
        if cached is not None and cached[0] is view:
            return cached[1]
        if len(self._estimates) > 16:
            self._estimates.clear()
        found = slice_estimates(view.items(), self.metric_keys)
        self._estimates[span_ms] = (view, found)
        return found

    def apply_progress(
        self,
        progress: Mapping[int, int],
        partitions: int,
        now_ms: int,
        early: Mapping[int, int] | None = None,
    ) -> int | None:
        """Global mode: the committed progress of the input partitions; run the detector.

        The boundary is the smallest progress over all ``partitions``. A partition that
        has not committed any progress yet is waited for. One whose progress has not
        moved for ``stall_ms`` of wall time while another's did (its owner died and no
        one took it over yet, or it is stuck) is left out and listed in :attr:`behind`,
        so it cannot hold detection for ever; its windows join the view when they come,
        but boundaries already evaluated are not evaluated again. A partition that is
        catching up a backlog, or has no traffic (idleness moves its watermark), commits
        moving progress and is never left out. ``early``: the progress of the early windows
        (the detector's boundary when it reads them: the smallest over the same partitions;
        a partition without one counts with its final progress).
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
        detect = boundary
        if self.early:
            for p, through in (early or {}).items():
                self.early_progress[p] = max(through, self.early_progress.get(p, NEVER))
            detect = min(
                max(self.early_progress.get(p, NEVER), self.progress[p])
                for p in range(partitions)
                if p not in self.behind
            )
        if self.detected_ms is None or detect > self.detected_ms:
            self.detected_ms = detect
            self.detector.advance(detect)
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
        self.judges.add(new)
        if not self.early:
            self.detector.add(new)

    def add_early(self, windows: Sequence[ClosedWindow]) -> None:
        """Merge early windows in (the detector's, when it reads them; a repeat replaces
        its identical copy)."""
        if self.early:
            self.detector.add(windows)

    def advance(self, closed_through_ms: int) -> object:
        """Every window ending at or before ``closed_through_ms`` is in: run the detector."""
        return self.detector.advance(closed_through_ms)
