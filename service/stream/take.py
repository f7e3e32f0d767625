"""The per-record loop of :meth:`Pipeline.take <service.stream.pipeline.Pipeline.take>`:
a batch of one partition's valid events through the timestamp guard, the label caps and
the event-time join (see :mod:`service.stream.join` for what the join keeps and why).

It runs for every record, so the usual path of a query (accepted into an open window)
and of a feedback event (joined to its pending query) is written out here with the
settings and the state in local variables, and no call; what does not depend on the join
(ids as bytes, hashes, grades: :mod:`service.stream.prepared`) is made for the whole
batch first, or by the caller (``replay``'s reader process makes it while this process
joins); the rest (a refusal, a new window, a re-read of a published window, feedback
that waits for its query, the label caps past their first values, the recorder, the
evictions) is a call. The watermark does not move within a batch (only
:meth:`Pipeline.advance` moves it), and the largest event times seen are written back
once, at the end.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from service.errors import EventError
from service.stream.counters import Counts, LabelCap
from service.stream.guard import timestamp_refusal
from service.stream.join import PartitionStream
from service.stream.join_state import HEAD, HEADER, WIDE, Held, OpenWindow
from service.stream.labels import LabelPolicy
from service.stream.mined import LabelRecorder
from service.stream.prepared import Prepared, Record, prepare
from service.stream.topics import FEEDBACK, QUERIES, TOPICS


class _Limits(Protocol):
    """The settings the loop reads (``PipelineConfig``'s)."""

    @property
    def max_future_skew_ms(self) -> int: ...
    @property
    def max_pending_queries(self) -> int: ...
    @property
    def max_pending_feedback(self) -> int: ...
    @property
    def labels(self) -> LabelPolicy: ...


class Taker(Protocol):
    """What the loop needs of the pipeline that owns the partition (``Pipeline``)."""

    now_ms: Callable[[], int]
    counts: Counts
    held: Held
    recorder: LabelRecorder | None
    retriever_cap: LabelCap
    segment_cap: LabelCap

    @property
    def config(self) -> _Limits: ...
    def evict_queries(self) -> None: ...
    def evict_feedback(self) -> None: ...


def take_batch(  # noqa: PLR0912, PLR0915 - written out: it runs per record
    pipeline: Taker,
    stream: PartitionStream,
    batch: Sequence[Record],
    prepared: Prepared | None = None,
) -> list[tuple[int, EventError]]:
    """Take valid events of one partition in order; return ``(position in batch, error)``
    for those the timestamp guard rejects (counted unless re-read). ``prepared``: the
    batch's :func:`prepare` columns when the caller has them, else they are made here
    (the events are then whole events; with them, events need only the fields the join
    reads)."""
    now_ms = pipeline.now_ms()
    config, counts, held, recorder = (
        pipeline.config,
        pipeline.counts,
        pipeline.held,
        pipeline.recorder,
    )
    skew = config.max_future_skew_ms
    max_queries, max_feedback = config.max_pending_queries, config.max_pending_feedback
    retriever_cap, segment_cap = pipeline.retriever_cap, pipeline.segment_cap
    retrievers, segments = retriever_cap.values, segment_cap.values
    late, duplicates, queries_counted = counts.late, counts.duplicates, counts.queries
    unmatched, first_seen = counts.unmatched, counts.first_seen_ms
    join = stream.config
    window_ms, attribution_ms, clock_skew_ms = (
        join.window_ms,
        join.attribution_ms,
        join.clock_skew_ms,
    )
    pending, labels_of, orphans = stream.pending, stream.labels, stream.orphans
    windows, by_serial = stream.windows, stream.by_serial
    published_through_ms = stream.published_through_ms
    watermark = stream.watermark
    wm = watermark.value  # (fixed within a batch)
    latest_query, latest_feedback = watermark.latest
    head_of, pack = HEAD.unpack_from, HEADER.pack
    counted_from = stream.counted_from
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
        prepared = prepare([r[2] for r in batch], config.labels.grade)
    bodies, repeats, keys, chunks, levels = prepared
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
                stream.published_query(query_id, start, count)
                continue
            if ts_ms > latest_query:  # noqa: PLR1730 - as above
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
                window = stream.open_window((retriever, segment, start), offset)
            window.query_ids.append(query_id)
            try:
                window.offsets.append(offset - window.offset_base)
            except OverflowError:  # 32 bits no longer hold it
                stream.widen_offsets(window, offset)
            context_k = event.context_k  # type: ignore[union-attr]
            if context_k is None:
                context_k = -1
            elif context_k > 0x7FFFFFFF:
                stream.wide_context_k[query_id] = context_k
                context_k = WIDE
            head = window.serial * window_ms + ts_ms - start
            pending[query_id] = pack(head, context_k) + bodies[query]
            held.queries += 1
            if count:  # (per window here, per label pair below: a Counter costs 4 times this)
                added[window] = added.get(window, 0) + 1
            if query_id in orphans:
                stream.claim_waiting(query_id, window, ts_ms)
            if recorder is not None:
                text = getattr(event, "query_text", None)
                recorder.query(query_id, ts_ms, event.chunk_ids(), text)  # type: ignore[union-attr]
            first = first_seen.get(retriever)
            if first is None or ts_ms < first:
                first_seen[retriever] = ts_ms
            if held.queries > max_queries:  # all partitions
                pipeline.evict_queries()
        else:
            query_id, chunk, level = keys[index], chunks[index], levels[index]
            if ts_ms > latest_feedback:  # noqa: PLR1730 - as above
                latest_feedback = ts_ms
            packed = pending.get(query_id)
            if packed is None:
                stream.unjoined_feedback(offset, count, query_id, ts_ms, chunk, level)
            else:
                serial, since = divmod(head_of(packed)[0], window_ms)
                window = by_serial[serial]
                query_ts = window.start + since
                if wm > query_ts + attribution_ms:
                    if count:
                        late[FEEDBACK] += 1
                elif query_ts - clock_skew_ms <= ts_ms <= query_ts + attribution_ms:
                    labels = labels_of.get(query_id)
                    if labels is None:
                        labels = labels_of[query_id] = {}
                    if level > labels.get(chunk, -1):
                        labels[chunk] = level
                    if offset < window.min_fb_offset:  # noqa: PLR1730 - as above
                        window.min_fb_offset = offset
                elif count:
                    unmatched["outside_window"] += 1
            if recorder is not None:
                recorder.feedback(query_id, ts_ms, chunk, event.chunk_id)  # type: ignore[union-attr]
            if held.feedback > max_feedback:
                pipeline.evict_feedback()
    watermark.latest[QUERIES], watermark.latest[FEEDBACK] = latest_query, latest_feedback
    for window, n in added.items():
        queries_counted[window.retriever, window.segment] += n
    for topic, offsets in zip(TOPICS, offsets_of, strict=True):
        if offsets:
            stream.read_through(topic, max(offsets), now_ms)
            start_at = counted_from[topic]
            counted = len(offsets) if fresh else sum(offset >= start_at for offset in offsets)
            if counted:
                counts.events[topic] += counted
    return failures
