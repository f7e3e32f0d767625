"""``run --input-mapping`` on the real broker: records in three foreign shapes (OpenSearch
UBI 1.3, a nested search log, epoch milliseconds with renamed signals) give the windows
and ``/metrics`` of the offline evaluation of the same events in the contract's shape.
A foreign record missing a mapped field is dead-lettered with a reason naming the path;
records the mapping skips are counted apart, not as events."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from kafka.admin import KafkaAdminClient, NewTopic

from service.commands.cli import main
from service.sim.simulator import write_jsonl
from tests import foreign_shapes as shapes
from tests.integration.kafka_helpers import (
    FAST,
    ServiceProcess,
    Topics,
    check_counts,
    check_windows,
    expected_windows,
    produce,
    read_all,
    total,
    traffic,
    wait_all_final,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SHAPES = {
    "ubi": (shapes.to_ubi, None, b'{"query_id": "bad-1", "timestamp": "2026-12-01T00:00:00Z", '
            b'"query_response_hit_ids": ["a"], "query_attributes": {"experiment": "x"}}'),
    "search-log": (shapes.to_search_log, shapes.SEARCH_LOG_MAPPING,
                   b'{"search": {"request_id": "bad-1", "ts": "2026-12-01T00:00:00Z"}, '
                   b'"response": {"hits": []}}'),
    "epoch-ms": (shapes.to_epoch_ms, shapes.EPOCH_MS_MAPPING,
                 b'{"qid": "bad-1", "ts_ms": 1796083200000, "docs": []}'),
}  # fmt: skip
MISSING = {"ubi": "query_attributes.retriever", "search-log": "search.model_version",
           "epoch-ms": "retriever_version"}  # fmt: skip


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_foreign_records_equal_the_offline_evaluation(
    shape: str, topics: Topics, tmp_path: Path
) -> None:
    convert, mapping_text, bad = SHAPES[shape]
    foreign, same = convert(traffic(seed=31, hours=1.0, queries_per_hour=1800))
    expected = expected_windows(same)
    n_queries = sum(1 for e in same if e.topic == "queries")
    mapping = "ubi"
    if mapping_text is not None:
        path = tmp_path / "mapping.yaml"
        path.write_text(mapping_text)
        mapping = str(path)
    produce(topics, foreign, raw=[(topics.queries, bad)])

    service = ServiceProcess(topics, tmp_path / "service.log", input_mapping=mapping, **FAST)
    try:
        service.wait_ready()
        wait_all_final(service, n_queries)
        samples = service.samples()
    finally:
        service.stop()

    check_windows(topics, expected)
    check_counts([samples], expected)
    assert total(samples, "retrieval_events_total") == len(same) + 1  # + the bad record
    assert total(samples, "retrieval_ignored_records_total") == len(foreign) - len(same)
    assert total(samples, "retrieval_invalid_events_total", reason="missing_retriever") == 1
    [dead] = read_all(topics.deadletter)
    assert dead.value == bad
    headers = dict(dead.headers)
    assert headers["reason"] == b"missing_retriever"
    assert f"nothing at {MISSING[shape]!r}".encode() in headers["error"]


def test_the_mapping_file_is_checked_at_start(topics: Topics, tmp_path: Path) -> None:
    path = tmp_path / "mapping.json"
    path.write_text(json.dumps({"queries": {"results": "hits[x].id"}}))
    service = ServiceProcess(topics, tmp_path / "service.log", input_mapping=str(path), **FAST)
    assert service.process.wait(timeout=60) == 2
    assert "queries.results: path 'hits[x].id'" in service.tail()


def test_check_input_samples_the_topics(topics: Topics) -> None:
    foreign, same = shapes.to_ubi(traffic(seed=32, hours=0.5, queries_per_hour=600))
    bad = SHAPES["ubi"][2]
    produce(topics, foreign, raw=[(topics.queries, bad), (topics.feedback, b"[]")])
    n_queries = sum(1 for e in foreign if e.topic == "queries")
    n_feedback = len(foreign) - n_queries
    command = [sys.executable, "-m", "service", "check-input", "--kafka", "--input-mapping",
               "ubi", "--format", "json", "--sample", "100000"]  # fmt: skip
    done = subprocess.run(
        command, env={**os.environ, **topics.env()}, capture_output=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    queries = report["topics"][topics.queries]
    feedback = report["topics"][topics.feedback]
    assert (queries["read"], queries["mapped"]) == (n_queries + 1, n_queries)
    assert [(p["reason"], p["path"], p["count"]) for p in queries["problems"]] == [
        ("missing_retriever", "query_attributes.retriever", 1)
    ]
    clicks = sum(1 for e in same if e.topic == "feedback")
    assert (feedback["read"], feedback["mapped"]) == (n_feedback + 1, clicks)
    assert feedback["skipped"] == n_feedback - clicks  # impressions
    assert [p["reason"] for p in feedback["problems"]] == ["not_an_object"]
    assert report["feedback_joining_a_query"] == 1.0


def test_the_labels_topic_equals_the_replayed_labels_output(
    topics: Topics, admin: KafkaAdminClient, tmp_path: Path
) -> None:
    foreign, _ = shapes.to_ubi(traffic(seed=33, hours=1.0, queries_per_hour=1200))
    labels_topic = topics.windows + ".labels"
    admin.create_topics([NewTopic(labels_topic, num_partitions=1, replication_factor=1)])
    produce(topics, foreign)
    n_queries = sum(1 for e in foreign if e.topic == "queries")
    service = ServiceProcess(
        topics, tmp_path / "service.log", input_mapping="ubi", labels_topic=labels_topic,
        labels_query_text="true", **FAST,
    )  # fmt: skip
    try:
        service.wait_ready()
        wait_all_final(service, n_queries)
    finally:
        service.stop()
    streamed = {r.key.decode(): json.loads(r.value) for r in read_all(labels_topic)}
    events = tmp_path / "events.jsonl"
    write_jsonl(foreign, events)
    replayed = tmp_path / "labels.jsonl"
    assert main(["replay", str(events), "--input-mapping", "ubi", "--labels-out", str(replayed),
                 "--labels-query-text", "true"]) == 0  # fmt: skip
    expected = [json.loads(line) for line in replayed.open()]
    assert len(expected) > 100
    assert streamed == {r["query_id"]: r for r in expected}
    assert all("query" in r for r in expected)
    admin.delete_topics([labels_topic])
