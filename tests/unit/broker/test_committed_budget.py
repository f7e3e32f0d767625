"""Fetching the committed offsets of every assigned partition shares one time budget, so
a rebuild with the broker away waits COMMITTED_WAIT_MS in all, not that per partition."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest
from kafka.errors import KafkaTimeoutError
from kafka.structs import OffsetAndMetadata, TopicPartition

from service.broker import commits
from service.broker.commits import CommitProtocol


class SlowConsumer:
    """Each fetch takes 40 ms (a coordinator that answers slowly)."""

    def __init__(self) -> None:
        self.timeouts: list[int] = []

    def committed(self, tp: Any, metadata: bool, timeout_ms: int) -> OffsetAndMetadata:
        self.timeouts.append(timeout_ms)
        time.sleep(0.04)
        return OffsetAndMetadata(tp.partition, "", -1)


def test_the_fetches_of_all_partitions_share_one_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(commits, "COMMITTED_WAIT_MS", 100)
    consumer = SlowConsumer()
    protocol = SimpleNamespace(consumer=consumer)
    tps = [TopicPartition("q", p) for p in range(8)]
    with pytest.raises(KafkaTimeoutError):
        CommitProtocol._committed(protocol, tps)  # type: ignore[arg-type]
    assert 2 <= len(consumer.timeouts) <= 3  # not all eight: the budget ran out
    assert consumer.timeouts[0] <= 100
    assert consumer.timeouts[1] <= 100 - 40  # each fetch gets what is left


def test_within_the_budget_every_partition_is_fetched(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(commits, "COMMITTED_WAIT_MS", 5_000)
    consumer = SlowConsumer()
    tps = [TopicPartition("q", p) for p in range(3)]
    out = CommitProtocol._committed(SimpleNamespace(consumer=consumer), tps)  # type: ignore[arg-type]
    assert {tp: m.offset for tp, m in out.items()} == {tp: tp.partition for tp in tps}
