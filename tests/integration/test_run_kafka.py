"""``retrieval-monitor run`` against the real broker equals the offline evaluation, exactly."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from kafka.admin import KafkaAdminClient

from service.metrics.aggregates import SCALE, merge
from service.stream.events import feedback_from, query_from
from service.stream.reference import evaluate_event_log
from tests.integration.kafka_helpers import (
    FAST,
    ServiceProcess,
    Topics,
    expected_windows,
    produce,
    published_windows,
    read_all,
    run_to_the_end,
    serve_until_final,
    total,
    traffic,
    wait_all_final,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_run_equals_offline_evaluation(topics: Topics, tmp_path: Path) -> None:
    events = traffic(seed=21)
    expected = expected_windows(events)
    n_queries = sum(1 for e in events if e.topic == "queries")
    poison = [
        (topics.queries, b"\x00garbage"),
        (topics.queries, b'{"query_id": "p1", "timestamp": 1, "retriever": "v"}'),
        (topics.feedback, b'{"query_id": "p2", "timestamp": "2026-12-01T00:00:00", '
         b'"chunk_id": "c", "signal": "click"}'),
    ]  # fmt: skip
    produce(topics, events[: len(events) // 2], raw=poison)
    produce(topics, events[len(events) // 2 :])

    samples = serve_until_final(topics, tmp_path, n_queries)

    published, versions = published_windows(topics)
    assert set(published) == set(expected)
    assert all(len(v) == 1 for v in versions.values()), "a key carried two different records"
    for key, window in expected.items():
        assert published[key] == window, key

    # /metrics summaries, per retriever: _count and _sum equal the offline aggregates
    for retriever in ("hybrid-v7", "hybrid-v8"):
        merged = merge(w.metrics for w in expected.values() if w.retriever == retriever)
        for key, (name, k) in {
            "hit_rate@5": ("retrieval_hit", "5"),
            "recall@10": ("retrieval_recall", "10"),
            "ndcg@20": ("retrieval_ndcg", "20"),
            "precision@1": ("retrieval_precision", "1"),
        }.items():
            count = total(samples, f"{name}_count", retriever=retriever, k=k)
            value = total(samples, f"{name}_sum", retriever=retriever, k=k)
            assert count == merged[key].count > 0
            assert value == pytest.approx(merged[key].sum_fx / SCALE, rel=1e-12, abs=1e-12)
        rr = merged["mrr"]
        assert total(samples, "retrieval_reciprocal_rank_count", retriever=retriever) == rr.count
        assert total(
            samples, "retrieval_reciprocal_rank_sum", retriever=retriever
        ) == pytest.approx(rr.sum_fx / SCALE, rel=1e-12)
    assert total(samples, "retrieval_queries_total") == n_queries
    assert total(samples, "retrieval_late_events_total") == 0
    # bad records: counted by reason, dead-lettered with the reason and their source
    assert total(samples, "retrieval_invalid_events_total", reason="invalid_json") == 1
    assert total(samples, "retrieval_invalid_events_total", reason="missing_results") == 1
    assert total(samples, "retrieval_invalid_events_total", reason="naive_timestamp") == 1
    dead = read_all(topics.deadletter)
    assert sorted(r.value for r in dead) == sorted(v for _, v in poison)
    for record in dead:
        headers = {k: v.decode() for k, v in record.headers}
        assert headers["source_topic"] in (topics.queries, topics.feedback)
        assert headers["source_partition"] == "0"
        assert int(headers["source_offset"]) >= 0
        assert headers["reason"] in {"invalid_json", "missing_results", "naive_timestamp"}
        assert headers["error"]


@pytest.mark.parametrize("exactly_once", ["true", "false"])
def test_sigterm_and_restart_mid_stream_is_exact(
    topics: Topics, tmp_path: Path, exactly_once: str
) -> None:
    """Both publishing modes: a clean stop commits the marker with the offsets."""
    events = traffic(seed=22)
    expected = expected_windows(events)
    n_queries = sum(1 for e in events if e.topic == "queries")
    half = len(events) // 2
    produce(topics, events[:half])

    first = ServiceProcess(topics, tmp_path / "first.log", exactly_once=exactly_once, **FAST)
    first.wait_ready()
    first.wait_progressing(
        lambda: total(first.samples(), "retrieval_windows_published_total") >= 10,
        "some windows published",
    )
    assert first.stop() == 0, first.tail()

    produce(topics, events[half:])
    second = ServiceProcess(topics, tmp_path / "second.log", exactly_once=exactly_once, **FAST)
    run_to_the_end(second, topics, len(expected))

    published, versions = published_windows(topics)
    assert set(published) == set(expected)
    for key, window in expected.items():
        assert published[key] == window, key
    # a clean stop commits the published-through marker: no window is published twice
    duplicates = [key for key, v in versions.items() if len(v) > 1]
    assert duplicates == []
    records = read_all(topics.windows)
    assert len(records) == len(expected), "a window was published more than once"
    assert sum(w.queries for w in published.values()) == n_queries


def test_simulate_to_kafka_then_run(topics: Topics, tmp_path: Path) -> None:
    """The CLI path: `simulate --kafka` keys by query id with Kafka's own partitioner."""
    from kafka.partitioner.default import murmur2

    from service.commands.cli import main

    env = {
        "--kafka-bootstrap-servers": topics.env()["RETRIEVAL_MONITOR_KAFKA_BOOTSTRAP_SERVERS"],
        "--queries-topic": topics.queries,
        "--feedback-topic": topics.feedback,
    }
    args = [x for pair in env.items() for x in pair]
    jsonl = tmp_path / "events.jsonl"
    # the same seed and start give the same events: a JSONL copy is the oracle's input
    start = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 3 * 3600))
    common = ["--start", start, "--hours", "1h", "--deploy-at", "30m", "--seed", "9"]
    common += ["--queries-per-hour", "1800"]
    assert main(["simulate", "--jsonl", str(jsonl), *common]) == 0
    assert main(["simulate", "--kafka", *common, *args]) == 0

    lines = [json.loads(raw) for raw in jsonl.read_text().splitlines()]
    queries = [query_from(x["event"]) for x in lines if x["topic"] == "queries"]
    feedback = [feedback_from(x["event"]) for x in lines if x["topic"] == "feedback"]
    mapping = {q.query_id: (murmur2(q.query_id.encode()) & 0x7FFFFFFF) % 4 for q in queries}
    expected = evaluate_event_log(queries, feedback, partition_of=mapping)

    service = ServiceProcess(topics, tmp_path / "service.log", **FAST)
    try:
        service.wait_ready()
        wait_all_final(service, len(queries))
    finally:
        assert service.stop() == 0, service.tail()
    published, _ = published_windows(topics)
    assert published == expected


def test_kill_9_mid_stream_publishes_each_window_exactly_once(
    topics: Topics, tmp_path: Path
) -> None:
    """Transactions: windows and offsets commit together, so a crash repeats nothing.

    A smoke test: the kill lands at a random moment; the reliability suite injects
    crashes at chosen points (between publishing and committing) deterministically.
    """
    events = traffic(seed=23)
    expected = expected_windows(events)
    produce(topics, events[: len(events) // 2])
    replica = {**FAST, "commit_interval": "300ms", "transactional_id": f"{topics.group}-r0"}
    first = ServiceProcess(topics, tmp_path / "first.log", **replica)
    first.wait_ready()
    first.wait_progressing(
        lambda: total(first.samples(), "retrieval_windows_published_total") >= 10,
        "some windows published",
    )
    first.stop(signal.SIGKILL)
    produce(topics, events[len(events) // 2 :])
    # the same replica identity: the restart fences the crashed producer's transaction
    second = ServiceProcess(topics, tmp_path / "second.log", **replica)
    run_to_the_end(second, topics, len(expected))
    records = read_all(topics.windows)
    keys = [r.key.decode() for r in records]
    assert sorted(keys) == sorted(expected), "a window was lost or published twice"
    published, _ = published_windows(topics)
    assert published == expected


def test_mismatched_partition_counts_refuse_to_start(admin: KafkaAdminClient) -> None:
    import subprocess
    import sys
    import uuid

    from kafka.admin import NewTopic

    suffix = uuid.uuid4().hex[:8]
    queries, feedback = f"mm-{suffix}.queries", f"mm-{suffix}.feedback"
    admin.create_topics([NewTopic(queries, 4, 1), NewTopic(feedback, 2, 1)])
    try:
        result = subprocess.run(
            [sys.executable, "-m", "service", "run", "--queries-topic", queries,
             "--feedback-topic", feedback, "--http-port", "0"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    finally:
        admin.delete_topics([queries, feedback])
    assert result.returncode == 2
    assert "(4 partitions)" in result.stderr
    assert "(2 partitions)" in result.stderr
    assert "same partition count" in result.stderr
