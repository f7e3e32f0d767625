"""A transaction left open on the broker blocks the rebuild's committed-offset fetch
(UNSTABLE_OFFSET_COMMIT, retried by kafka-python until the wait ends); the protocol
replaces its producer after ``FENCE_AFTER_S`` with the broker up, which ends it."""

from __future__ import annotations

from typing import Any

import pytest
from kafka.errors import KafkaTimeoutError

from service.broker import commits
from service.broker.commits import FENCE_AFTER_S, CommitProtocol
from service.broker.publisher import TransactionalPublisher
from service.monitor import Monitor, MonitorConfig
from service.state import ServiceState
from tests.unit.broker.fakes import (
    TOPIC_NAMES,
    WINDOWS_TOPIC,
    FakeBroker,
    FakeConsumer,
    FakeTransport,
)

NOW = 1_796_083_200_000


class Clock:
    def __init__(self) -> None:
        self.s = 1000.0

    def monotonic(self) -> float:
        return self.s


class HangingBroker(FakeBroker):
    """Answers the group's committed offsets only once no transaction is left open; a
    new producer of the transactional id (its ``init_transactions``) ends one."""

    open_transaction: bool = True
    inits: int = 0


class BlockedConsumer(FakeConsumer):
    def committed(self, tp: Any, metadata: bool, timeout_ms: int) -> Any:
        if self.broker.open_transaction:  # type: ignore[attr-defined]
            raise KafkaTimeoutError("UNSTABLE_OFFSET_COMMIT until the wait ended")
        return super().committed(tp, metadata, timeout_ms)


def test_a_transaction_left_open_is_ended_by_a_new_producer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock()
    monkeypatch.setattr(commits, "time", clock)
    broker = HangingBroker()

    def connect() -> FakeTransport:
        broker.inits += 1
        if broker.inits > 1:
            broker.open_transaction = False
        return FakeTransport(broker, transactional=True)

    state = ServiceState(Monitor(MonitorConfig(), now_ms=lambda: NOW), lambda: NOW)
    publisher = TransactionalPublisher(connect, WINDOWS_TOPIC, "deadletter")
    consumer = BlockedConsumer(broker, [], 0, partitions=2)
    protocol = CommitProtocol(state, publisher, consumer, TOPIC_NAMES)
    state.broker_seen(True)

    def rebuild_at(seconds: float) -> None:
        clock.s = 1000.0 + seconds
        protocol._rebuild_later()
        protocol.rebuild_if_needed()

    for seconds in (0, 10, FENCE_AFTER_S - 1):
        rebuild_at(seconds)
        assert broker.inits == 1  # still waiting
        assert not state.pipeline.streams
    state.broker_seen(False)  # with the broker away a new producer would wait for it
    rebuild_at(FENCE_AFTER_S + 5)
    assert broker.inits == 1
    state.broker_seen(True)
    rebuild_at(FENCE_AFTER_S + 6)
    assert broker.inits == 2  # replaced: the open transaction is ended
    assert not state.pipeline.streams  # (this rebuild's fetch had already failed)
    rebuild_at(FENCE_AFTER_S + 7)
    assert sorted(state.pipeline.streams) == [0, 1]  # taken over from the commit
    assert protocol._stuck_since is None
