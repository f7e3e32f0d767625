"""Label sources: per window, the finalised queries with a relevant label from each source
(``click``, ``citation``, ``judgment``), as the join applies the labelling rule; equal to
the offline reference on randomised traffic (orphans, duplicates, feedback outside the
attribution window, judgments of grade 0), through the window records and back.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Iterable

import pytest

from service.stream.events import FeedbackEvent, QueryEvent
from service.stream.labels import SOURCE_BITS, SOURCES, LabelPolicy
from service.stream.pipeline import Pipeline, PipelineConfig
from service.stream.reference import evaluate_event_log
from service.stream.topics import FEEDBACK, QUERIES
from service.stream.windows import ClosedWindow
from tests.unit.stream.test_join import (
    ATTR,
    JOIN,
    KS,
    MIN,
    NOW,
    SEC,
    SKEW,
    T0,
    WINDOW,
    Harness,
    feedback_event,
    query_event,
)


def sources(window: ClosedWindow) -> tuple[int, int, int]:
    """(click, citation, judgment) of a window."""
    return window.sources["click"], window.sources["citation"], window.sources["judgment"]


def test_the_source_bits_are_distinct_and_ordered() -> None:
    assert SOURCES == ("click", "citation", "judgment")
    assert [SOURCE_BITS[s] for s in SOURCES] == [1, 2, 4]


def test_each_source_counts_the_queries_it_labelled() -> None:
    """A query labelled by two sources counts under both; labelled counts it once."""
    h = Harness()
    h.q("both", T0)  # a click and a citation
    h.fb("both", T0 + SEC, "a")
    h.fb("both", T0 + 2 * SEC, "b", signal="citation")
    h.fb("both", T0 + 3 * SEC, "a")  # a second click: still one query
    h.q("cited", T0 + SEC)
    h.fb("cited", T0 + 4 * SEC, "zz", signal="citation")  # not retrieved: relevant all the same
    h.q("judged", T0 + 2 * SEC)
    h.fb("judged", T0 + 5 * SEC, "c", signal="judgment", grade=3)
    h.q("none", T0 + 3 * SEC)
    [w] = h.finish()
    assert (w.queries, w.labelled) == (4, 3)
    assert sources(w) == (1, 2, 1)


def test_a_judgment_of_grade_0_labels_no_query() -> None:
    """Grade 0 is not relevant: the query stays unlabelled and counts under no source,
    even next to a relevant label of another source."""
    h = Harness()
    h.q("q0", T0)
    h.fb("q0", T0 + SEC, "a", signal="judgment", grade=0)
    h.q("q1", T0)
    h.fb("q1", T0 + SEC, "a", signal="judgment", grade=0)
    h.fb("q1", T0 + SEC, "b")  # a click on another chunk
    h.q("q2", T0)  # judged 0, then 1, on the same chunk: the maximum is relevant
    h.fb("q2", T0 + SEC, "a", signal="judgment", grade=0)
    h.fb("q2", T0 + 2 * SEC, "a", signal="judgment", grade=1)
    [w] = h.finish()
    assert (w.queries, w.labelled) == (3, 2)
    assert sources(w) == (1, 0, 1)


def test_a_source_the_policy_grades_0_labels_no_query() -> None:
    """Relevance is the policy's grade: with clicks graded 0, a click is no label."""
    h = Harness(labels=LabelPolicy(click=0))
    h.q("short", T0)
    h.fb("short", T0 + SEC, "a")
    h.q("long", T0)
    h.fb("long", T0 + SEC, "a", dwell_ms=40_000)  # a long click: grade 2 still
    [w] = h.finish()
    assert (w.labelled, sources(w)) == (1, (1, 0, 0))


def test_feedback_that_waited_for_its_query_counts() -> None:
    """An orphan (feedback first, then its query) carries its source to the query."""
    h = Harness()
    h.fb("early", T0 + 2 * SEC, "b", signal="citation")
    h.fb("early", T0 + 3 * SEC, "a", signal="judgment", grade=0)
    h.fb("judged", T0 + 2 * SEC, "c", signal="judgment", grade=2)
    assert h.p.pending_feedback == 3
    h.q("early", T0)
    h.q("judged", T0 + SEC)
    [w] = h.finish()
    assert (w.queries, w.labelled) == (2, 2)
    assert sources(w) == (0, 1, 1)


def test_only_feedback_the_labelling_rule_applies_counts() -> None:
    """Feedback before ``ts - clock_skew`` (waiting or not), after ``ts + attribution``,
    or late (its query final) gives no source."""
    h = Harness()
    h.fb("before", T0 - SKEW - SEC, "a", signal="citation")  # waits, then outside
    h.q("before", T0)
    h.q("after", T0)
    h.fb("after", T0 + ATTR + SEC, "a", signal="judgment", grade=3)
    h.q("edge", T0)
    h.fb("edge", T0 - SKEW, "a", signal="citation")  # the bounds are inclusive
    h.fb("edge", T0 + ATTR, "b")
    h.q("late", T0 + SEC)
    h.tick(T0 + WINDOW + ATTR + 2 * MIN)  # the window closes
    [w] = h.advance()
    h.fb("late", T0 + 2 * SEC, "a")  # its query is final: late
    assert (w.queries, w.labelled) == (4, 1)
    assert sources(w) == (1, 1, 0)
    assert h.p.counts.unmatched["outside_window"] == 2
    assert h.p.counts.late[FEEDBACK] == 1


def test_a_duplicate_query_keeps_the_first_and_its_sources() -> None:
    """The duplicate is ignored; feedback of the id is bounded by the first's time."""
    h = Harness()
    h.q("dup", T0)
    h.q("dup", T0 + 5 * MIN)  # ignored (the first is pending)
    h.fb("dup", T0 + ATTR + 2 * MIN, "a")  # inside the duplicate's bounds, not the first's
    h.fb("dup", T0 + SEC, "b", signal="citation")
    [w] = h.finish()
    assert (w.queries, sources(w)) == (1, (0, 1, 0))
    assert h.p.counts.duplicates[QUERIES] == 1


def test_an_evicted_query_leaves_no_sources_behind() -> None:
    h = Harness(max_pending_queries=1)
    h.q("old", T0)
    h.fb("old", T0 + SEC, "a")
    h.q("new", T0 + SEC)  # evicts "old" with its sources
    h.fb("new", T0 + 2 * SEC, "b", signal="citation")
    stream = h.p.streams[0]
    assert list(stream.source_masks) == [b"new"]
    [w] = h.finish()
    assert (w.queries, sources(w)) == (1, (0, 1, 0))
    assert stream.source_masks == {}


def test_the_window_record_carries_the_sources_and_reads_them_back() -> None:
    h = Harness()
    h.q("q", T0)
    h.fb("q", T0 + SEC, "a", signal="judgment", grade=2)
    h.q("unlabelled", T0)
    [w] = h.finish()
    record = w.to_record(w.metrics)
    assert record["sources"] == {"click": 0, "citation": 0, "judgment": 1}
    raw = json.dumps(record).encode()
    assert ClosedWindow.from_json(raw) == w
    assert ClosedWindow.from_json(raw).sources == {"click": 0, "citation": 0, "judgment": 1}
    assert ClosedWindow.from_record(record) == w
    # a record written before sources were counted: none, every key present
    del record["sources"]
    older = ClosedWindow.from_json(json.dumps(record).encode())
    assert older.sources == {"click": 0, "citation": 0, "judgment": 0}
    assert ClosedWindow.from_record(record).sources == older.sources
    assert older.to_record(w.metrics)["sources"] == {"click": 0, "citation": 0, "judgment": 0}


# -- randomised traffic: streaming equals the reference --------------------------------


def traffic(seed: int, n_queries: int = 400) -> list[QueryEvent | FeedbackEvent]:
    """Queries every 2 s with feedback of every source, in arrival order: each event
    arrives up to 20 s (of event time) after it happened, so feedback often comes before
    its query and nothing is late; some feedback falls outside ``[ts - clock_skew, ts +
    attribution]``, some judgments are of grade 0, some ids repeat (while pending) with
    another time, retriever and results."""
    rng = random.Random(seed)
    timed: list[tuple[int, int, QueryEvent | FeedbackEvent]] = []

    def arrive(ts: int, event: QueryEvent | FeedbackEvent) -> None:
        timed.append((ts + rng.randrange(20 * SEC), len(timed), event))

    for i in range(n_queries):
        query_id = f"q{i}"
        ts = T0 + 2 * SEC * i + rng.randrange(2 * SEC)
        results = [f"c{rng.randrange(8)}" for _ in range(rng.randrange(1, 6))]
        retriever = rng.choice(["r1", "r2"])
        arrive(ts, query_event(query_id, ts, results, retriever=retriever, context_k=2))
        if rng.random() < 0.05:
            other = ts + rng.randrange(-5 * SEC, 5 * SEC)
            arrive(other, query_event(query_id, other, ["c0"], retriever="r3"))
        for _ in range(rng.choice([0, 0, 1, 1, 2, 3])):
            kind = rng.random()
            if kind < 0.15:  # before the query (outside the bounds when before -clock_skew)
                delay = rng.randrange(-SKEW - 10 * SEC, 0)
            elif kind < 0.25:  # after the attribution window
                delay = rng.randrange(ATTR + 1, ATTR + 2 * MIN)
            else:
                delay = rng.randrange(ATTR + 1)
            chunk = rng.choice([*results, "unretrieved"])
            signal = rng.choice(["click", "citation", "judgment"])
            extra: dict[str, int] = {}
            if signal == "judgment":
                extra["grade"] = rng.choice([0, 0, 1, 2, 3])
            elif signal == "click" and rng.random() < 0.3:
                extra["dwell_ms"] = 45_000
            arrive(ts + delay, feedback_event(query_id, ts + delay, chunk, signal, **extra))
    timed.sort(key=lambda item: item[:2])
    return [event for _, _, event in timed]


def streamed(events: Iterable[QueryEvent | FeedbackEvent], partitions: int) -> list[ClosedWindow]:
    """Every window the pipeline closes, the events spread over partitions by id."""
    p = Pipeline(PipelineConfig(join=JOIN, ks=KS), now_ms=lambda: NOW)
    for partition in range(partitions):
        p.assign(partition)
    offsets: Counter[tuple[int, bool]] = Counter()
    out: list[ClosedWindow] = []
    for n, event in enumerate(events, start=1):
        partition = int(event.query_id[1:]) % partitions
        is_query = isinstance(event, QueryEvent)
        offset = offsets[partition, is_query]
        offsets[partition, is_query] += 1
        if isinstance(event, QueryEvent):
            assert p.query(partition, offset, event) is None
        else:
            assert p.feedback(partition, offset, event) is None
        if n % 97 == 0:
            closed = p.advance()
            p.deliver(closed)
            out += closed
    closed = p.finish()
    p.deliver(closed)
    return out + closed


@pytest.mark.parametrize(("seed", "partitions"), [(1, 1), (2, 1), (3, 3)])
def test_streaming_sources_equal_the_reference(seed: int, partitions: int) -> None:
    events = traffic(seed)
    queries = [e for e in events if isinstance(e, QueryEvent)]
    feedback = [e for e in events if isinstance(e, FeedbackEvent)]
    # the traffic has what the rule must tell apart
    seen: set[str] = set()
    waited = 0  # feedback that arrives before its query
    for e in events:
        if isinstance(e, QueryEvent):
            seen.add(e.query_id)
        else:
            waited += e.query_id not in seen
    assert waited > 20
    assert len(queries) - len(seen) > 5  # duplicates
    assert sum(e.signal == "judgment" and e.grade == 0 for e in feedback) > 20
    expected = evaluate_event_log(
        queries,
        feedback,
        window_ms=WINDOW,
        attribution_ms=ATTR,
        clock_skew_ms=SKEW,
        ks=KS,
        partition_of={q.query_id: int(q.query_id[1:]) % partitions for q in queries},
    )
    got = {w.key: w for w in streamed(events, partitions)}
    assert got == expected
    totals = Counter[str]()
    for w in got.values():
        totals.update(w.sources)
        assert max(sources(w)) <= w.labelled <= sum(sources(w))
    labelled = sum(w.labelled for w in got.values())
    assert all(0 < totals[s] < labelled for s in SOURCES), (totals, labelled)
    # the bounds matter here: every relevant event, in the bounds or not, would count more
    unbounded = {
        source: len({e.query_id for e in feedback if e.signal == source and e.grade != 0})
        for source in SOURCES
    }
    assert all(unbounded[s] > totals[s] for s in SOURCES), (unbounded, totals)
