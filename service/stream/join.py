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
once feedback came, are in ``labels``, and the sources of its relevant labels (a small
bit mask, :data:`~service.stream.labels.SOURCE_BITS`), once one came, in ``source_masks``;
its offset in its window. Offsets are tracked so that the caller can commit the lowest
offset still needed (see ``commit_offsets``).

Everything that acts on this state is here: :meth:`PartitionStream.take`, the per-record
loop, has the usual path of a query (accepted into an open window) and of a feedback
event (joined to its pending query) written out with the settings and the state in local
variables; what does not depend on the join (ids as bytes, hashes, grades:
:mod:`service.stream.prepared`) is made for the whole batch first, or by the caller
(``replay``'s reader process makes it while the main process joins); the rest (a
refusal, a new window, a re-read of a published window, feedback that waits for its
query, the label caps past their first values, the recorder, the evictions) is a call.
The labelling rule (:meth:`PartitionStream._attach`) is one method, whichever came first.
The watermark does not move within a batch (only :meth:`PartitionStream.advance` moves
it), and the largest event times seen are written back once, at the end of a batch.
"""

from __future__ import annotations

import struct
from array import array
from collections import OrderedDict, deque
from collections.abc import Sequence

from service.errors import EventError
from service.stream.audit_join import AuditJoin
from service.stream.guard import timestamp_refusal
from service.stream.join_state import (
    Intake,
    JoinConfig,
    OpenWindow,
    Orphan,
    QueryId,
    WindowKey,
)
from service.stream.prepared import Prepared, Record, prepare
from service.stream.topics import FEEDBACK, QUERIES, TOPICS, Topic
from service.stream.watermark import NEVER, PartitionWatermark

HEAD = struct.Struct("=q")
"""A pending query's first word: window serial * window_ms + ms since the window's start."""
HEADER = struct.Struct("=qi")
"""The first word, then ``context_k`` (-1: none logged; WIDE: kept aside), 12 bytes."""
WIDE = -2
"""``context_k`` beyond 32 bits: the value is in ``PartitionStream.wide_context_k``."""
RANKING_START = HEADER.size
"""Where the chunk hashes of a ranking that :meth:`PartitionStream.close` returns begin."""

Rows = tuple[list[bytes], list[dict[int, int] | None], list[int], list[bytes], list[int]]
"""A window's queries as :meth:`PartitionStream.close` returns them."""


def packed_query(head: int, context_k: int, body: bytes) -> bytes:
    """A pending query as the join keeps it: ``HEADER`` (its first word, ``context_k``),
    then ``body``, its hashes packed by :func:`~service.stream.hashes.hashed_queries`."""
    return HEADER.pack(head, context_k) + body


class PartitionStream:
    """Join state of one partition. Counting is skipped for offsets below ``counted_from``."""

    def __init__(
        self,
        partition: int,
        config: JoinConfig,
        intake: Intake,
        published_through_ms: int = NEVER,
        counted_from: tuple[int, int] = (0, 0),
        waiting_offsets: frozenset[int] = frozenset(),
        closed_through_ms: int = NEVER,
        early_through_ms: int = NEVER,
    ) -> None:
        self.partition = partition
        self.intake = intake
        """What the partitions of the process share (counters, totals, caps, limits)."""
        self.held = intake.held
        """The process-wide totals this partition adds to."""
        self.config = config
        self.counts = intake.counts
        self.watermark = PartitionWatermark(
            config.max_out_of_orderness_ms, config.idle_timeout_ms, intake.now_ms
        )
        self.published_through_ms = published_through_ms
        self.closed_through_ms = closed_through_ms
        """Every window of this partition ending at or before this has closed (progress)."""
        self.early_through_ms = early_through_ms
        """Every window of this partition ending at or before this had its early aggregate
        made (:meth:`early_closable`; a window re-read after a restart gets none again)."""
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
        self.source_masks: dict[QueryId, int] = {}
        """The pending queries with a relevant label: the bits of the sources that gave one
        (``SOURCE_BITS``; only feedback that the labelling rule applied counts)."""
        self._early_age_ms = config.early_age_ms
        """``JoinConfig.early_age_ms``, read once (the labelling rule asks per feedback)."""
        self.early_labels: dict[QueryId, dict[int, int]] = {}
        """Like ``labels``, of the feedback that came within the early label age of its
        query (``JoinConfig.early_age_ms``), until the early aggregate takes them."""
        self.early_masks: dict[QueryId, int] = {}
        """Like ``source_masks``, of that feedback."""
        self.wide_context_k: dict[QueryId, int] = {}
        """``context_k`` of the pending queries whose value does not fit in 32 bits."""
        self.windows: dict[WindowKey, OpenWindow] = {}
        self.by_serial: dict[int, OpenWindow] = {}
        self._next_serial = 0
        self.orphans: OrderedDict[QueryId, list[Orphan]] = OrderedDict()
        self.n_orphans = 0
        self._recent: dict[QueryId, None] = {}
        self._recent_queue: deque[tuple[int, list[QueryId]]] = deque()
        self.audits: AuditJoin | None = None
        """The audit join of this partition (None: auditing is off)."""

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

    def is_new(self, topic: Topic, offset: int) -> bool:
        """False for a record that an earlier owner of the partition already handled."""
        return offset >= self.dead_letter_from[topic]

    def count_from(self, counted: Sequence[int]) -> None:
        """This process counted the records below ``counted`` (per topic) in an earlier
        life of the partition: re-reading them counts nothing again."""
        self.counted_from = [max(a, b) for a, b in zip(counted, self.counted_from, strict=True)]

    # -- the join ------------------------------------------------------------------------

    def take(  # noqa: PLR0915 - written out: it runs per record
        self, batch: Sequence[Record], prepared: Prepared | None = None
    ) -> list[tuple[int, EventError]]:
        """Take valid events of this partition in order; return ``(position in batch, error)``
        for those the timestamp guard rejects (counted unless re-read). ``prepared``: the
        batch's :func:`~service.stream.prepared.prepare` columns when the caller has them,
        else they are made here (the events are then whole events; with them, events need
        only the fields the join reads)."""
        intake = self.intake
        now_ms = intake.now_ms()
        counts, held, recorder = intake.counts, intake.held, intake.recorder
        skew = intake.max_future_skew_ms
        max_queries, max_feedback = intake.max_pending_queries, intake.max_pending_feedback
        retriever_cap, segment_cap = intake.retriever_cap, intake.segment_cap
        retrievers, segments = retriever_cap.values, segment_cap.values
        late, duplicates, queries_counted = counts.late, counts.duplicates, counts.queries
        unmatched, first_seen = counts.unmatched, counts.first_seen_ms
        join = self.config
        window_ms, attribution_ms = join.window_ms, join.attribution_ms
        pending, orphans = self.pending, self.orphans
        windows, by_serial = self.windows, self.by_serial
        published_through_ms = self.published_through_ms
        attach = self._attach
        audits = self.audits
        watermark = self.watermark
        wm = watermark.value  # (fixed within a batch)
        latest_query, latest_feedback = watermark.latest
        head_of, pack = HEAD.unpack_from, HEADER.pack
        counted_from = self.counted_from
        failures: list[tuple[int, EventError]] = []
        # each topic's offsets: the events counted, the offsets read through and whether every
        # record is new (so that the loop need not ask; a re-read is counted only past
        # ``counted_from``)
        offsets_of = (
            [r[1] for r in batch if r[0] == QUERIES],
            [r[1] for r in batch if r[0] != QUERIES],
        )
        fresh = all(
            not offsets or min(offsets) >= counted_from[topic]
            for topic, offsets in zip(TOPICS, offsets_of, strict=True)
        )
        limit_ms = now_ms + skew  # (the timestamp guard's latest time)
        # the columns of every event at once (the refused ones' too: they are rare)
        if prepared is None:
            prepared = prepare([r[2] for r in batch], intake.grade)
        bodies, repeats, keys, chunks, levels, sources = prepared
        query = -1  # position among the batch's queries
        added: dict[OpenWindow, int] = {}  # queries counted, per window
        for index, (topic, offset, event) in enumerate(batch):
            count = fresh or offset >= counted_from[topic]  # (not counted again when re-read)
            ts_ms = event.timestamp_ms
            if ts_ms < 0 or ts_ms > limit_ms:
                error = timestamp_refusal(ts_ms, now_ms, skew)
                if error is not None:
                    if count:
                        counts.invalid[topic, error.reason] += 1
                    failures.append((index, error))
                    query += topic == QUERIES
                    continue
            if topic == QUERIES:
                query += 1
                if count and repeats and query in repeats:
                    counts.duplicate_results += 1
                retriever = event.retriever  # type: ignore[union-attr]
                if retriever not in retrievers:
                    retriever = retriever_cap(retriever)
                segment = event.segment  # type: ignore[union-attr]
                if segment not in segments:
                    segment = segment_cap(segment)
                query_id = keys[index]
                start = ts_ms - ts_ms % window_ms
                if start + window_ms <= published_through_ms:
                    self._query_of_published_window(query_id, start, count)
                    continue
                if ts_ms > latest_query:  # noqa: PLR1730 - no call: it runs per record
                    latest_query = ts_ms
                if wm > ts_ms + attribution_ms:
                    if count:
                        late[QUERIES] += 1
                    continue
                if query_id in pending:
                    if count:
                        duplicates[QUERIES] += 1
                    continue
                window = windows.get((retriever, segment, start))
                if window is None:
                    window = self._open_window((retriever, segment, start), offset)
                window.query_ids.append(query_id)
                try:
                    window.offsets.append(offset - window.offset_base)
                except OverflowError:  # 32 bits no longer hold it
                    self._widen_offsets(window, offset)
                context_k = event.context_k  # type: ignore[union-attr]
                if context_k is None:
                    context_k = -1
                elif context_k > 0x7FFFFFFF:
                    self.wide_context_k[query_id] = context_k
                    context_k = WIDE
                head = window.serial * window_ms + ts_ms - start
                pending[query_id] = pack(head, context_k) + bodies[query]
                held.queries += 1
                if count:  # (per window here, per label pair below: a Counter costs 4 times this)
                    added[window] = added.get(window, 0) + 1
                if query_id in orphans:
                    self._claim_waiting(query_id, window, ts_ms)
                if audits is not None and audits.in_sample(query_id):
                    audits.query(query_id, event.chunk_ids())  # type: ignore[union-attr]
                if recorder is not None:
                    text = getattr(event, "query_text", None)
                    recorder.query(query_id, ts_ms, event.chunk_ids(), text)  # type: ignore[union-attr]
                first = first_seen.get(retriever)
                if first is None or ts_ms < first:
                    first_seen[retriever] = ts_ms
                if held.queries > max_queries:  # all partitions
                    intake.evict_queries()
            else:
                query_id, chunk, level = keys[index], chunks[index], levels[index]
                source = sources[index]
                if ts_ms > latest_feedback:  # noqa: PLR1730 - no call: it runs per record
                    latest_feedback = ts_ms
                packed = pending.get(query_id)
                if packed is None:
                    self._feedback_without_query(
                        offset, count, query_id, ts_ms, chunk, level, source
                    )
                else:
                    serial, since = divmod(head_of(packed)[0], window_ms)
                    window = by_serial[serial]
                    query_ts = window.start + since
                    if wm > query_ts + attribution_ms:
                        if count:
                            late[FEEDBACK] += 1
                    elif count:
                        if not attach(
                            query_id, window, query_ts, ts_ms, chunk, level, source, offset
                        ):
                            unmatched["outside_window"] += 1
                    else:
                        attach(query_id, window, query_ts, ts_ms, chunk, level, source, offset)
                    if audits is not None and query_id in audits.sampled:
                        audits.feedback(query_id, chunk, event.chunk_id)  # type: ignore[union-attr]
                if recorder is not None:
                    recorder.feedback(query_id, ts_ms, chunk, event.chunk_id)  # type: ignore[union-attr]
                if held.feedback > max_feedback:
                    intake.evict_feedback()
        watermark.latest[QUERIES], watermark.latest[FEEDBACK] = latest_query, latest_feedback
        for window, n in added.items():
            queries_counted[window.retriever, window.segment] += n
        for topic, offsets in zip(TOPICS, offsets_of, strict=True):
            if offsets:
                self.read_through(topic, max(offsets), now_ms)
                start_at = counted_from[topic]
                counted = len(offsets) if fresh else sum(offset >= start_at for offset in offsets)
                if counted:
                    counts.events[topic] += counted
        return failures

    # What the loop does only now and then:

    def _query_of_published_window(self, query_id: QueryId, start: int, count: bool) -> None:
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

    def _open_window(self, key: WindowKey, offset: int) -> OpenWindow:
        """A new open window, its first query at ``offset``."""
        serial = self._next_serial
        self._next_serial += 1
        window = OpenWindow(*key, serial, offset)
        self.windows[key] = self.by_serial[serial] = window
        return window

    @staticmethod
    def _widen_offsets(window: OpenWindow, offset: int) -> None:
        """Note a query offset that 32 bits no longer hold: the window's offsets widen."""
        window.offsets = array("q", window.offsets)
        window.offsets.append(offset - window.offset_base)

    def _claim_waiting(self, query_id: QueryId, window: OpenWindow, ts_ms: int) -> None:
        """A query arrived: the feedback that waited for it is joined now."""
        waiting = self.orphans.pop(query_id)
        self.n_orphans -= len(waiting)
        self.held.feedback -= len(waiting)
        for fb_ts, chunk, grade, source, fb_offset, unclassified in waiting:
            applied = self._attach(query_id, window, ts_ms, fb_ts, chunk, grade, source, fb_offset)
            if not applied and unclassified:
                self.counts.unmatched["outside_window"] += 1

    def _feedback_without_query(
        self,
        offset: int,
        count: bool,
        query_id: QueryId,
        ts_ms: int,
        chunk: int,
        grade: int,
        source: int,
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
            self.orphans[query_id] = [Orphan(ts_ms, chunk, grade, source, offset, unclassified)]
        else:
            waiting.append(Orphan(ts_ms, chunk, grade, source, offset, unclassified))
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
        source: int,
        offset: int,
    ) -> bool:
        """The labelling rule, for feedback that found its query pending and feedback that
        waited for it alike: feedback within ``[query_ts - clock_skew, query_ts +
        attribution]`` raises its chunk's grade to its own (a grade is a maximum, so
        duplicates are harmless), adds its ``source`` bit (0 unless its grade is relevant)
        to the query's sources, and lowers the window's lowest feedback offset (needed to
        rebuild it); return whether it was within those bounds."""
        cfg = self.config
        if not query_ts - cfg.clock_skew_ms <= ts_ms <= query_ts + cfg.attribution_ms:
            return False
        labels = self.labels.get(query_id)
        if labels is None:
            labels = self.labels[query_id] = {}
        if grade > labels.get(chunk, -1):
            labels[chunk] = grade
        if source:
            sources = self.source_masks
            sources[query_id] = sources.get(query_id, 0) | source
        if offset < window.min_fb_offset:  # noqa: PLR1730 - it runs per record
            window.min_fb_offset = offset
        early = self._early_age_ms
        if early is not None and ts_ms <= query_ts + early:
            self._attach_early(query_id, chunk, grade, source)
        return True

    def _attach_early(self, query_id: QueryId, chunk: int, grade: int, source: int) -> None:
        """The labelling rule's effect on the early labels (feedback within their age)."""
        labels = self.early_labels.get(query_id)
        if labels is None:
            labels = self.early_labels[query_id] = {}
        if grade > labels.get(chunk, -1):
            labels[chunk] = grade
        if source:
            self.early_masks[query_id] = self.early_masks.get(query_id, 0) | source

    def _holds(self, packed: bytes | None, window: OpenWindow) -> bool:
        """Whether a pending query (``packed``, or None) belongs to ``window``."""
        return (
            packed is not None
            and HEAD.unpack_from(packed)[0] // self.config.window_ms == window.serial
        )

    # -- time ----------------------------------------------------------------------------

    def advance(self) -> list[WindowKey]:
        """Move the watermark, forget what no query can claim any more, and return the
        windows that can close now (:meth:`closable`)."""
        self.watermark.update()
        self.expire()
        return self.closable()

    def end_of_input(self, horizon_ms: int) -> None:
        """No more records will come (replay): the watermark moves ``horizon_ms`` past the
        last event time, so that the next advance finalises everything pending."""
        self.watermark.finish(horizon_ms)

    @property
    def watermark_ms(self) -> int:
        """The partition's watermark (``NEVER`` before any event time)."""
        return self.watermark.value

    def latest_event_ms(self, topic: Topic) -> int:
        """The largest event time seen on ``topic`` (``NEVER`` before the first)."""
        return self.watermark.max_ts(topic)

    def set_backlog(self, topic: Topic, behind: bool) -> None:
        """Whether ``topic``'s partition still has unread records (then it is never idle)."""
        self.watermark.set_backlog(topic, behind)

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

    def close(self, key: WindowKey) -> Rows:
        """Remove a closable window; return its (non-evicted) queries in arrival order:
        packed rankings (``HEADER``, then the hashes), grades (None: no feedback),
        context_k (-1: none logged), ids, and the sources of their relevant labels (bit
        masks of ``SOURCE_BITS``, 0: none)."""
        window = self.windows.pop(key)
        del self.by_serial[window.serial]
        rows = self._rows(window, self.labels, self.source_masks, final=True)
        self.held.queries -= len(rows[0])
        end = key[2] + self.config.window_ms
        self._recent_queue.append(
            (end + 2 * self.config.attribution_ms, window.query_ids[window.cursor :])
        )
        return rows

    def early_closable(self) -> list[WindowKey]:
        """The open windows due for their early aggregate (the watermark passed their end
        plus the early label age, and they had none yet), oldest first; from now on every
        window ending at or before that limit counts as having had it."""
        age, wm = self._early_age_ms, self.watermark.value
        if age is None or wm == NEVER:
            return []
        window_ms = self.config.window_ms
        limit = wm - age
        through = limit - limit % window_ms
        done = self.early_through_ms
        if through <= done:
            return []
        self.early_through_ms = through
        return sorted(k for k in self.windows if done < k[2] + window_ms <= through)

    def early_rows(self, key: WindowKey) -> Rows:
        """:meth:`close`'s rows of an open window with only the labels that came within
        the early label age; the window stays open (its early labels are let go)."""
        return self._rows(self.windows[key], self.early_labels, self.early_masks, final=False)

    def _rows(
        self,
        window: OpenWindow,
        labels: dict[QueryId, dict[int, int]],
        sources: dict[QueryId, int],
        *,
        final: bool,
    ) -> Rows:
        """A window's pending queries with ``labels`` and ``sources`` (taken from them);
        ``final``: the queries leave the join (and their early labels with them)."""
        rankings: list[bytes] = []
        grades: list[dict[int, int] | None] = []
        context_ks: list[int] = []
        held: list[QueryId] = []
        masks: list[int] = []
        pending, recent = self.pending, self._recent
        early_labels, early_masks = self.early_labels, self.early_masks
        window_ms, serial = self.config.window_ms, window.serial
        for query_id in window.query_ids[window.cursor :]:
            packed = pending.get(query_id)
            if packed is None:
                continue
            head, context_k = HEADER.unpack_from(packed)
            if head // window_ms != serial:  # (the id is pending again, in a later window)
                continue
            rankings.append(packed)
            grades.append(labels.pop(query_id, None))
            masks.append(sources.pop(query_id, 0))
            if context_k == WIDE:
                context_k = self.wide_context_k[query_id]
            context_ks.append(context_k)
            held.append(query_id)
            if final:
                del pending[query_id]
                self.wide_context_k.pop(query_id, None)
                early_labels.pop(query_id, None)
                early_masks.pop(query_id, None)
                recent[query_id] = None
        return rankings, grades, context_ks, held, masks

    def mark_sent(self, end_ms: int) -> None:
        """Windows of this partition ending at or before ``end_ms`` were sent (published)."""
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

    @property
    def pending_count(self) -> int:
        """Pending queries of this partition."""
        return len(self.pending)

    def release(self) -> None:
        """The partition is dropped: what it held no longer counts in the process's totals."""
        self.held.queries -= len(self.pending)
        self.held.feedback -= self.n_orphans

    def evict_oldest_query(self) -> bool:
        """Evict the oldest pending query (counted unless an earlier owner counted it);
        return False when there was none."""
        offset = self.evict_query()
        if offset < 0:
            return False
        if offset >= self.counted_from[QUERIES]:
            self.counts.evicted["query"] += 1
        return True

    def evict_oldest_feedback(self) -> bool:
        """Evict the oldest waiting feedback of one query (counted unless an earlier owner
        counted it); return False when none was waiting."""
        if not self.orphans:
            return False
        _, waiting = self.orphans.popitem(last=False)
        self.n_orphans -= len(waiting)
        self.held.feedback -= len(waiting)
        counted_from = self.counted_from[FEEDBACK]
        self.counts.evicted["feedback"] += sum(1 for o in waiting if o.offset >= counted_from)
        return True

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
                    self.source_masks.pop(query_id, None)
                    self.early_labels.pop(query_id, None)
                    self.early_masks.pop(query_id, None)
                    if self.audits is not None:
                        self.audits.forget(query_id)
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
        audited = None if self.audits is None else self.audits.min_offset()
        if audited is not None:
            fb_needed.append(audited)
        q = min([*q_needed, self.next_offset[QUERIES]]) if self.next_offset[QUERIES] >= 0 else -1
        nfb = self.next_offset[FEEDBACK]
        fb = min([*fb_needed, nfb]) if nfb >= 0 else -1
        return q, fb
