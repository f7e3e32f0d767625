"""The consumer loop's handling of one fetched topic partition: records that do not decode
are counted as met, the valid ones are taken as one batch, and every dead letter is
written in offset order (a re-read record's not again)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from kafka.structs import TopicPartition

from service.broker.consumer import KafkaEdge
from service.stream.pipeline import Pipeline, PipelineConfig
from service.stream.topics import QUERIES

NOW_S = 1_796_083_200


@dataclass(frozen=True)
class FetchedRecord:
    topic: str
    partition: int
    offset: int
    value: bytes | None


def _query(query_id: str, timestamp: object) -> bytes:
    event = {"query_id": query_id, "timestamp": timestamp, "retriever": "v", "results": ["a"]}
    return json.dumps(event).encode()


def _edge(pipeline: Pipeline, sent: list[tuple[int, str]]) -> Any:
    edge: Any = KafkaEdge.__new__(KafkaEdge)  # (no broker: only what _process uses)
    edge.pipeline = pipeline
    edge.topics = ("queries", "feedback")
    edge.mapper = None
    edge.state = SimpleNamespace(health=SimpleNamespace(deadletters=0))
    edge.commits = SimpleNamespace(dead_letter=lambda r, e: sent.append((r.offset, e.reason)))
    return edge


def test_dead_letters_go_in_offset_order_and_re_read_ones_not_again() -> None:
    pipeline = Pipeline(PipelineConfig(), now_ms=lambda: NOW_S * 1000)
    pipeline.assign(0, counted_from=(2, 0))  # offsets 0 and 1 were handled by an earlier owner
    values = [
        _query("ok-0", NOW_S),
        b"not json",  # re-read: counted and dead-lettered before
        _query("future", NOW_S + 86_400),  # refused by the guard, found when taken
        None,  # a tombstone
        _query("ok-4", NOW_S),
        _query("naive", "2026-12-01T00:00:00"),
        _query("ok-6", NOW_S),
    ]
    records = [FetchedRecord("queries", 0, offset, v) for offset, v in enumerate(values)]
    sent: list[tuple[int, str]] = []
    edge = _edge(pipeline, sent)
    edge._process(TopicPartition("queries", 0), records)
    assert sent == [(2, "future_timestamp"), (3, "empty"), (5, "naive_timestamp")]
    assert edge.state.health.deadletters == 3
    counts = pipeline.counts
    assert counts.events[QUERIES] == 5  # offsets 2 to 6
    assert counts.invalid[QUERIES, "future_timestamp"] == 1
    assert counts.invalid[QUERIES, "empty"] == 1
    assert counts.invalid[QUERIES, "invalid_json"] == 0  # (re-read)
    assert sorted(pipeline.streams[0].pending) == [b"ok-0", b"ok-4", b"ok-6"]
    assert pipeline.streams[0].next_offset[QUERIES] == 7
