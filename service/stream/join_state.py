"""The data the event-time join keeps (see :mod:`service.stream.join`, which alone acts
on it): its settings, its open windows, the waiting feedback, and what the partitions of
one process share (:class:`Intake`). The byte layout of a pending query lives with the
join, in :mod:`service.stream.join`."""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from service.stream.counters import Counts, LabelCap
    from service.stream.events import FeedbackEvent
    from service.stream.mined import LabelRecorder

from service.times import duration_field


@dataclass(frozen=True, slots=True)
class JoinConfig:
    """Event-time parameters in milliseconds (``idle_timeout_ms=None``: no idleness).

    The defaults are the settings' (``--attribution-window``, ``--clock-skew``, ``--window``,
    ``--max-out-of-orderness``, ``--idle-timeout``: :mod:`service.config` reads them here).
    """

    attribution_ms: int = duration_field("30m")
    clock_skew_ms: int = duration_field("5s")
    window_ms: int = duration_field("5m")
    max_out_of_orderness_ms: int = duration_field("60s")
    idle_timeout_ms: int | None = duration_field("30s")
    early_ms: int = duration_field("5m")
    """The label age of the early windows (``--regression-label-age``): each window is also
    aggregated once the watermark passes its end plus this, with only the labels that came
    within this of their query, for the detector (0, or not below ``attribution_ms``: no
    early windows; the detector reads the final ones)."""

    @property
    def early_age_ms(self) -> int | None:
        """The early windows' label age, None when there are none."""
        return self.early_ms if 0 < self.early_ms < self.attribution_ms else None


QueryId = bytes
"""A query id as UTF-8 bytes."""


class OpenWindow:
    """A window with queries not yet finalised, and the offsets needed to rebuild it."""

    __slots__ = (
        "cursor",
        "min_fb_offset",
        "min_q_offset",
        "offset_base",
        "offsets",
        "query_ids",
        "retriever",
        "segment",
        "serial",
        "start",
    )

    def __init__(
        self, retriever: str, segment: str, start: int, serial: int, first_offset: int
    ) -> None:
        self.retriever = retriever
        self.segment = segment
        self.start = start
        self.serial = serial
        """Numbers the windows of a partition (a pending query names its window by it)."""
        self.query_ids: list[QueryId] = []
        self.offset_base = first_offset
        self.offsets = array("I")
        """The query offsets minus ``offset_base``, aligned with query_ids (64-bit once
        one does not fit in 32)."""
        self.cursor = 0  # query_ids before it were evicted
        self.min_q_offset = first_offset
        self.min_fb_offset = 1 << 62


WindowKey = tuple[str, str, int]


class Held:
    """What all the partitions of a process hold, kept as it changes (the caps are checked
    on every record, and a sum over 64 partitions there would cost more than the record)."""

    __slots__ = ("feedback", "queries")

    def __init__(self) -> None:
        self.queries = 0
        """Pending queries."""
        self.feedback = 0
        """Feedback events waiting for their query."""


@dataclass(slots=True, kw_only=True)
class Intake:
    """What every partition of one process shares as it takes records: the clock, the
    counters, the totals held, the label caps, the recorder, the limits, and the
    process-wide eviction (which picks the fullest partition). Made by the ``Pipeline``."""

    now_ms: Callable[[], int]
    counts: Counts
    held: Held
    retriever_cap: LabelCap
    segment_cap: LabelCap
    recorder: LabelRecorder | None
    """Keeps what the labels output needs (None: that output is off)."""
    max_future_skew_ms: int
    max_pending_queries: int
    max_pending_feedback: int
    grade: Callable[[FeedbackEvent], int]
    """The label policy's grade of a feedback event."""
    evict_queries: Callable[[], None]
    """Evict over all partitions while the pending queries are over their cap."""
    evict_feedback: Callable[[], None]
    """Evict over all partitions while the waiting feedback is over its cap."""


class Orphan(NamedTuple):
    """Feedback waiting for its query (it may arrive first: another topic, another lag)."""

    ts_ms: int
    chunk: int
    """The chunk id's hash."""
    grade: int
    source: int
    """The bit of its source when its grade is relevant, else 0 (``Prepared.sources``)."""
    offset: int
    unclassified: bool
    """Not yet counted as matched or unmatched (listed as ``waiting`` in commits)."""
