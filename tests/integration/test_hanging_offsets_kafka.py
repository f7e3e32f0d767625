"""Offsets committed in a transaction without its marker, on the real broker.

While a transaction that committed offsets of the group has no marker on the offsets
partition, a ``read_committed`` consumer's fetch of them (``require_stable``) is answered
``UNSTABLE_OFFSET_COMMIT`` until it gives up; :func:`service.broker.compat.last_committed`
asks without ``require_stable`` and gets the offsets last committed, which is what the
service commits again to settle a transaction whose marker the broker skipped
(:mod:`service.broker.hanging`). An open transaction stands in for the hanging one here:
the broker cannot be made to skip a marker on purpose.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaTimeoutError
from kafka.structs import OffsetAndMetadata

from service.broker.compat import last_committed
from tests.integration.kafka_helpers import BOOTSTRAP, Topics

pytestmark = pytest.mark.integration


def transactional(name: str) -> KafkaProducer:
    producer = KafkaProducer(bootstrap_servers=BOOTSTRAP, transactional_id=name)
    producer.init_transactions()
    return producer


def commit_offsets(producer: KafkaProducer, offsets: dict, group: str) -> None:
    producer.begin_transaction()
    producer.send_offsets_to_transaction(offsets, group)
    producer.commit_transaction()


@pytest.fixture
def consumer(topics: Topics) -> Iterator[KafkaConsumer]:
    consumer = KafkaConsumer(
        bootstrap_servers=BOOTSTRAP,
        group_id=topics.group,
        isolation_level="read_committed",
        enable_auto_commit=False,
    )
    yield consumer
    consumer.close(autocommit=False)


def test_pending_offsets_block_the_stable_fetch_and_not_the_last_committed(
    topics: Topics, consumer: KafkaConsumer
) -> None:
    tps = [TopicPartition(topics.queries, p) for p in (0, 1)]
    first = transactional(f"{topics.group}-first")
    commit_offsets(first, {tps[0]: OffsetAndMetadata(5, "five", -1)}, topics.group)
    # the commit is answered before its markers are written: the stable fetch waits for them
    assert consumer.committed(tps[0], metadata=True, timeout_ms=10_000).offset == 5
    assert last_committed(consumer, set(tps), 5_000) == {tps[0]: OffsetAndMetadata(5, "five", -1)}

    second = transactional(f"{topics.group}-second")
    second.begin_transaction()
    pending = {tp: OffsetAndMetadata(9, "nine", -1) for tp in tps}
    second.send_offsets_to_transaction(pending, topics.group)  # no marker yet
    with pytest.raises(KafkaTimeoutError):  # UNSTABLE_OFFSET_COMMIT until it gives up
        consumer.committed(tps[0], metadata=True, timeout_ms=3_000)
    found = last_committed(consumer, set(tps), 5_000)
    assert {tp: (m.offset, m.metadata) for tp, m in found.items()} == {tps[0]: (5, "five")}

    second.commit_transaction()  # the marker: the pending offsets become the committed ones
    stable = consumer.committed(tps[0], metadata=True, timeout_ms=10_000)
    assert (stable.offset, stable.metadata) == (9, "nine")
    found = last_committed(consumer, set(tps), 5_000)
    expected = dict.fromkeys(tps, (9, "nine"))
    assert {tp: (m.offset, m.metadata) for tp, m in found.items()} == expected
    for producer in (first, second):
        producer.close()
