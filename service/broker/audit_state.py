"""The audit state topic: the audit joins' requests, so that a partition taken over (after a
restart or a rebalance) holds the requests of its last week without re-reading its input.

Compacted, one partition per input partition, keyed by query id: a record is a request's
whole state (:meth:`AuditRequest.to_state <service.stream.audit_join.AuditRequest.to_state>`),
a tombstone one that was forgotten. It is written by the publisher in the transaction of
the windows it closed with and the offsets (:meth:`Publisher.audit_state
<service.broker.publisher.Publisher.audit_state>`), and read here with
``read_committed``, to its end, when a partition is taken over: the state as of the last
commit, to which the re-read of the input from that commit adds what came after. Like Kafka
Streams with its changelog topics, the service creates the topic when it is missing.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import KafkaError, KafkaTimeoutError, TopicAlreadyExistsError

from service.broker import compat
from service.errors import ConfigError
from service.stream.audit_join import AuditRequest

log = logging.getLogger("retrieval_monitor.audit_state")

READ_WAIT_MS = 60_000
"""How long reading one partition of the state to its end may take."""


def ensure_topic(client: dict[str, Any], topic: str, partitions: int) -> None:
    """Create the state topic (compacted, ``partitions`` partitions) when it is missing;
    ConfigError when it exists with fewer partitions than the input topics."""
    admin = KafkaAdminClient(**client, client_id="retrieval-monitor-audit-state")
    try:
        found = admin.describe_topics([topic])
        existing = [t for t in found if not t.get("error_code") and t.get("partitions")]
        if existing:
            have = len(existing[0]["partitions"])
            if have < partitions:
                raise ConfigError(
                    f"the audit state topic {topic!r} has {have} partitions, the input topics "
                    f"{partitions}: give it as many (kafka-topics.sh --alter --partitions "
                    f"{partitions}), or name another with --audit-state-topic"
                )
            return
        try:
            admin.create_topics(
                [
                    NewTopic(
                        topic,
                        partitions,
                        -1,
                        topic_configs={"cleanup.policy": "compact"},
                    )
                ]
            )
            log.info(
                "created the audit state topic %s (%d partitions, compacted)", topic, partitions
            )
        except TopicAlreadyExistsError:
            pass  # (another replica made it first)
    finally:
        admin.close()


class AuditStateReader:
    """Reads one partition of the state topic to its end (one consumer, reused)."""

    def __init__(self, client: dict[str, Any], topic: str) -> None:
        self.topic = topic
        self._consumer = KafkaConsumer(
            **client,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            client_id="retrieval-monitor-audit-state",
            **compat.NO_CLIENT_METRICS,
        )

    def read(self, partition: int) -> list[AuditRequest]:
        """The requests held in ``partition`` (the last record of each query id; none after
        its tombstone). Raises KafkaError when the broker cannot be read to the end."""
        tp = TopicPartition(self.topic, partition)
        consumer = self._consumer
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        end = consumer.end_offsets([tp])[tp]
        held: dict[bytes, bytes | None] = {}
        deadline = time.monotonic() + READ_WAIT_MS / 1000
        while consumer.position(tp) < end:
            if time.monotonic() > deadline:
                raise KafkaTimeoutError(
                    f"reading {self.topic}[{partition}] to its end took over {READ_WAIT_MS} ms"
                )
            for records in consumer.poll(timeout_ms=200).values():
                for record in records:
                    if record.key is not None:
                        held[record.key] = record.value
        requests = []
        for key, value in held.items():
            if value is None:
                continue
            try:
                requests.append(AuditRequest.from_state(orjson.loads(value)))
            except (ValueError, KeyError, TypeError) as error:
                log.warning(
                    "skipped a record of %s[%d] that is no audit state (%r: %s); only this "
                    "service should write to that topic",
                    self.topic,
                    partition,
                    key[:60],
                    error,
                )
        return requests

    def close(self) -> None:
        try:
            self._consumer.close()
        except KafkaError as error:
            log.warning("closing the audit state reader failed: %s", error)
