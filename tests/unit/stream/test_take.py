"""``Pipeline.take``: a batch of records gives exactly what the same records give one call
each (the clock read once, counts added once, settings held in locals change nothing)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from service.stream import hashes
from service.stream.events import QueryEvent
from service.stream.pipeline import Pipeline, PipelineConfig, Record
from service.stream.topics import FEEDBACK, QUERIES
from tests.unit.stream.test_join import (
    ATTR,
    JOIN,
    KS,
    NOW,
    SEC,
    SKEW,
    T0,
    feedback_event,
    query_event,
)

CHUNKS = ("a", "b", "c", "d")

step = st.tuples(
    st.sampled_from(["query", "feedback", "future", "duplicate_results", "late", "late_query"]),
    st.integers(0, 5),  # query number (among the queries of 10 steps)
    st.integers(-90, 90),  # event time, seconds around the step's (20 s a step)
    st.sampled_from(CHUNKS),
    st.sampled_from(["r1", "r2", "r3"]),  # retriever (the cap keeps two)
)


def _records(steps: list[tuple[str, int, int, str, str]]) -> list[Record]:
    offsets = [0, 0]
    out: list[Record] = []
    for i, (kind, n, jitter, chunk, retriever) in enumerate(steps):
        ts = T0 + (20 * i + jitter) * SEC
        query_id = f"q{i // 10}-{n}"
        topic = FEEDBACK if kind in ("feedback", "late") else QUERIES
        event: Any
        if kind == "query":
            event = query_event(query_id, ts, results=CHUNKS, retriever=retriever)
        elif kind == "duplicate_results":
            event = query_event(query_id, ts, results=("a", "b", "a"), context_k=2)
        elif kind == "future":  # refused by the timestamp guard
            event = query_event(query_id, NOW + 3_600_000)
        elif kind == "late_query":  # late once a batch has moved the watermark
            event = query_event(f"{query_id}-late", ts - 3 * ATTR)
        elif kind == "late":
            event = feedback_event(f"q{n}", ts - 3 * ATTR, chunk, signal="citation")
        else:
            event = feedback_event(query_id, ts, chunk)
        out.append((topic, offsets[topic], event))
        offsets[topic] += 1
    return out


def _pipeline() -> Pipeline:
    config = PipelineConfig(
        join=JOIN, ks=KS, max_pending_queries=15, max_pending_feedback=7, max_label_values=2
    )
    p = Pipeline(config, now_ms=lambda: NOW)
    p.assign(0, counted_from=(4, 3))  # the first records are re-read: not counted again
    return p


def _state(p: Pipeline) -> Any:
    stream = p.streams[0]
    return (
        p.counts,
        dict(stream.pending),
        dict(stream.labels),
        list(stream.orphans.items()),
        stream.next_offset,
        stream.watermark.last_seen,
        stream.watermark.latest,
        p.pending_queries,
        p.pending_feedback,
    )


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(step, min_size=30, max_size=90),
    cuts=st.lists(st.integers(1, 25), min_size=1, max_size=12),
    small_batch=st.sampled_from([2, hashes.SMALL_BATCH]),
)
def test_a_batch_gives_what_the_same_records_give_one_call_each(
    steps: list[tuple[str, int, int, str, str]], cuts: list[int], small_batch: int
) -> None:
    """With caps small enough that records evict others mid-batch, re-read records, label
    caps, refused timestamps and records that advance the watermark in between. With
    ``small_batch`` 2, batches of two queries or more hash them together in numpy (and the
    queries of refused records must not shift the others' hashes)."""
    default = hashes.SMALL_BATCH
    hashes.SMALL_BATCH = small_batch
    try:
        _compare(_records(steps), cuts)
    finally:
        hashes.SMALL_BATCH = default


def _compare(records: list[Record], cuts: list[int]) -> None:
    one, batched = _pipeline(), _pipeline()
    at = 0
    for size in [*cuts, len(records)]:  # (the last batch takes what is left)
        batch = records[at : at + size]
        refused_one: list[tuple[int, str]] = []
        for i, (_, offset, event) in enumerate(batch):
            if isinstance(event, QueryEvent):
                error = one.query(0, offset, event)
            else:
                error = one.feedback(0, offset, event)
            if error is not None:
                refused_one.append((i, error.reason))
        refused = [(i, e.reason) for i, e in batched.take(0, batch)]
        assert refused == refused_one
        assert _state(batched) == _state(one)
        # the watermark moves between batches: later records can be late
        closed = batched.advance()
        assert closed == one.advance()
        batched.deliver(closed)
        one.deliver(closed)
        at += len(batch)
    assert _state(batched) == _state(one)
    assert batched.finish() == one.finish()


def test_a_batch_counts_its_events_once_and_only_those_not_counted_before() -> None:
    p = _pipeline()
    queries = [(QUERIES, k, query_event(f"q{k}", T0 + k * SEC)) for k in range(10)]
    # a chunk listed twice: in a re-read record (counted before) and in a new one
    queries[2] = (QUERIES, 2, query_event("repeats", T0, results=("a", "b", "a")))
    queries[7] = (QUERIES, 7, query_event("repeats-too", T0, results=("a", "b", "a")))
    refused = p.take(0, [*queries, (QUERIES, 10, query_event("later", NOW + 3_600_000))])
    assert [(at, e.reason) for at, e in refused] == [(10, "future_timestamp")]
    # offsets 0 to 3 were counted by an earlier owner; the refused one is counted as invalid
    assert p.counts.events[QUERIES] == 7
    assert p.counts.invalid[QUERIES, "future_timestamp"] == 1
    assert p.counts.queries["r1", "default"] == 6
    assert p.counts.duplicate_results == 1  # (the re-read one was counted before)
    assert p.streams[0].next_offset == [11, -1]
    assert len(p.streams[0].pending) == 10


def test_a_batch_notes_per_topic_its_highest_offset_and_the_time_it_was_taken() -> None:
    """What the commits and the idleness read: per topic, the next offset to read (never
    moving back) and the wall time of the last batch with a record of that topic (refused
    ones too); a topic without records in a batch keeps both."""
    now = [NOW]
    p = Pipeline(PipelineConfig(join=JOIN, ks=KS), now_ms=lambda: now[0])
    stream = p.assign(0)
    assert stream.watermark.last_seen == [NOW, NOW]
    now[0] = NOW + 10  # queries only, the last one refused by the guard
    batch: list[Record] = [(QUERIES, k, query_event(f"q{k}", T0 + k * SEC)) for k in range(4)]
    refused = p.take(0, [*batch, (QUERIES, 4, query_event("later", NOW + 3_600_000))])
    assert [at for at, _ in refused] == [4]
    assert (stream.next_offset, stream.watermark.last_seen) == ([5, -1], [NOW + 10, NOW])
    now[0] = NOW + 20  # feedback only
    p.take(0, [(FEEDBACK, k, feedback_event("q1", T0 + 2 * SEC, "a")) for k in range(3)])
    assert (stream.next_offset, stream.watermark.last_seen) == ([5, 3], [NOW + 10, NOW + 20])
    now[0] = NOW + 30  # a query read again below the next offset
    p.take(0, [(QUERIES, 2, query_event("q2", T0 + 2 * SEC))])
    assert (stream.next_offset, stream.watermark.last_seen) == ([5, 3], [NOW + 30, NOW + 20])
    now[0] = NOW + 40  # both topics in one batch
    p.take(
        0,
        [
            (QUERIES, 5, query_event("q5", T0 + 5 * SEC)),
            (FEEDBACK, 3, feedback_event("q5", T0 + 6 * SEC, "b")),
            (QUERIES, 6, query_event("q6", T0 + 6 * SEC)),
        ],
    )
    assert (stream.next_offset, stream.watermark.last_seen) == ([7, 4], [NOW + 40, NOW + 40])
    assert p.counts.events[QUERIES] == 5 + 1 + 2  # (q2 again too: counted_from is 0 here)


signal: st.SearchStrategy[tuple[str, dict[str, int]]] = st.one_of(
    st.tuples(st.just("click"), st.sampled_from([{}, {"dwell_ms": 5_000}, {"dwell_ms": 60_000}])),
    st.tuples(st.just("citation"), st.just({})),
    st.tuples(st.just("judgment"), st.sampled_from([{"grade": g} for g in range(4)])),
)


@settings(max_examples=150, deadline=None)
@given(
    feedback=st.lists(
        st.tuples(
            st.one_of(  # ms after the query: the bounds of its attribution window, and between
                st.sampled_from([-SKEW - 1, -SKEW, 0, ATTR, ATTR + 1]),
                st.integers(-SKEW - 2 * SEC, ATTR + 2 * SEC),
            ),
            st.sampled_from(CHUNKS),
            signal,
            st.integers(0, 40),  # feedback offset
        ),
        min_size=1,
        max_size=8,
        unique_by=lambda f: f[3],
    ),
)
def test_feedback_joined_on_arrival_labels_as_feedback_that_waited_for_its_query(
    feedback: list[tuple[int, str, tuple[str, dict[str, int]], int]],
) -> None:
    """The join's two ways to label a query: the loop's own, for feedback that finds its
    query pending, and ``PartitionStream._attach``, for feedback that waited for its
    query. Written twice for speed, they must give the same labels, the same lowest
    feedback offset of the window and the same count of feedback outside the query's
    attribution window, whichever comes first."""
    query_ts = T0 + 3 * 60 * SEC
    query: Record = (QUERIES, 0, query_event("q", query_ts, results=CHUNKS))
    signals: list[Record] = [
        (FEEDBACK, offset, feedback_event("q", query_ts + delta, chunk, kind, **extra))
        for delta, chunk, (kind, extra), offset in feedback
    ]
    outcomes = []
    for batches in ([[query, *signals]], [signals, [query]], [[*signals, query]]):
        p = Pipeline(PipelineConfig(join=JOIN, ks=KS), now_ms=lambda: NOW)
        stream = p.assign(0)
        for batch in batches:
            assert p.take(0, batch) == []
        (window,) = stream.windows.values()
        outcomes.append(
            (stream.labels.get(b"q"), window.min_fb_offset, p.counts.unmatched["outside_window"])
        )
    assert outcomes[1] == outcomes[0]
    assert outcomes[2] == outcomes[0]
    inside = [f for f in feedback if -SKEW <= f[0] <= ATTR]
    assert (outcomes[0][0] is not None) == bool(inside)
