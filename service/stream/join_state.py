"""The state the event-time join keeps per partition: its settings, its open windows,
the waiting feedback, and the process-wide totals (see :mod:`service.stream.join`)."""

from __future__ import annotations

import struct
from array import array
from dataclasses import dataclass
from typing import NamedTuple

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


QueryId = bytes
"""A query id as UTF-8 bytes."""

HEAD = struct.Struct("=q")
"""A pending query's first word: window serial * window_ms + ms since the window's start."""
HEADER = struct.Struct("=qi")
"""The first word, then ``context_k`` (-1: none logged; WIDE: kept aside), 12 bytes."""
WIDE = -2
"""``context_k`` beyond 32 bits: the value is in ``PartitionStream.wide_context_k``."""


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


class Orphan(NamedTuple):
    """Feedback waiting for its query (it may arrive first: another topic, another lag)."""

    ts_ms: int
    chunk: int
    """The chunk id's hash."""
    grade: int
    offset: int
    unclassified: bool
    """Not yet counted as matched or unmatched (listed as ``waiting`` in commits)."""
