"""The event-time join of one partition: pending queries, waiting feedback, open windows.

Partition p of the queries topic and partition p of the feedback topic form one
stream with its own state and watermark, so its results do not depend on which
replica processes it. A query is pending until the watermark passes
``timestamp + attribution_window``; feedback in ``[ts - clock_skew, ts + attribution]``
raises the grade of its chunk (grades are a maximum, so duplicates are harmless).
Feedback that comes before its query waits. A window closes, and all its queries are
finalised together, once the watermark reaches ``window_end + attribution_window``.

Memory per pending query is kept small: a pending query is one ``bytes`` value in the
``pending`` dict, keyed by its id as UTF-8 bytes (16 bytes smaller than the ``str``).
Its first 64-bit word says which open window holds it and when it happened
(``window serial * window_ms + milliseconds since the window's start``), a 32-bit word
its ``context_k``, and the chunk ids follow as 64-bit hashes (the metrics only need
equality of ids within one query; a collision needs two ids of the same query to share
64 hash bits): 205 bytes with 20 results, in pymalloc's 208-byte class. Its grades,
once feedback came, are in ``labels``; its offset in its window. Offsets are tracked
so that the caller can commit the lowest offset still needed (see ``commit_offsets``).
"""

from __future__ import annotations

from array import array
from collections import OrderedDict, deque
from collections.abc import Callable

from service.stream.counters import Counts
from service.stream.join_state import (
    HEAD,
    HEADER,
    WIDE,
    Held,
    JoinConfig,
    OpenWindow,
    Orphan,
    QueryId,
    WindowKey,
)
from service.stream.topics import FEEDBACK, QUERIES, Topic
from service.stream.watermark import NEVER, PartitionWatermark


class PartitionStream:
    """Join state of one partition. Counting is skipped for offsets below ``counted_from``."""

    def __init__(
        self,
        partition: int,
        config: JoinConfig,
        counts: Counts,
        now_ms: Callable[[], int],
        published_through_ms: int = NEVER,
        counted_from: tuple[int, int] = (0, 0),
        waiting_offsets: frozenset[int] = frozenset(),
        closed_through_ms: int = NEVER,
        held: Held | None = None,
    ) -> None:
        self.partition = partition
        self.held = held if held is not None else Held()
        """The process-wide totals this partition adds to."""
        self.config = config
        self.counts = counts
        self.watermark = PartitionWatermark(
            config.max_out_of_orderness_ms, config.idle_timeout_ms, now_ms
        )
        self.published_through_ms = published_through_ms
        self.closed_through_ms = closed_through_ms
        """Every window of this partition ending at or before this has closed (progress)."""
        self.counted_from = list(counted_from)
        # records below this were dead-lettered by an earlier owner (a committed transaction)
        self.dead_letter_from = list(counted_from)
        # Feedback that was still waiting for its query at the last commit was counted as
        # an event but not yet classified (matched or unmatched): the commit lists it.
        self.waiting_offsets = waiting_offsets
        self.next_offset = [-1, -1]
        self.pending: dict[QueryId, bytes] = {}
        """Pending queries: (window serial, time) in the first word, then the hashes."""
        self.labels: dict[QueryId, dict[int, int]] = {}
        """Grades of the pending queries that have feedback: chunk hash -> grade."""
        self.wide_context_k: dict[QueryId, int] = {}
        """``context_k`` of the pending queries whose value does not fit in 32 bits."""
        self.windows: dict[WindowKey, OpenWindow] = {}
        self.by_serial: dict[int, OpenWindow] = {}
        self._next_serial = 0
        self.orphans: OrderedDict[QueryId, list[Orphan]] = OrderedDict()
        self.n_orphans = 0
        self._recent: dict[QueryId, None] = {}
        self._recent_queue: deque[tuple[int, list[QueryId]]] = deque()

    # -- records -------------------------------------------------------------------------

    def counted_through(self, topic: Topic) -> int:
        """The offset below which every record of ``topic`` has been counted (read or marked)."""
        return max(self.next_offset[topic], self.counted_from[topic])

    def seen(self, topic: Topic, offset: int, now_ms: int) -> bool:
        """Note a record's offset (valid or not); return whether it is to be counted."""
        self.read_through(topic, offset, now_ms)
        return offset >= self.counted_from[topic]

    def read_through(self, topic: Topic, offset: int, now_ms: int) -> None:
        """Records of ``topic`` were read up to ``offset`` at ``now_ms`` (for a batch: its
        highest offset; nothing reads these between a batch's records)."""
        if offset >= self.next_offset[topic]:
            self.next_offset[topic] = offset + 1
        self.watermark.last_seen[topic] = now_ms

    # The join of a batch's records is written out in ``take.take_batch`` (it runs per
    # record); what it does only now and then is here.

    def published_query(self, query_id: QueryId, start: int, count: bool) -> None:
        """A query of a window already published: late, or when re-read (not counted) a
        final query whose re-read feedback is then known for what it is."""
        cfg = self.config
        if count:  # re-read records of published windows are expected and silent
            self.counts.late[QUERIES] += 1
            return
        self._recent[query_id] = None
        self._recent_queue.append((start + cfg.window_ms + 2 * cfg.attribution_ms, [query_id]))
        waiting = self.orphans.pop(query_id, None)
        if waiting is not None:
            self.n_orphans -= len(waiting)
            self.held.feedback -= len(waiting)

    def open_window(self, key: WindowKey, offset: int) -> OpenWindow:
        """A new open window, its first query at ``offset``."""
        serial = self._next_serial
        self._next_serial += 1
        window = OpenWindow(*key, serial, offset)
        self.windows[key] = self.by_serial[serial] = window
        return window

    @staticmethod
    def widen_offsets(window: OpenWindow, offset: int) -> None:
        """Note a query offset that 32 bits no longer hold: the window's offsets widen."""
        window.offsets = array("q", window.offsets)
        window.offsets.append(offset - window.offset_base)

    def claim_waiting(self, query_id: QueryId, window: OpenWindow, ts_ms: int) -> None:
        """A query arrived: the feedback that waited for it is joined now."""
        waiting = self.orphans.pop(query_id)
        self.n_orphans -= len(waiting)
        self.held.feedback -= len(waiting)
        for fb_ts, chunk, grade, fb_offset, unclassified in waiting:
            applied = self._attach(query_id, window, ts_ms, fb_ts, chunk, grade, fb_offset)
            if not applied and unclassified:
                self.counts.unmatched["outside_window"] += 1

    def unjoined_feedback(
        self, offset: int, count: bool, query_id: QueryId, ts_ms: int, chunk: int, grade: int
    ) -> None:
        """Feedback whose query is not pending: late (its query was finalised), unmatched
        (no query it could belong to can still come), or waiting for its query."""
        cfg = self.config
        if query_id in self._recent:
            if count:
                self.counts.late[FEEDBACK] += 1
            return
        if self.watermark.value > ts_ms + cfg.clock_skew_ms + cfg.attribution_ms:
            if count:  # no query that it could belong to can still be pending
                self.counts.unmatched["no_query"] += 1
            return
        unclassified = count or offset in self.waiting_offsets
        waiting = self.orphans.get(query_id)
        if waiting is None:
            self.orphans[query_id] = [Orphan(ts_ms, chunk, grade, offset, unclassified)]
        else:
            waiting.append(Orphan(ts_ms, chunk, grade, offset, unclassified))
        self.n_orphans += 1
        self.held.feedback += 1

    def _attach(
        self,
        query_id: QueryId,
        window: OpenWindow,
        query_ts: int,
        ts_ms: int,
        chunk: int,
        grade: int,
        offset: int,
    ) -> bool:
        cfg = self.config
        if not query_ts - cfg.clock_skew_ms <= ts_ms <= query_ts + cfg.attribution_ms:
            return False
        labels = self.labels.get(query_id)
        if labels is None:
            labels = self.labels[query_id] = {}
        if grade > labels.get(chunk, -1):
            labels[chunk] = grade
        if offset < window.min_fb_offset:  # noqa: PLR1730 - no call: it runs per record
            window.min_fb_offset = offset
        return True

    def _holds(self, packed: bytes | None, window: OpenWindow) -> bool:
        """Whether a pending query (``packed``, or None) belongs to ``window``."""
        return (
            packed is not None
            and HEAD.unpack_from(packed)[0] // self.config.window_ms == window.serial
        )

    # -- time ----------------------------------------------------------------------------

    def closable(self) -> list[WindowKey]:
        """Windows whose every query the watermark has finalised, oldest first.

        Moves the progress marker: once they are closed, every window of this partition
        ending at or before the returned limit is (a later query of one is late).
        """
        wm = self.watermark.value
        if wm != NEVER:
            limit = wm - self.config.attribution_ms
            closed = limit - limit % self.config.window_ms
            self.closed_through_ms = max(self.closed_through_ms, closed)
        limit = wm - self.config.attribution_ms - self.config.window_ms
        return sorted(key for key in self.windows if key[2] <= limit)

    def close(
        self, key: WindowKey
    ) -> tuple[list[bytes], list[dict[int, int] | None], list[int], list[QueryId]]:
        """Remove a closable window; return its (non-evicted) queries in arrival order:
        packed rankings (``HEADER``, then the hashes), grades (None: no feedback),
        context_k (-1: none logged) and ids."""
        window = self.windows.pop(key)
        del self.by_serial[window.serial]
        rankings: list[bytes] = []
        grades: list[dict[int, int] | None] = []
        context_ks: list[int] = []
        held: list[QueryId] = []
        cursor = window.cursor
        ids = window.query_ids[cursor:]
        pending, labels, recent = self.pending, self.labels, self._recent
        window_ms, serial = self.config.window_ms, window.serial
        for query_id in ids:
            packed = pending.get(query_id)
            if packed is None:
                continue
            head, context_k = HEADER.unpack_from(packed)
            if head // window_ms != serial:  # (the id is pending again, in a later window)
                continue
            del pending[query_id]
            rankings.append(packed)
            grades.append(labels.pop(query_id, None))
            if context_k == WIDE:
                context_k = self.wide_context_k.pop(query_id)
            context_ks.append(context_k)
            held.append(query_id)
            recent[query_id] = None
        self.held.queries -= len(rankings)
        end = key[2] + self.config.window_ms
        self._recent_queue.append((end + 2 * self.config.attribution_ms, ids))
        return rankings, grades, context_ks, held

    def mark_published(self, end_ms: int) -> None:
        """Windows of this partition ending at or before ``end_ms`` are published."""
        self.published_through_ms = max(self.published_through_ms, end_ms)

    def expire(self) -> None:
        """Forget waiting feedback that no pending query can claim, and old finalised ids."""
        cfg = self.config
        wm = self.watermark.value
        limit = wm - cfg.clock_skew_ms - cfg.attribution_ms
        orphans = self.orphans
        while orphans:
            query_id, waiting = next(iter(orphans.items()))
            if max(o.ts_ms for o in waiting) >= limit:
                break
            orphans.popitem(last=False)
            self.n_orphans -= len(waiting)
            self.held.feedback -= len(waiting)
            counted = sum(1 for o in waiting if o.unclassified)
            self.counts.unmatched["no_query"] += counted
        queue = self._recent_queue
        while queue and queue[0][0] < wm:
            for query_id in queue.popleft()[1]:
                self._recent.pop(query_id, None)

    # -- caps ----------------------------------------------------------------------------

    def evict_query(self) -> int:
        """Drop the oldest pending query (from the oldest open window); return its offset,
        or -1 if there is none.

        The window forgets the evicted ids (so memory stays under the cap) and no longer
        needs their offsets: the commit moves past them, so a restart neither re-reads
        nor re-counts them. A window left without queries is dropped.
        """
        for key in sorted(self.windows, key=lambda k: k[2]):
            window = self.windows[key]
            ids = window.query_ids
            while window.cursor < len(ids):
                query_id = ids[window.cursor]
                offset = window.offset_base + window.offsets[window.cursor]
                window.cursor += 1
                if self._holds(self.pending.get(query_id), window):
                    del self.pending[query_id]
                    self.labels.pop(query_id, None)
                    self.wide_context_k.pop(query_id, None)
                    self.held.queries -= 1
                    self._forget_evicted(key, window)
                    return offset
            self._forget_evicted(key, window)
        return -1

    def _forget_evicted(self, key: WindowKey, window: OpenWindow) -> None:
        ids = window.query_ids
        if window.cursor >= len(ids):
            del self.windows[key]
            del self.by_serial[window.serial]
            return
        if window.cursor >= 64 and 2 * window.cursor >= len(ids):
            del ids[: window.cursor]
            del window.offsets[: window.cursor]
            window.cursor = 0
        window.min_q_offset = window.offset_base + window.offsets[window.cursor]

    def evict_feedback(self) -> list[Orphan]:
        """Drop the oldest waiting feedback of one query; return the events that went."""
        if not self.orphans:
            return []
        _, waiting = self.orphans.popitem(last=False)
        self.n_orphans -= len(waiting)
        self.held.feedback -= len(waiting)
        return waiting

    # -- commits -------------------------------------------------------------------------

    def oldest_orphan_offset(self) -> int:
        """Offset of the oldest feedback waiting for its query (the orphans must not be empty)."""
        return next(iter(self.orphans.values()))[0].offset

    def unclassified_offsets(self) -> list[int]:
        """Offsets of waiting feedback not yet counted as matched or unmatched, ascending."""
        return sorted(
            o.offset for waiting in self.orphans.values() for o in waiting if o.unclassified
        )

    def commit_offsets(self) -> tuple[int, int]:
        """Per topic, the lowest offset still needed to rebuild the unpublished state.

        -1 means nothing was read on that topic yet (nothing to commit).
        """
        q_needed = [w.min_q_offset for w in self.windows.values()]
        fb_needed = [w.min_fb_offset for w in self.windows.values()]
        if self.orphans:
            fb_needed.append(self.oldest_orphan_offset())
        q = min([*q_needed, self.next_offset[QUERIES]]) if self.next_offset[QUERIES] >= 0 else -1
        nfb = self.next_offset[FEEDBACK]
        fb = min([*fb_needed, nfb]) if nfb >= 0 else -1
        return q, fb
