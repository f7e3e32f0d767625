"""The event-time join of the streaming pipeline: its edges, one at a time, then as a whole.

Small windows keep the arithmetic readable: 60 s windows, 10 min attribution, 5 s clock
skew, 60 s out-of-orderness, 30 s idle timeout. The wall clock is injected (a mutable
:class:`Clock`); it stays fixed unless a test moves it, so no topic goes idle by accident.
"""

from __future__ import annotations

import random
import zlib
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import replace
from math import log2
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.core.monitor import MonitorConfig
from service.errors import EventError
from service.metrics.aggregates import Moments
from service.replay import replay
from service.sim.simulator import (
    SimEvent,
    SimulationConfig,
    encode,
    generate,
    write_jsonl,
)
from service.stream.events import (
    FeedbackEvent,
    QueryEvent,
    decode_feedback,
    decode_query,
    feedback_from,
    query_from,
)
from service.stream.join_state import JoinConfig
from service.stream.offsets import restart_from
from service.stream.pipeline import Pipeline, PipelineConfig
from service.stream.reference import evaluate_event_log
from service.stream.topics import FEEDBACK, QUERIES
from service.stream.windows import ClosedWindow, WindowSink
from service.times import HOUR_MS, rfc3339_millis

SEC = 1_000
MIN = 60_000
T0 = 1_796_083_200_000  # 2026-12-01T00:00:00Z: a window start for every window size used here
WINDOW = MIN
ATTR = 10 * MIN
SKEW = 5 * SEC
OOO = MIN
IDLE = 30 * SEC
KS = (1, 3, 5)
NOW = T0 + 86_400_000  # the wall clock: a day after the events (all of them are in the past)
JOIN = JoinConfig(
    attribution_ms=ATTR,
    clock_skew_ms=SKEW,
    window_ms=WINDOW,
    max_out_of_orderness_ms=OOO,
    idle_timeout_ms=IDLE,
)


class Clock:
    """An injected wall clock in ms; tests move it by assigning ``ms``."""

    def __init__(self, ms: int) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


def query_event(
    query_id: str,
    ts_ms: int,
    results: Sequence[str] = ("a", "b", "c"),
    retriever: str = "r1",
    segment: str = "default",
    context_k: int | None = None,
) -> QueryEvent:
    body: dict[str, Any] = {
        "query_id": query_id,
        "timestamp": rfc3339_millis(ts_ms),
        "retriever": retriever,
        "results": list(results),
        "segment": segment,
    }
    if context_k is not None:
        body["context_k"] = context_k
    return query_from(body)


def feedback_event(
    query_id: str, ts_ms: int, chunk_id: str, signal: str = "click", **extra: int
) -> FeedbackEvent:
    body = {"query_id": query_id, "timestamp": rfc3339_millis(ts_ms), "chunk_id": chunk_id}
    return feedback_from({**body, "signal": signal, **extra})


class Harness:
    """One pipeline on partition 0, offsets counted per topic, windows published as they close."""

    def __init__(self, clock_ms: int = NOW, **config: Any) -> None:
        self.clock = Clock(clock_ms)
        self.p = Pipeline(PipelineConfig(join=JOIN, ks=KS, **config), now_ms=self.clock)
        self.p.assign(0)
        self.offsets = [0, 0]
        self.published: list[ClosedWindow] = []

    def q(self, query_id: str, ts_ms: int, **kw: Any) -> EventError | None:
        self.offsets[0] += 1
        return self.p.query(0, self.offsets[0] - 1, query_event(query_id, ts_ms, **kw))

    def fb(self, query_id: str, ts_ms: int, chunk_id: str, **kw: Any) -> EventError | None:
        self.offsets[1] += 1
        return self.p.feedback(
            0, self.offsets[1] - 1, feedback_event(query_id, ts_ms, chunk_id, **kw)
        )

    def tick(self, ts_ms: int) -> None:
        """Unrelated traffic (retriever ``filler``) that takes both topics' max ts to ``ts_ms``."""
        self.q(f"filler-{ts_ms}", ts_ms, retriever="filler")
        self.fb(f"filler-{ts_ms}", ts_ms, "a")

    def advance(self) -> list[ClosedWindow]:
        """Closed windows of retriever r1 (all closed windows are published)."""
        return self._publish(self.p.advance())

    def close_without_publishing(self) -> list[ClosedWindow]:
        return r1(self.p.advance())

    def finish(self) -> list[ClosedWindow]:
        return self._publish(self.p.finish())

    def _publish(self, windows: list[ClosedWindow]) -> list[ClosedWindow]:
        self.p.deliver(windows)
        self.published.extend(windows)
        return r1(windows)

    def records(self, key: str) -> list[ClosedWindow]:
        return [w for w in self.published if w.key == key]


def r1(windows: Iterable[ClosedWindow]) -> list[ClosedWindow]:
    return [w for w in windows if w.retriever == "r1"]


def key_of(
    start_ms: int, retriever: str = "r1", segment: str = "default", partition: int = 0
) -> str:
    return f"{retriever}|{segment}|{rfc3339_millis(start_ms).replace('.000', '')}|{partition}"


def moments(window: ClosedWindow, metric: str) -> tuple[int, float]:
    m = window.metrics.get(metric, Moments())
    return m.count, m.sum


def close(window: ClosedWindow, metric: str, count: int, value: float) -> bool:
    """The metric has ``count`` values summing to ``value`` (within float rounding)."""
    got_count, got_sum = moments(window, metric)
    return got_count == count and abs(got_sum - value) < 1e-12


def dcg(gains: Sequence[int]) -> float:
    return sum(g / log2(rank + 1) for rank, g in enumerate(gains, start=1))


# -- 1. feedback before its query ---------------------------------------------------------


def test_feedback_before_its_query_waits_then_labels_it() -> None:
    h = Harness()
    h.fb("q1", T0 + 2 * SEC, "a")
    assert (h.p.pending_feedback, h.p.pending_queries) == (1, 0)
    h.q("q1", T0, results=("a", "b", "c"))
    assert (h.p.pending_feedback, h.p.pending_queries) == (0, 1)
    [w] = h.finish()
    assert (w.queries, w.labelled) == (1, 1)
    assert moments(w, "hit_rate@1") == (1, 1.0)
    assert moments(w, "mrr") == (1, 1.0)
    assert h.p.counts.unmatched == Counter()


# -- 2. the attribution window [ts - clock_skew, ts + attribution] ------------------------

BOUNDS = [(ATTR, 1), (ATTR + 1, 0), (-SKEW, 1), (-SKEW - 1, 0)]


@pytest.mark.parametrize(("delta", "labelled"), BOUNDS)
def test_attribution_bounds_feedback_after_query(delta: int, labelled: int) -> None:
    h = Harness()
    ts = T0 + 30 * SEC
    h.q("q1", ts)
    h.fb("q1", ts + delta, "a")
    [w] = h.finish()
    assert (w.queries, w.labelled) == (1, labelled)
    assert h.p.counts.unmatched == Counter() if labelled else Counter({"outside_window": 1})
    assert h.p.counts.late == Counter()


@pytest.mark.parametrize(("delta", "labelled"), BOUNDS)
def test_attribution_bounds_feedback_before_query(delta: int, labelled: int) -> None:
    h = Harness()
    ts = T0 + 30 * SEC
    h.fb("q1", ts + delta, "a")
    h.q("q1", ts)
    assert h.p.pending_feedback == 0
    [w] = h.finish()
    assert (w.queries, w.labelled) == (1, labelled)


@pytest.mark.parametrize("delta", [ATTR + 1, -SKEW - 1])
def test_waiting_feedback_outside_the_window_is_counted_unmatched(delta: int) -> None:
    h = Harness()
    ts = T0 + 30 * SEC
    h.fb("q1", ts + delta, "a")
    h.q("q1", ts)
    h.finish()
    assert h.p.counts.unmatched == Counter({"outside_window": 1})


# -- 3. window membership ---------------------------------------------------------------


def test_query_at_a_window_start_belongs_to_that_window() -> None:
    h = Harness()
    h.q("at-start", T0)
    h.q("at-last-ms", T0 + WINDOW - 1)
    h.q("just-before", T0 - 1)
    windows = {w.key: w for w in h.finish()}
    assert set(windows) == {
        "r1|default|2026-12-01T00:00:00Z|0",
        "r1|default|2026-11-30T23:59:00Z|0",
    }
    this, previous = windows[key_of(T0)], windows[key_of(T0 - WINDOW)]
    assert (this.start_ms, this.end_ms, this.queries) == (T0, T0 + WINDOW, 2)
    assert (previous.start_ms, previous.end_ms, previous.queries) == (T0 - WINDOW, T0, 1)
    assert this.to_record(())["window_start"] == "2026-12-01T00:00:00Z"


# -- 4. closing time ---------------------------------------------------------------------


def test_window_closes_exactly_when_the_watermark_reaches_end_plus_attribution() -> None:
    h = Harness()
    h.q("q1", T0 + WINDOW - 1)  # the last ms of [T0, T0 + 60 s)
    close_at = T0 + WINDOW + ATTR
    h.tick(close_at + OOO - 1)
    assert h.advance() == []
    assert h.p.watermark_ms == close_at - 1
    assert h.p.pending_queries == 2  # q1 and the filler query
    h.tick(close_at + OOO)
    [w] = h.advance()
    assert h.p.watermark_ms == close_at
    assert (w.key, w.queries) == (key_of(T0), 1)


def test_watermark_is_the_smaller_topic_maximum_minus_out_of_orderness() -> None:
    h = Harness()
    h.q("q1", T0 + 10 * MIN)
    h.advance()
    assert h.p.watermark_ms is None  # nothing seen on the feedback topic yet (and not idle)
    h.fb("q1", T0 + 10 * MIN + 7 * SEC, "a")
    h.advance()
    assert h.p.watermark_ms == T0 + 10 * MIN - OOO
    h.q("q2", T0 + 20 * MIN)
    assert h.p.watermark_ms == T0 + 10 * MIN - OOO  # only advance() recomputes it
    h.advance()
    assert h.p.watermark_ms == T0 + 10 * MIN + 7 * SEC - OOO
    h.q("q0", T0)  # an older event never moves it backwards
    h.advance()
    assert h.p.watermark_ms == T0 + 10 * MIN + 7 * SEC - OOO


# -- 5. late events ----------------------------------------------------------------------


def test_late_feedback_is_counted_and_the_closed_window_does_not_change() -> None:
    h = Harness()
    h.q("q1", T0, results=("a", "b", "c"))
    h.fb("q1", T0 + SEC, "b")
    h.tick(T0 + WINDOW + ATTR + OOO)
    [w] = h.advance()
    assert (w.queries, w.labelled, moments(w, "mrr")) == (1, 1, (1, 0.5))
    h.fb("q1", T0 + 2 * SEC, "a")  # inside q1's attribution window, after its window closed
    assert h.p.counts.late == Counter({FEEDBACK: 1})
    assert h.p.counts.unmatched == Counter()
    assert h.p.pending_feedback == 0
    assert h.finish() == []
    assert h.records(key_of(T0)) == [w]


def test_late_query_is_counted_and_not_applied() -> None:
    h = Harness()
    h.q("q1", T0)
    h.tick(T0 + WINDOW + ATTR + OOO)
    # Closed but not published: the watermark alone (not the published marker) must reject.
    assert [w.queries for w in h.close_without_publishing()] == [1]
    watermark = h.p.watermark_ms
    assert watermark == T0 + WINDOW + ATTR
    h.q("late", T0 + 30 * SEC)  # ts + attribution < watermark
    assert h.p.counts.late == Counter({QUERIES: 1})
    assert b"late" not in h.p.streams[0].pending
    h.q("not-late", watermark - ATTR)  # ts + attribution == watermark: not yet final
    assert h.p.counts.late == Counter({QUERIES: 1})
    assert h.p.counts.queries[("r1", "default")] == 2  # q1 and not-late
    windows = {w.key: w for w in h.finish()}
    assert set(windows) == {key_of(T0 + WINDOW)}
    assert windows[key_of(T0 + WINDOW)].queries == 1


# -- 6. idleness -------------------------------------------------------------------------


def test_idle_feedback_topic_is_left_out_after_the_idle_timeout() -> None:
    h = Harness(clock_ms=NOW)  # both topics were last seen at NOW (the assignment)
    for i in range(13):  # one query per window: T0, T0 + 1 min, ..., T0 + 12 min
        h.q(f"q{i}", T0 + i * WINDOW)
    h.clock.ms = NOW + IDLE - 1
    assert h.advance() == []
    assert h.p.watermark_ms is None  # the feedback topic is not idle yet and has no time
    h.q("q13", T0 + 13 * WINDOW)  # queries keep flowing: last seen at NOW + IDLE - 1
    assert h.advance() == []
    assert h.p.watermark_ms is None
    h.clock.ms = NOW + IDLE  # feedback silent for exactly idle_timeout
    closed = h.advance()
    assert h.p.watermark_ms == T0 + 13 * WINDOW - OOO  # the queries topic alone
    # end + attribution <= T0 + 12 min: the windows starting at T0 and T0 + 1 min
    assert sorted(w.start_ms for w in closed) == [T0, T0 + WINDOW]
    # Both silent: the watermark follows the wall clock, but not before idle_timeout.
    h.clock.ms = NOW + 2 * IDLE - 2  # queries silent for idle_timeout - 1
    assert h.advance() == []
    assert h.p.watermark_ms == T0 + 13 * WINDOW - OOO
    h.clock.ms = NOW + 2 * IDLE - 1
    closed = h.advance()
    assert h.p.watermark_ms == NOW + 2 * IDLE - 1 - OOO
    assert sorted(w.start_ms for w in closed) == [T0 + i * WINDOW for i in range(2, 14)]
    assert sum(w.queries for w in h.published) == 14


# -- 7. duplicates -----------------------------------------------------------------------


def test_duplicate_query_is_counted_once_and_ignored() -> None:
    h = Harness()
    h.q("q1", T0, results=("a", "b"))
    h.fb("q1", T0 + SEC, "b")
    h.q("q1", T0, results=("a", "b"))  # redelivered after its feedback: keeps the label
    assert h.p.counts.duplicates == Counter({QUERIES: 1})
    assert h.p.counts.queries == Counter({("r1", "default"): 1})
    assert h.p.counts.events == Counter({QUERIES: 2, FEEDBACK: 1})
    [w] = h.finish()
    assert (w.queries, w.labelled, moments(w, "mrr")) == (1, 1, (1, 0.5))


def test_duplicate_feedback_gives_the_same_metrics_as_one_delivery() -> None:
    def run(deliveries: int) -> ClosedWindow:
        h = Harness()
        h.q("q1", T0, results=("a", "b", "c"))
        for _ in range(deliveries):
            h.fb("q1", T0 + SEC, "b")  # grade 1
        h.fb("q1", T0 + 2 * SEC, "c", dwell_ms=40_000)  # a long click: grade 2
        [w] = h.finish()
        return w

    once, twice = run(1), run(2)
    assert twice == once
    # b: 1 at rank 2, c: 2 at rank 3 (a summed grade 2 for b would give 0.6934)
    expected = dcg([0, 1, 2]) / dcg([2, 1])
    assert close(once, "ndcg@3", 1, expected)


# -- 8. timestamps from the future -------------------------------------------------------


def test_far_future_event_is_rejected_and_does_not_move_the_watermark() -> None:
    h = Harness()
    year = 365 * 86_400_000
    for error in (h.q("future", NOW + year), h.fb("future", NOW + year, "a")):
        assert isinstance(error, EventError)
        assert error.reason == "future_timestamp"
    assert h.p.counts.invalid == Counter(
        {(QUERIES, "future_timestamp"): 1, (FEEDBACK, "future_timestamp"): 1}
    )
    assert h.p.counts.events == Counter({QUERIES: 1, FEEDBACK: 1})
    assert h.advance() == []
    assert h.p.watermark_ms is None
    assert (h.p.pending_queries, h.p.pending_feedback) == (0, 0)
    h.q("q1", T0)
    h.fb("q1", T0 + SEC, "a")
    h.advance()
    assert h.p.watermark_ms == T0 - OOO
    [w] = h.finish()
    assert (w.queries, w.labelled) == (1, 1)
    assert h.p.counts.late == Counter()


@pytest.mark.parametrize(("ahead", "rejected"), [(5 * MIN, False), (5 * MIN + 1, True)])
def test_future_skew_limit_is_inclusive(ahead: int, rejected: bool) -> None:
    h = Harness()
    error = h.q("q1", NOW + ahead)
    assert (error is not None) == rejected
    assert h.p.pending_queries == (0 if rejected else 1)


# -- 9. memory caps ----------------------------------------------------------------------


def test_pending_query_cap_evicts_the_oldest_queries() -> None:
    h = Harness(max_pending_queries=3)
    for i in range(5):
        h.q(f"q{i}", T0 + i * SEC)
        if i < 2:  # only the two oldest are labelled
            h.fb(f"q{i}", T0 + i * SEC + 1, "a")
    assert h.p.counts.evicted == Counter({"query": 2})
    assert h.p.pending_queries == 3
    assert set(h.p.streams[0].pending) == {b"q2", b"q3", b"q4"}
    [w] = h.finish()
    assert (w.queries, w.labelled) == (3, 0)


def test_pending_query_cap_drops_a_window_whose_queries_were_all_evicted() -> None:
    h = Harness(max_pending_queries=3)
    h.q("old-0", T0)
    h.q("old-1", T0 + 1)
    for i in range(3):
        h.q(f"new-{i}", T0 + WINDOW + i)
    assert h.p.counts.evicted == Counter({"query": 2})
    [w] = h.finish()
    assert (w.key, w.queries) == (key_of(T0 + WINDOW), 3)


def test_the_caps_hold_over_all_partitions_together() -> None:
    """A partition with few pending records must not add over a cap another one filled."""
    p = Pipeline(
        PipelineConfig(join=JOIN, ks=KS, max_pending_queries=10, max_pending_feedback=10),
        now_ms=Clock(NOW),
    )
    for partition in (0, 1):
        p.assign(partition)
    peak_q = peak_fb = 0
    for i in range(30):  # 20 on partition 0, then 10 on partition 1
        partition = 0 if i < 20 else 1
        p.query(partition, i, query_event(f"q{i}", T0 + i * SEC))
        p.feedback(partition, i, feedback_event(f"orphan{i}", T0 + i * SEC, "a"))
        peak_q, peak_fb = max(peak_q, p.pending_queries), max(peak_fb, p.pending_feedback)
    assert (peak_q, peak_fb) == (10, 10)
    assert p.counts.evicted == Counter({"query": 20, "feedback": 20})
    # the oldest (of the fullest partition) went: partition 1 keeps its newest
    assert len(p.streams[0].pending) + len(p.streams[1].pending) == 10


def test_evicted_queries_are_forgotten_and_the_commit_moves_past_them() -> None:
    h = Harness(max_pending_queries=100)
    for i in range(1_000):  # one window, far more queries than the cap
        h.q(f"q{i}", T0 + i)
    stream = h.p.streams[0]
    [window] = stream.windows.values()
    assert len(window.query_ids) - window.cursor == 100
    assert len(window.query_ids) < 300, "evicted ids are kept: memory grows past the cap"
    # the oldest query still needed is the 900th: a restart re-reads 100, not 1,000
    assert stream.commit_offsets()[0] == 900


def test_a_restart_does_not_count_evictions_of_re_read_records_again() -> None:
    p = Pipeline(PipelineConfig(join=JOIN, ks=KS, max_pending_queries=5), now_ms=Clock(NOW))
    p.assign(0, counted_from=(8, 0))  # an earlier life counted offsets 0..7
    for i in range(12):
        p.query(0, i, query_event(f"q{i}", T0 + i))
    assert p.pending_queries == 5
    assert p.counts.evicted["query"] == 0  # offsets 0..6 went: all counted before
    assert p.counts.queries.total() == 4  # offsets 8..11 are new to this process


def test_pending_feedback_cap_evicts_the_oldest_orphans() -> None:
    h = Harness(max_pending_feedback=3)
    for i in range(5):
        h.fb(f"q{i}", T0 + i * SEC + 500, "a")
    assert h.p.counts.evicted == Counter({"feedback": 2})
    assert h.p.pending_feedback == 3
    for i in range(5):  # 'a' at rank 1 for the two oldest, rank 2 for the others
        h.q(f"q{i}", T0 + i * SEC, results=("a", "b") if i < 2 else ("b", "a"))
    assert h.p.pending_feedback == 0
    [w] = h.finish()
    assert (w.queries, w.labelled) == (5, 3)
    assert moments(w, "mrr") == (3, 1.5)  # q2..q4 labelled, each 1/2


# -- 10. no premature finalisation -------------------------------------------------------


def test_feedback_within_out_of_orderness_still_labels_its_query() -> None:
    h = Harness()
    ts = T0 + WINDOW - 1
    h.q("q1", ts, results=("a", "b"))
    h.tick(ts + ATTR + OOO)  # other traffic: the watermark goes to exactly ts + attribution
    assert h.advance() == []
    assert h.p.watermark_ms == ts + ATTR
    h.fb("q1", ts + ATTR, "b")  # OOO behind the feedback topic's max: in bound
    assert h.p.counts.late == Counter()
    h.tick(ts + ATTR + OOO + 1)
    [w] = h.advance()
    assert (w.queries, w.labelled, moments(w, "mrr")) == (1, 1, (1, 0.5))


# -- 11. grades --------------------------------------------------------------------------


@pytest.mark.parametrize(("dwell_ms", "grade_b"), [(29_999, 1), (30_000, 2)])
def test_long_click_is_grade_two(dwell_ms: int, grade_b: int) -> None:
    h = Harness()
    h.q("q1", T0, results=("a", "b", "c"))
    h.fb("q1", T0 + SEC, "a")  # a click without dwell: grade 1
    h.fb("q1", T0 + 2 * SEC, "b", dwell_ms=dwell_ms)
    [w] = h.finish()
    expected = dcg([1, grade_b]) / dcg(sorted([1, grade_b], reverse=True))
    assert close(w, "ndcg@3", 1, expected)
    assert moments(w, "recall@3") == (1, 1.0)


def test_judgment_grade_zero_is_not_relevant() -> None:
    h = Harness()
    h.q("q1", T0)
    h.fb("q1", T0 + SEC, "a", signal="judgment", grade=0)
    [w] = h.finish()
    assert (w.queries, w.labelled, w.unlabelled) == (1, 0, 1)
    assert moments(w, "hit_rate@1") == (0, 0.0)


@pytest.mark.parametrize("judgment_first", [True, False])
def test_grade_is_the_maximum_over_events(judgment_first: bool) -> None:
    h = Harness()
    h.q("q1", T0, results=("a", "b", "c"))
    b_events: list[dict[str, Any]] = [{"signal": "judgment", "grade": 3}, {"signal": "click"}]
    for extra in b_events if judgment_first else b_events[::-1]:
        h.fb("q1", T0 + SEC, "b", **extra)
    h.fb("q1", T0 + 2 * SEC, "a")  # grade 1 ...
    h.fb("q1", T0 + 3 * SEC, "a", signal="judgment", grade=0)  # ... not lowered by a 0
    [w] = h.finish()
    expected = dcg([1, 3]) / dcg([3, 1])
    assert close(w, "ndcg@3", 1, expected)
    assert moments(w, "hit_rate@1") == (1, 1.0)


def test_citation_of_an_unretrieved_chunk_lowers_recall() -> None:
    h = Harness()
    h.q("q1", T0, results=("a", "b", "c"))
    h.fb("q1", T0 + SEC, "a", signal="citation")
    h.fb("q1", T0 + SEC, "z", signal="citation")  # relevant, never retrieved: |R| = 2
    [w] = h.finish()
    for k in KS:
        assert moments(w, f"recall@{k}") == (1, 0.5)
        assert moments(w, f"hit_rate@{k}") == (1, 1.0)
    assert close(w, "precision@3", 1, 1 / 3)
    assert close(w, "ndcg@3", 1, dcg([2]) / dcg([2, 2]))


def test_context_precision_uses_context_k() -> None:
    h = Harness()
    h.q("q1", T0, results=("a", "b", "c", "d"), context_k=4)
    h.q("q2", T0, results=("a", "b"))  # no context_k: left out of this one metric
    h.fb("q1", T0 + SEC, "b")
    h.fb("q2", T0 + SEC, "a")
    [w] = h.finish()
    assert (w.queries, w.labelled) == (2, 2)
    assert moments(w, "context_precision") == (1, 0.25)


# -- 12. determinism: streaming equals the offline evaluation of the same events ---------

SIM = SimulationConfig(seed=11, duration_ms=2 * HOUR_MS, queries_per_hour=2000)
SIM_JOIN = JoinConfig(
    attribution_ms=10 * MIN,
    clock_skew_ms=SKEW,
    window_ms=5 * MIN,
    max_out_of_orderness_ms=OOO,
    idle_timeout_ms=IDLE,
)
SIM_CONFIG = PipelineConfig(join=SIM_JOIN, ks=KS)
SIM_NOW = SIM.end_ms + 86_400_000
JITTER_MS = 20_000
ADVANCE_EVERY = 500

Parsed = tuple[SimEvent, QueryEvent | FeedbackEvent]


@pytest.fixture(scope="module")
def traffic() -> list[Parsed]:
    """The simulated events, their arrival order shuffled by up to 20 s of event time."""
    rng = random.Random(20261201)
    jittered = [
        (e.arrival_ms + rng.randrange(JITTER_MS + 1), i, e) for i, e in enumerate(generate(SIM))
    ]
    jittered.sort()
    out: list[Parsed] = []
    for _, _, e in jittered:
        raw = encode(e)
        out.append((e, decode_query(raw) if e.topic == "queries" else decode_feedback(raw)))
    return out


def expected_windows(
    traffic: list[Parsed],
    partition_of: dict[str, int] | None = None,
    attribution_ms: int = SIM_JOIN.attribution_ms,
) -> Any:
    queries = [ev for _, ev in traffic if isinstance(ev, QueryEvent)]
    feedback = [ev for _, ev in traffic if isinstance(ev, FeedbackEvent)]
    return evaluate_event_log(
        queries,
        feedback,
        window_ms=SIM_JOIN.window_ms,
        attribution_ms=attribution_ms,
        clock_skew_ms=SIM_JOIN.clock_skew_ms,
        ks=KS,
        partition_of=partition_of,
    )


def stream(
    records: Iterable[tuple[int, Parsed]],
    partitions: int,
    config: PipelineConfig = SIM_CONFIG,
    sinks: Sequence[WindowSink] = (),
) -> dict[str, ClosedWindow]:
    """Feed (partition, event) records; every key must be published exactly once."""
    p = Pipeline(config, now_ms=lambda: SIM_NOW, sinks=sinks)
    for partition in range(partitions):
        p.assign(partition)
    offsets = Counter[tuple[int, str]]()
    out: dict[str, ClosedWindow] = {}

    def publish(windows: list[ClosedWindow]) -> None:
        for w in windows:
            assert w.key not in out, f"{w.key} published twice"
            out[w.key] = w
        p.deliver(windows)

    for n, (partition, (sim, event)) in enumerate(records, start=1):
        offset = offsets[partition, sim.topic]
        offsets[partition, sim.topic] += 1
        if isinstance(event, QueryEvent):
            assert p.query(partition, offset, event) is None
        else:
            assert p.feedback(partition, offset, event) is None
        if n % ADVANCE_EVERY == 0:
            publish(p.advance())
    publish(p.finish())
    counts = p.counts
    assert (counts.late, counts.unmatched, counts.duplicates) == (Counter(), Counter(), Counter())
    assert counts.evicted == Counter()
    return out


def test_shuffled_traffic_is_out_of_order_but_within_the_bound(traffic: list[Parsed]) -> None:
    """Preconditions of the determinism tests: real disorder, none beyond out-of-orderness."""
    for topic in ("queries", "feedback"):
        times = [sim.timestamp_ms for sim, _ in traffic if sim.topic == topic]
        high, worst = times[0], 0
        for ts in times:
            worst = max(worst, high - ts)
            high = max(high, ts)
        assert 15_000 < worst < OOO
    seen: set[str] = set()
    early = 0
    for sim, _ in traffic:
        if sim.topic == "queries":
            seen.add(sim.key)
        elif sim.key not in seen:
            early += 1
    assert early > 50  # feedback that arrives before its query


def test_stream_equals_offline_evaluation(traffic: list[Parsed]) -> None:
    expected = expected_windows(traffic)
    assert len(expected) > 50
    assert sum(w.labelled for w in expected.values()) > 1000
    # every label source labels some queries (and the equality below covers their counts)
    sources = Counter[str]()
    for w in expected.values():
        sources.update(w.sources)
    assert set(sources) == {"click", "citation", "judgment"}
    assert all(0 < n < sum(w.labelled for w in expected.values()) for n in sources.values())
    got = stream(((0, item) for item in traffic), partitions=1)
    assert sorted(got) == sorted(expected)
    assert got == expected


def test_replay_equals_offline_evaluation(traffic: list[Parsed], tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    assert write_jsonl([sim for sim, _ in traffic], path) == len(traffic)
    got: dict[str, ClosedWindow] = {}

    def collect(windows: list[ClosedWindow]) -> None:
        for w in windows:
            assert w.key not in got
            got[w.key] = w

    monitor, report = replay(
        [str(path)], MonitorConfig(SIM_CONFIG), collect, now_ms=lambda: SIM_NOW, errors_to=None
    )
    assert (report.lines, report.invalid) == (len(traffic), 0)
    assert got == expected_windows(traffic)
    assert monitor.pipeline.counts.late == Counter()


def test_four_partitions_equal_offline_evaluation(traffic: list[Parsed]) -> None:
    partition_of = {sim.key: zlib.crc32(sim.key.encode()) % 4 for sim, _ in traffic}
    per_partition: list[list[Parsed]] = [[] for _ in range(4)]
    for item in traffic:
        per_partition[partition_of[item[0].key]].append(item)

    def interleaved(block: int = 97) -> Iterable[tuple[int, Parsed]]:
        """Each partition in its own order, the partitions taken in turns of ``block``."""
        for start in range(0, max(map(len, per_partition)), block):
            for partition, items in enumerate(per_partition):
                for item in items[start : start + block]:
                    yield partition, item

    got = stream(interleaved(), partitions=4)
    assert {w.partition for w in got.values()} == {0, 1, 2, 3}
    assert got == expected_windows(traffic, partition_of)


@settings(max_examples=150, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["query", "feedback", "advance", "revoke", "assign", "late"]),
            st.integers(0, 2),  # partition
            st.integers(0, 3),  # query number (among the queries of 8 steps)
            st.integers(-120, 120),  # event time, seconds around the step's (a minute a step)
        ),
        min_size=60,
        max_size=120,
    )
)
def test_the_totals_of_pending_state_are_kept_exactly(
    steps: list[tuple[str, int, int, int]],
) -> None:
    """Pending queries and waiting feedback over all partitions are counted as they change
    (not summed per record): after any mix of records, closes, evictions at small caps,
    late records, revocations and re-assignments they equal the sums over partitions."""
    p = Pipeline(
        PipelineConfig(join=JOIN, ks=KS, max_pending_queries=12, max_pending_feedback=9),
        now_ms=Clock(NOW),
    )
    offsets: dict[tuple[int, int], int] = {}
    for partition in range(3):
        p.assign(partition)
    for i, (kind, partition, n, jitter) in enumerate(steps):
        ts = T0 + (60 * i + jitter) * SEC
        if kind in ("assign", "revoke"):
            getattr(p, kind)(partition)
            continue
        if partition not in p.streams:
            p.assign(partition)
        topic = QUERIES if kind == "query" else FEEDBACK
        offset = offsets.setdefault((partition, topic), 0)
        offsets[partition, topic] += 1
        if kind == "query":
            p.query(partition, offset, query_event(f"q{i // 8}-{n}", ts))
        elif kind == "feedback":
            p.feedback(partition, offset, feedback_event(f"q{i // 8}-{n}", ts, "b"))
        elif kind == "late":
            p.feedback(partition, offset, feedback_event(f"q{n}", ts - 3 * ATTR, "a"))
        else:
            p.deliver(p.advance())
        assert p.pending_queries == sum(len(s.pending) for s in p.streams.values())
        assert p.pending_feedback == sum(s.n_orphans for s in p.streams.values())
        assert p.pending_queries <= 12
        assert p.pending_feedback <= 9


# -- 13. early windows: the same evaluation with only the labels within their age -----------

EARLY_CONFIG = PipelineConfig(join=replace(SIM_JOIN, early_ms=2 * MIN), ks=KS)


class EarlySink:
    """Keeps the early windows a local pipeline gives its sinks, each key once."""

    def __init__(self) -> None:
        self.early: dict[str, ClosedWindow] = {}
        self.through_ms: list[int] = []

    def add(self, windows: Sequence[ClosedWindow]) -> None:
        for w in windows:  # a window's early aggregate came before it closed
            assert w.key in self.early

    def add_early(self, windows: Sequence[ClosedWindow]) -> None:
        for w in windows:
            assert w.key not in self.early, f"{w.key}: an early window made twice"
            assert w.label_age_ms == 2 * MIN
            self.early[w.key] = replace(w, label_age_ms=None)

    def advance(self, closed_through_ms: int) -> None:
        self.through_ms.append(closed_through_ms)


def test_early_windows_equal_the_offline_evaluation_with_labels_within_their_age(
    traffic: list[Parsed],
) -> None:
    """Each window's early aggregate, made once the watermark passed its end plus the label
    age, equals the offline evaluation of the same events whose attribution window is that
    age: every query of the window, only the labels that came within 2 minutes of it."""
    partition_of = {sim.key: zlib.crc32(sim.key.encode()) % 2 for sim, _ in traffic}
    sink = EarlySink()
    records = ((partition_of[item[0].key], item) for item in traffic)
    finals = stream(records, partitions=2, config=EARLY_CONFIG, sinks=[sink])
    at_age = expected_windows(traffic, partition_of, attribution_ms=2 * MIN)
    assert sink.early == at_age
    assert finals == expected_windows(traffic, partition_of)
    # the age matters: some labels came later than 2 minutes, none of the queries did
    assert sum(w.labelled for w in at_age.values()) < sum(w.labelled for w in finals.values())
    assert [w.queries for w in at_age.values()] == [finals[k].queries for k in at_age]
    # the detector's boundary is the early windows' (watermark minus the age, in windows)
    assert sink.through_ms == sorted(sink.through_ms)
    assert sink.through_ms[-1] >= max(w.end_ms for w in at_age.values())


def test_a_window_whose_early_aggregate_was_published_gets_none_after_a_restart() -> None:
    """The ``early`` marker of a commit: a partition taken over re-reads the windows still
    open at its commit, and makes no early window again for those at or before it."""
    early = replace(JOIN, early_ms=2 * MIN)
    sink = EarlySink()
    p = Pipeline(PipelineConfig(join=early, ks=KS), now_ms=lambda: NOW, sinks=[sink])
    events = [query_event("q1", T0 + SEC), feedback_event("q1", T0 + 30 * SEC, "a")]
    events += [query_event("q2", T0 + WINDOW + SEC), query_event("f", T0 + 4 * MIN)]
    events += [feedback_event("f", T0 + 4 * MIN, "a")]

    def feed(stream_from: int) -> None:
        offsets = [0, 0]
        for event in events:
            topic = QUERIES if isinstance(event, QueryEvent) else FEEDBACK
            if offsets[topic] >= stream_from:
                take = p.query if topic == QUERIES else p.feedback
                assert take(0, offsets[topic], event) is None  # type: ignore[operator, arg-type]
            offsets[topic] += 1
        p.deliver(p.advance())

    p.assign(0)
    feed(0)
    # the watermark (4 min - 1 min) passed the first window's end plus 2 minutes only
    assert [w.start_ms for w in sink.early.values()] == [T0]
    assert sink.early[next(iter(sink.early))].labelled == 1
    _, metadata = p.commit_plans({})[0][FEEDBACK]
    assert '"early":' in metadata
    restart = restart_from(metadata, metadata)
    assert restart.early_through_ms == T0 + WINDOW
    sink.early.clear()
    p.take_over(0, restart)
    feed(0)  # the re-read of everything still open at the commit
    assert sink.early == {}  # the first window's was published: not made again
