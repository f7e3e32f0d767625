"""The event-time watermark of one partition (queries-p and feedback-p), with idleness.

The watermark is the smaller of the largest timestamps seen on the two topics, minus
``max_out_of_orderness``. A topic that has been silent for ``idle_timeout`` (wall
clock) and has no known backlog is left out of that minimum, so sparse feedback does
not stall it; when both are silent the watermark may advance to wall-clock now minus
``max_out_of_orderness`` so that quiet periods still close windows. It never moves
backwards.
"""

from __future__ import annotations

from collections.abc import Callable

from service.stream.topics import FEEDBACK, QUERIES, Topic

NEVER = -(1 << 62)
"""A watermark before any event time."""


class PartitionWatermark:
    """Watermark of one partition; ``idle_timeout_ms=None`` disables idleness (replay)."""

    __slots__ = ("_backlog", "_idle_ms", "_now", "_ooo_ms", "last_seen", "latest", "value")

    def __init__(
        self, max_out_of_orderness_ms: int, idle_timeout_ms: int | None, now_ms: Callable[[], int]
    ) -> None:
        self._ooo_ms = max_out_of_orderness_ms
        self._idle_ms = idle_timeout_ms
        self._now = now_ms
        start = now_ms()
        # both kept by the join, per record (a method call each would cost as much again)
        self.latest = [NEVER, NEVER]
        """Per topic (QUERIES, FEEDBACK), the largest event time seen."""
        self.last_seen = [start, start]
        """Per topic, the wall time at which its last record (valid or not) arrived."""
        self._backlog = [False, False]
        self.value = NEVER

    def set_backlog(self, topic: Topic, behind: bool) -> None:
        """Whether the topic partition still has unread records (then it is never idle)."""
        self._backlog[topic] = behind

    def max_ts(self, topic: Topic) -> int:
        """Largest event time seen on the topic (NEVER before the first)."""
        return self.latest[topic]

    def update(self) -> int:
        """Recompute the watermark from what was seen and the wall clock; return it."""
        if self._idle_ms is None:
            candidate = min(self.latest)
        else:
            now = self._now()
            active = [
                self.latest[t]
                for t in (QUERIES, FEEDBACK)
                if self._backlog[t] or now - self.last_seen[t] < self._idle_ms
            ]
            candidate = min(active) if active else now
        if candidate == NEVER:
            return self.value
        candidate -= self._ooo_ms
        self.value = max(self.value, candidate)
        return self.value

    def finish(self, horizon_ms: int) -> int:
        """End of input (replay): move ``horizon_ms`` past the last event so all is final."""
        last = max(self.latest)
        if last != NEVER:
            self.value = max(self.value, last + horizon_ms)
        return self.value
