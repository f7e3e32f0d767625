"""A seek back to the commit forgets the stale high watermark (real broker).

kafka-python keeps the high watermark of its last fetch answer across a seek. When a
rebuild seeks a partition back to its committed offset and that offset equals the stale
figure (the partition had been read to its end when it was committed), while records
were written since, the lag reads 0 before anything is fetched again: the partition
would count as caught up and go idle, and windows could close without the feedback
still to be read. :func:`service.broker.compat.seek_afresh` makes the lag unknown until
a fetch answers; the take-over seeks with it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from service.broker.compat import seek_afresh
from tests.integration.kafka_helpers import BOOTSTRAP, Topics

pytestmark = pytest.mark.integration


@pytest.fixture
def consumer() -> Iterator[KafkaConsumer]:
    consumer = KafkaConsumer(bootstrap_servers=BOOTSTRAP, enable_auto_commit=False)
    yield consumer
    consumer.close(autocommit=False)


def read_to_the_end(consumer: KafkaConsumer, tp: TopicPartition, end: int) -> None:
    deadline = time.monotonic() + 30
    while consumer.position(tp) < end or consumer.highwater(tp) is None:
        assert time.monotonic() < deadline, "the partition was not read to its end"
        consumer.poll(timeout_ms=200)


def produce(tp: TopicPartition, n: int) -> None:
    producer = KafkaProducer(bootstrap_servers=BOOTSTRAP)
    for i in range(n):
        producer.send(tp.topic, value=b"%d" % i, partition=tp.partition)
    producer.flush()
    producer.close()


def test_a_seek_keeps_the_stale_high_watermark_and_seek_afresh_forgets_it(
    topics: Topics, consumer: KafkaConsumer
) -> None:
    tp = TopicPartition(topics.feedback, 0)
    produce(tp, 10)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    read_to_the_end(consumer, tp, 10)
    committed = consumer.position(tp)  # committed when read to the end
    produce(tp, 5)  # the log grows while the service is away

    consumer.seek(tp, committed)  # a plain seek, as the take-over made
    stale_lag = consumer.highwater(tp) - consumer.position(tp)
    assert stale_lag == 0  # the hazard: 5 records unread, and the lag says none

    seek_afresh(consumer, tp, committed)
    assert consumer.highwater(tp) is None  # unknown: the partition is behind until fetched
    assert consumer.position(tp) == committed
    read_to_the_end(consumer, tp, 15)
    assert consumer.highwater(tp) == 15  # a fetch answer brings the true figure back

    seek_afresh(consumer, tp, None)  # no commit: from the beginning
    assert consumer.highwater(tp) is None
    assert consumer.position(tp) == 0
