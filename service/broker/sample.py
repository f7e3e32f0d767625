"""A sample of the input topics for ``check-input``: the last records of each, no group."""

from __future__ import annotations

import time
from collections.abc import Iterator

from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError

from service.config import Settings
from service.errors import ConfigError
from service.stream.topics import FEEDBACK, QUERIES, Topic

SAMPLE_WAIT_S = 20.0
"""How long reading a sample from Kafka may take."""


def kafka_records(settings: Settings, sample: int) -> Iterator[tuple[Topic, str, bytes]]:
    """The last ``sample`` records (about) of each input topic, read without a group."""
    try:
        consumer = KafkaConsumer(
            **settings.kafka_client_config(), enable_auto_commit=False, group_id=None
        )
    except KafkaError as error:
        raise ConfigError(
            f"cannot connect to Kafka at {settings.kafka_bootstrap_servers} ({error}); "
            "check --kafka-bootstrap-servers and the --kafka-security-* settings"
        ) from None
    try:
        names = {settings.queries_topic: QUERIES, settings.feedback_topic: FEEDBACK}
        tps = []
        for name in names:
            partitions = consumer.partitions_for_topic(name)
            if not partitions:
                raise ConfigError(f"topic {name!r} does not exist (or has no partitions)")
            tps += [TopicPartition(name, p) for p in sorted(partitions)]
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        starts = consumer.beginning_offsets(tps)
        want = {}
        for tp in tps:
            per_partition = -(-sample // sum(1 for t in tps if t.topic == tp.topic))
            start = max(starts[tp], ends[tp] - per_partition)
            consumer.seek(tp, start)
            if ends[tp] > start:
                want[tp] = ends[tp]
        deadline = time.monotonic() + SAMPLE_WAIT_S
        taken = dict.fromkeys(names.values(), 0)
        while want and time.monotonic() < deadline:
            for tp in [tp for tp in want if consumer.position(tp) >= want[tp]]:
                del want[tp]  # (the last offsets may be transaction markers, never records)
            for tp, records in consumer.poll(timeout_ms=500).items():
                for record in records:
                    if record.offset >= want.get(tp, 0):
                        continue
                    topic = names[tp.topic]
                    if taken[topic] < sample and record.value is not None:
                        taken[topic] += 1
                        yield topic, f"{tp.topic}[{tp.partition}]@{record.offset}", record.value
    finally:
        consumer.close()
