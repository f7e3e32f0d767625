"""The compact layout of a pending query (issue 16): one bytes value per query, and the
rare values that do not fit its 32-bit fields (context_k, offsets) still exact."""

from __future__ import annotations

from service.stream.join_state import JoinConfig
from service.stream.pipeline import Pipeline, PipelineConfig
from service.stream.reference import evaluate_event_log
from tests.unit.stream.test_join import NOW, T0, feedback_event, query_event

MIN = 60_000
JOIN = JoinConfig(attribution_ms=10 * MIN, clock_skew_ms=5_000, window_ms=MIN, idle_timeout_ms=None)
KS = (1, 3, 5)


def test_a_pending_query_is_205_bytes_with_20_results_and_its_id_as_bytes() -> None:
    p = Pipeline(PipelineConfig(join=JOIN, ks=KS), now_ms=lambda: NOW)
    p.assign(0)
    results = [f"doc-{i}#1" for i in range(20)]
    assert p.query(0, 0, query_event("q-0123456789", T0, results=results, context_k=5)) is None
    ((key, packed),) = p.streams[0].pending.items()
    assert key == b"q-0123456789"
    assert len(packed) == 12 + 20 * 8  # (a bytes object of 205, pymalloc's 208 class)


def test_a_context_k_beyond_32_bits_is_exact() -> None:
    wide = 2**40 + 7
    queries = [
        query_event("wide", T0 + 1_000, results=["a", "b", "c"], context_k=wide),
        query_event("edge", T0 + 2_000, results=["a", "b"], context_k=2**31 - 1),
        query_event("small", T0 + 3_000, results=["a", "b", "c"], context_k=2),
        query_event("none", T0 + 4_000, results=["b", "a"]),
    ]
    feedback = [
        feedback_event(q, T0 + 10_000, "a", signal="citation")
        for q in ("wide", "edge", "small", "none")
    ]
    p = Pipeline(PipelineConfig(join=JOIN, ks=KS), now_ms=lambda: NOW)
    p.assign(0)
    for offset, event in enumerate(queries):
        assert p.query(0, offset, event) is None
    for offset, event in enumerate(feedback):
        assert p.feedback(0, offset, event) is None
    assert p.streams[0].wide_context_k == {b"wide": wide}
    windows = p.finish()
    assert not p.streams[0].wide_context_k  # (finalised with its query)
    expected = evaluate_event_log(
        queries,
        feedback,
        window_ms=JOIN.window_ms,
        attribution_ms=JOIN.attribution_ms,
        clock_skew_ms=JOIN.clock_skew_ms,
        ks=KS,
    )
    assert {w.key: w for w in windows} == expected
    (window,) = windows
    # one relevant chunk in the first context_k results of each: 1/wide + 1/(2^31-1) + 1/2
    assert window.metrics["context_precision"].count == 3
    assert window.metrics["context_precision"].mean == (1 / wide + 1 / (2**31 - 1) + 0.5) / 3


def test_offsets_beyond_32_bits_from_the_window_s_first_are_kept_exactly() -> None:
    # three queries of one window, the second 2^32 + 3 records after the first: the
    # window's offsets widen to 64 bits; eviction and the commit position read them back
    first, far = 7, 7 + 2**32 + 3
    p = Pipeline(PipelineConfig(join=JOIN, ks=KS, max_pending_queries=2), now_ms=lambda: NOW)
    p.assign(0)
    for offset, query_id in ((first, "q1"), (far, "q2"), (far + 1, "q3")):
        assert p.query(0, offset, query_event(query_id, T0 + offset % 1000)) is None
    stream = p.streams[0]
    assert set(stream.pending) == {b"q2", b"q3"}  # the oldest was evicted by the cap
    assert p.counts.evicted["query"] == 1
    (window,) = stream.windows.values()
    assert window.offsets.typecode == "q"
    assert stream.commit_offsets()[0] == far  # the lowest offset still needed
    assert stream.evict_query() == far
    assert stream.commit_offsets()[0] == far + 1
