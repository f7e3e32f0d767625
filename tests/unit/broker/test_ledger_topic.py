"""The regressions topic's edge: read whole into a ledger at start (records that are not
ledger records skipped), written in order with what failed written again next time."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
from kafka import TopicPartition
from kafka.errors import KafkaError, KafkaTimeoutError

from service.broker import compat
from service.broker import ledger as edge
from service.detect.ledger import THROUGH_KEY

TOPIC = "retrieval.regressions"


@dataclass
class Record:
    key: bytes | None
    value: bytes | None
    offset: int
    partition: int = 0


def _value(boundary: int, **more: Any) -> bytes:
    return json.dumps({"boundary_ms": boundary, **more}).encode()


class FakeConsumer:
    """A topic of one partition, polled two records at a time."""

    records: ClassVar[list[Record]] = []

    def __init__(self, **_: Any) -> None:
        self._at = 0
        self.closed = False

    def assign(self, tps: list[TopicPartition]) -> None:
        assert tps == [TopicPartition(TOPIC, 0)]

    def seek_to_beginning(self, *tps: TopicPartition) -> None:
        self._at = 0

    def end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return dict.fromkeys(tps, len(self.records))

    def position(self, tp: TopicPartition) -> int:
        return self._at

    def poll(self, timeout_ms: int) -> dict[TopicPartition, list[Record]]:
        batch = self.records[self._at : self._at + 2]
        self._at += len(batch)
        return {TopicPartition(TOPIC, 0): batch} if batch else {}

    def close(self) -> None:
        self.closed = True


def test_the_ledger_is_read_to_its_end_and_bad_records_are_skipped(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    FakeConsumer.records = [
        Record(b"a|open", _value(10, order=0), 0),
        Record(b"a|look", _value(20), 1),
        Record(b"b|open", b"not json", 2),
        Record(b"a|look", None, 3),  # a tombstone deletes its key
        Record(THROUGH_KEY.encode(), _value(30), 4),
    ]
    monkeypatch.setattr(edge, "KafkaConsumer", FakeConsumer)
    monkeypatch.setattr(compat, "partitions_for_topic", lambda *_: {0})
    with caplog.at_level(logging.WARNING, logger="retrieval_monitor.ledger"):
        ledger = edge.read_ledger({}, TOPIC)
    assert set(ledger.values) == {"a|open", THROUGH_KEY}
    assert ledger.through_ms == 30
    assert ledger.bad_records == 1
    assert "partition 0, offset 2" in caplog.text


def test_a_missing_topic_is_an_empty_ledger(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(edge, "KafkaConsumer", FakeConsumer)
    monkeypatch.setattr(compat, "partitions_for_topic", lambda *_: set())
    ledger = edge.read_ledger({}, TOPIC)
    assert ledger.values == {}
    assert ledger.through_ms is None


class Future:
    def __init__(self, error: KafkaError | None) -> None:
        self.error = error

    def get(self, timeout: float) -> None:
        if self.error is not None:
            raise self.error


class FakeProducer:
    """Takes every record sent; the ones named in ``fail`` fail once."""

    def __init__(self, **config: Any) -> None:
        assert config["acks"] == "all"
        assert config["enable_idempotence"] is True
        self.sent: list[tuple[str, bytes, bytes | None]] = []
        self.fail: set[bytes] = set()

    def send(self, topic: str, key: bytes, value: bytes | None) -> Future:
        if key in self.fail:
            self.fail.discard(key)
            return Future(KafkaTimeoutError("no answer"))
        self.sent.append((topic, key, value))
        return Future(None)

    def flush(self, timeout: float) -> None:
        pass

    def close(self, timeout: float) -> None:
        pass


def test_a_failed_write_is_logged_and_written_again_in_order(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(edge, "KafkaProducer", FakeProducer)
    writer = edge.LedgerWriter({}, TOPIC)
    producer = writer._producer
    assert isinstance(producer, FakeProducer)
    producer.fail = {b"b|closed"}
    with caplog.at_level(logging.WARNING, logger="retrieval_monitor.ledger"):
        assert not writer.write([("a|open", b"1"), ("b|closed", b"2")])
    assert "writing 2 records" in caplog.text
    assert writer.unsent == [("a|open", b"1"), ("b|closed", b"2")]
    assert writer.write([("c|look", None)])
    assert writer.unsent == []
    assert writer.failures == 1
    # everything reached the topic, in order, after the first try's duplicate
    assert [key for _, key, _ in producer.sent] == [b"a|open", b"a|open", b"b|closed", b"c|look"]
    assert producer.sent[-1] == (TOPIC, b"c|look", None)  # a tombstone
    assert writer.write([])  # nothing to write
