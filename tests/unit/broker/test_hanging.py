"""A transaction marker the broker skipped: offsets pending for ever, settled by the service.

The fake broker below behaves as Kafka's group coordinator does (``GroupMetadata``): a
transaction's offsets are pending until a marker of its producer id reaches the offsets
partition, and that marker completes every offset pending for the producer id, those
of earlier transactions included. While any is pending, a stable fetch of the partition
is answered ``UNSTABLE_OFFSET_COMMIT`` until it gives up; a plain fetch answers with what
is committed. One commit hangs: its records become visible, its offsets stay pending
(the marker skipped), and the client sees the commit fail (the broker went down).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from functools import partial
from typing import Any

from kafka.errors import KafkaConnectionError, KafkaTimeoutError
from kafka.structs import OffsetAndMetadata, TopicPartition

from service.broker.commits import CommitProtocol
from service.broker.hanging import SETTLE_AFTER_S, HangingOffsets
from service.broker.publisher import TransactionalPublisher
from service.core.monitor import Monitor, MonitorConfig
from service.core.state import ServiceState
from tests.unit.broker.fakes import (
    EARLY_TOPIC,
    TOPIC_NAMES,
    WINDOWS_TOPIC,
    FakeBroker,
    FakeConsumer,
    FakeTransport,
    Record,
)
from tests.unit.broker.test_restart import (
    ADVANCE_EVERY,
    CONFIG,
    N_PARTITIONS,
    NOW,
    Life,
    Outcome,
    assert_counters_match,
    records,  # noqa: F401 (the fixture)
    run,
)

HANGING_COMMIT = 4
FETCH_S = 30.0
"""What each failed stable fetch costs on the injected clock (its 30 s budget)."""


class MarkerBroker(FakeBroker):
    """Offsets of one producer id: committed, or pending until its next marker."""

    def __init__(self) -> None:
        super().__init__()
        self.pending: dict[TopicPartition, OffsetAndMetadata] = {}
        self.stable_fetches_refused = 0
        self.now_s = 0.0
        """The clock: a refused stable fetch waits out its budget (FETCH_S)."""

    def last_committed(self, tps: set[Any], timeout_ms: int) -> Mapping[Any, Any]:
        return {tp: self.offsets.get(tp) for tp in tps}


class MarkerTransport(FakeTransport):
    def commit(self, timeout_ms: int) -> None:
        broker = self.broker
        assert isinstance(broker, MarkerBroker)
        broker.commits += 1
        if broker.commits == HANGING_COMMIT:  # complete for the coordinator, marker skipped
            broker.records.extend(self.pending)
            broker.pending.update(self.pending_offsets)
            self.abort(timeout_ms)
            raise KafkaConnectionError("the broker went away while completing the commit")
        broker.records.extend(self.pending)
        broker.pending.update(self.pending_offsets)  # this transaction's own offsets
        broker.offsets.update(broker.pending)  # the marker completes all of them
        broker.pending.clear()
        self.abort(timeout_ms)


class MarkerConsumer(FakeConsumer):
    def committed(self, tp: Any, metadata: bool, timeout_ms: int) -> OffsetAndMetadata | None:
        broker = self.broker
        assert isinstance(broker, MarkerBroker)
        if tp in broker.pending:
            broker.stable_fetches_refused += 1
            broker.now_s += FETCH_S
            raise KafkaTimeoutError("UNSTABLE_OFFSET_COMMIT until the budget ran out")
        return super().committed(tp, metadata, timeout_ms)


def life_with_hanging_commit(log: list[Record], settle: bool) -> tuple[Life, MarkerBroker]:
    """Process every record; the fourth commit hangs. Returns the life and its broker."""
    broker = MarkerBroker()
    monitor = Monitor(MonitorConfig(CONFIG), now_ms=lambda: NOW)
    state = ServiceState(monitor, lambda: NOW)
    publisher = TransactionalPublisher(
        lambda: MarkerTransport(broker, transactional=True), WINDOWS_TOPIC, "deadletter"
    )
    publisher.early_topic = EARLY_TOPIC
    consumer = MarkerConsumer(broker, log, len(log), N_PARTITIONS)
    hanging = HangingOffsets(broker.last_committed, lambda: broker.now_s) if settle else None
    protocol = CommitProtocol(state, publisher, consumer, TOPIC_NAMES, hanging)
    protocol.take_over(consumer.assignment(), consumer.committed_all())
    life = Life(monitor.pipeline, protocol, consumer)
    while True:
        for _ in range(20):  # loop turns until the partitions are taken over again
            if life.pipeline.streams:
                break
            protocol.rebuild_if_needed()
        else:
            break  # stalled: never taken over
        polled = consumer.poll(ADVANCE_EVERY)
        if not polled:
            break
        protocol.cycle(partial(life.feed, polled), commit=True)
        protocol.rebuild_if_needed()
    return life, broker


def test_the_service_settles_a_skipped_marker_and_stays_exact(
    records: list[Record],  # noqa: F811
) -> None:
    clean = run(records)
    life, broker = life_with_hanging_commit(records, settle=True)
    life.protocol.cycle(life.pipeline.end_of_input, commit=True)
    outcome = Outcome(published=broker.windows(), counts=[life.pipeline.counts])
    assert broker.commits > HANGING_COMMIT + 1
    # refused for longer than a live transaction may last (30, 60, 90, 120 s), then settled
    assert broker.stable_fetches_refused == 4
    assert 3 * FETCH_S <= SETTLE_AFTER_S < 4 * FETCH_S
    assert broker.pending == {}
    assert life.consumer.delivered > len(records)  # re-read from the last settled commit
    assert outcome.conflicts() == {}  # windows of the hanging commit published again, equal
    assert outcome.last_per_key() == clean.last_per_key()
    assert len(outcome.published) > len(clean.published)
    assert_counters_match(outcome, clean)


def test_without_settling_the_rebuild_waits_for_ever(
    records: list[Record],  # noqa: F811
) -> None:
    life, broker = life_with_hanging_commit(records, settle=False)
    assert life.pipeline.streams == {}
    assert broker.pending
    assert broker.commits == HANGING_COMMIT


class Away:
    def __call__(self, tps: set[Any], timeout_ms: int) -> Mapping[Any, Any]:
        raise KafkaTimeoutError("no coordinator")


def test_a_broker_away_is_not_taken_for_a_hanging_marker() -> None:
    hanging = HangingOffsets(Away(), itertools.count(0.0, 60.0).__next__)
    tps = {TopicPartition("queries", 0)}
    for _ in range(5):
        assert hanging.to_settle(tps, KafkaTimeoutError(), 0.0) == {}
    assert hanging.unstable_since is None


def test_settling_waits_out_a_live_transaction_and_restarts_its_clock() -> None:
    """Counted from the start of the first fetch that failed: each fetch waits 30 s."""
    tp = TopicPartition("queries", 0)
    committed = {tp: OffsetAndMetadata(7, "m", 3)}
    now = [0.0]
    hanging = HangingOffsets(lambda tps, ms: committed, lambda: now[0])

    def failed_fetch() -> dict[Any, OffsetAndMetadata]:
        started = hanging.now()
        now[0] += 30.0  # the fetch's budget, then the failure
        found = hanging.to_settle({tp}, KafkaTimeoutError(), started)
        now[0] += 0.2  # a turn of the loop
        return found

    seen = [failed_fetch() for _ in range(3)]
    # unstable for 30, 60.2 and 90.4 s since the first failed fetch began
    assert seen == [{}, {}, {tp: OffsetAndMetadata(7, "m", -1)}]
    hanging.settled()
    assert failed_fetch() == {}  # counted from zero again
    assert hanging.to_settle({tp}, KafkaConnectionError(), hanging.now()) == {}  # not a timeout
    assert hanging.unstable_since is None


def test_no_offsets_are_settled_for_partitions_never_committed() -> None:
    tp = TopicPartition("queries", 0)
    hanging = HangingOffsets(lambda tps, ms: {tp: None}, itertools.count(0.0, 100.0).__next__)
    hanging.to_settle({tp}, KafkaTimeoutError(), hanging.now())
    assert hanging.to_settle({tp}, KafkaTimeoutError(), hanging.now()) == {}
