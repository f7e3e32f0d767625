"""Bad input is data: poison records, duplicates and label floods against the real broker.

Reliability properties 5 (every record delivered twice), 8 (timestamp guard), 12
(poison pills) and 15 (cardinality cap). The oracle is the same as for a clean run: the
windows on the windows topic equal the offline evaluation of the good events, and no
key ever carries two different records.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from service.sim.simulator import SimEvent
from tests.integration.kafka_helpers import (
    FAST,
    ServiceProcess,
    Topics,
    expected_windows,
    produce,
    published_windows,
    read_all,
    report_figures,
    serve_until_final,
    total,
    traffic,
)

pytestmark = [pytest.mark.integration, pytest.mark.faults, pytest.mark.slow]

NOW_S = int(time.time())


def _q(query_id: str = "q", ts: object = NOW_S, **fields: object) -> bytes:
    return json.dumps({"query_id": query_id, "timestamp": ts, "retriever": "v", **fields}).encode()


def _f(query_id: str, signal: str, **fields: object) -> bytes:
    body = {"query_id": query_id, "timestamp": NOW_S, "chunk_id": "c", "signal": signal}
    return json.dumps({**body, **fields}).encode()


POISON: list[tuple[str, bytes, str]] = [
    # (topic kind, value, expected reason)
    ("queries", b"\xff\xfe\x00 not json at all", "invalid_json"),
    ("queries", b'{"query_id": "t1", "timestamp": 17960', "invalid_json"),
    ("queries", b"[1, 2, 3]", "not_an_object"),
    ("queries", _q("w1", results="x"), "invalid_results"),
    ("queries", _q("q" * 201, results=[]), "invalid_query_id"),
    ("queries", _q("l1", results=["c"] * 1001), "invalid_results"),
    ("queries", _q("x" * 900_000, results=[]), "invalid_query_id"),  # 900 kB
    ("queries", _q("n1", "2026-12-01T00:00:00", results=[]), "naive_timestamp"),
    ("queries", _q("f1", NOW_S + 366 * 86_400, results=["c"]), "future_timestamp"),
    ("feedback", _f("u1", "like"), "unknown_signal"),
    ("feedback", _f("j1", "judgment"), "judgment_without_grade"),
    ("feedback", _f("i1", "click").replace(b'"i1"', b"7"), "invalid_query_id"),
]


def test_poison_records_are_dead_lettered_and_good_ones_processed(
    topics: Topics, tmp_path: Path
) -> None:
    events = traffic(seed=31)
    expected = expected_windows(events)
    n_queries = sum(1 for e in events if e.topic == "queries")
    topic = {"queries": topics.queries, "feedback": topics.feedback}
    raw = [(topic[kind], value) for kind, value, _ in POISON]
    third = len(events) // 3  # bad records between good ones, on every side
    produce(topics, events[:third], raw=raw[:6])
    produce(topics, events[third : 2 * third], raw=raw[6:])
    produce(topics, events[2 * third :])

    samples = serve_until_final(topics, tmp_path, n_queries)

    published, versions = published_windows(topics)
    assert published == expected  # every good record counted, nothing else
    assert all(len(v) == 1 for v in versions.values())
    poisoned = f"{len(POISON)} bad records"
    report_figures("poison pills", poisoned, len(events) + len(POISON), topics, expected)
    reasons: dict[str, int] = {}
    for _, _, reason in POISON:
        reasons[reason] = reasons.get(reason, 0) + 1
    for reason, n in reasons.items():
        assert total(samples, "retrieval_invalid_events_total", reason=reason) == n, reason
    assert total(samples, "retrieval_invalid_events_total") == len(POISON)
    assert total(samples, "retrieval_deadletter_records_total") == len(POISON)
    # the year-ahead record did not drag the watermark along
    assert total(samples, "retrieval_watermark_timestamp_seconds") <= time.time() + 1
    dead = read_all(topics.deadletter)
    assert len(dead) == len(POISON)
    by_reason: dict[str, int] = {}
    for record in dead:
        headers = {k: v.decode() for k, v in record.headers}
        by_reason[headers["reason"]] = by_reason.get(headers["reason"], 0) + 1
        assert headers["source_topic"] in topic.values()
        assert int(headers["source_offset"]) >= 0
        assert headers["error"]
        if "truncated_from" in headers:  # the 900 kB record, cut below the broker limit
            assert int(headers["truncated_from"]) > len(record.value) > 0
    assert by_reason == reasons
    assert sum(1 for r in dead for k, _ in r.headers if k == "truncated_from") == 1


def test_every_record_delivered_twice_changes_nothing(topics: Topics, tmp_path: Path) -> None:
    events = traffic(seed=32)
    expected = expected_windows(events)
    n_queries = sum(1 for e in events if e.topic == "queries")
    twice: list[SimEvent] = [e for event in events for e in (event, event)]
    produce(topics, twice)

    samples = serve_until_final(topics, tmp_path, n_queries)

    published, versions = published_windows(topics)
    assert published == expected
    assert all(len(v) == 1 for v in versions.values())
    report_figures("delivered twice", "every record twice", len(twice), topics, expected)
    assert total(samples, "retrieval_duplicate_events_total", topic=topics.queries) == n_queries
    assert total(samples, "retrieval_queries_total") == n_queries
    assert total(samples, "retrieval_invalid_events_total") == 0


def test_a_flood_of_retriever_labels_is_capped(topics: Topics, tmp_path: Path) -> None:
    now = time.time()
    flood = [
        (
            topics.queries,
            json.dumps(
                {"query_id": f"fl{i}", "timestamp": now - 600, "retriever": f"r{i}", "results": []}
            ).encode(),
        )
        for i in range(300)
    ]
    produce(topics, [], raw=flood)
    service = ServiceProcess(topics, tmp_path / "service.log", **FAST)
    try:
        service.wait_ready()
        service.wait_progressing(
            lambda: total(service.samples(), "retrieval_queries_total") == 300, "300 queries"
        )
        samples = service.samples()
    finally:
        assert service.stop() == 0, service.tail()
    retrievers = {
        dict(labels)["retriever"] for (name, labels) in samples if name == "retrieval_queries_total"
    }
    assert len(retrievers) == 51  # the first 50, then everything else as "other"
    assert "other" in retrievers
    assert total(samples, "retrieval_queries_total", retriever="other") == 250
    assert total(samples, "retrieval_label_overflow_total", label="retriever") == 250
