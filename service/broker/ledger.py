"""The regressions topic: the ledger of the detector's decisions, read back at start and
written after each batch of boundaries (:mod:`service.detect.ledger` says what the
records are and why a restarted replica holding them is exact).

The topic is compacted, with one partition. Every replica writes the same records (their
detectors decide the same on the same windows), with a plain idempotent producer
(``acks=all``): a duplicate, from another replica or a retry, changes nothing. A failed
write is logged and tried again with the next batch; it never stops the service.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaError, KafkaTimeoutError

from service.broker import compat
from service.broker.waits import METADATA_WAIT_MS
from service.detect.ledger import Ledger, Record

log = logging.getLogger("retrieval_monitor.ledger")

READ_WAIT_MS = 60_000
"""How long reading the whole ledger at start may take before it is tried again."""
WRITE_WAIT_S = 10.0
"""How long a batch of records may wait for the broker's acknowledgement."""


def read_ledger(client: dict[str, Any], topic: str) -> Ledger:
    """Every record of ``topic``, from its beginning to its end (as they are now), into a
    :class:`Ledger` (a missing topic is an empty ledger). Raises KafkaError when the
    broker cannot be read (the caller tries again)."""
    ledger = Ledger()
    consumer = KafkaConsumer(
        **client,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        client_id="retrieval-monitor-ledger",
        **compat.NO_CLIENT_METRICS,
    )
    try:
        found = compat.partitions_for_topic(consumer, topic, METADATA_WAIT_MS)
        tps = [TopicPartition(topic, p) for p in sorted(found)]
        if not tps:
            return ledger
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends: dict[TopicPartition, int] = consumer.end_offsets(tps)
        deadline = time.monotonic() + READ_WAIT_MS / 1000
        while any(consumer.position(tp) < end for tp, end in ends.items()):
            if time.monotonic() > deadline:
                raise KafkaTimeoutError(f"reading {topic} to its end took over {READ_WAIT_MS} ms")
            for records in consumer.poll(timeout_ms=200).values():
                for record in records:
                    _apply(ledger, record)
        return ledger
    finally:
        consumer.close()


def _apply(ledger: Ledger, record: Any) -> None:
    key = record.key.decode() if record.key is not None else ""
    try:
        ledger.apply(key, record.value)
    except (ValueError, UnicodeDecodeError) as error:
        log.warning(
            "skipped a record of the regressions topic that is not a ledger record "
            "(partition %d, offset %d: %s); only this service should write to that topic",
            record.partition,
            record.offset,
            error,
        )


class LedgerWriter:
    """Writes the detector's records to the regressions topic, in order; what failed is
    written again with the next batch."""

    def __init__(self, client: dict[str, Any], topic: str) -> None:
        self.topic = topic
        self.unsent: list[Record] = []
        """Records not acknowledged yet, oldest first."""
        self.failures = 0
        self._producer = KafkaProducer(
            **client,
            acks="all",
            enable_idempotence=True,
            linger_ms=20,
            max_block_ms=int(WRITE_WAIT_S * 1000),
            client_id="retrieval-monitor-ledger-writer",
            **compat.NO_CLIENT_METRICS,
        )

    def write(self, records: Sequence[Record]) -> bool:
        """Send ``records`` after any left unsent, and wait for them; False (logged, kept
        for the next call) when the broker did not take them all."""
        self.unsent += records
        if not self.unsent:
            return True
        try:
            futures = [
                self._producer.send(self.topic, key=key.encode(), value=value)
                for key, value in self.unsent
            ]
            self._producer.flush(timeout=WRITE_WAIT_S)
            for future in futures:
                future.get(timeout=WRITE_WAIT_S)
        except KafkaError as error:
            self.failures += 1
            log.warning(
                "writing %d records to %s failed (%s); trying again with the next batch "
                "(create it as a compacted topic with one partition if it is missing)",
                len(self.unsent),
                self.topic,
                error,
            )
            return False
        self.unsent = []
        return True

    def close(self) -> None:
        try:
            self._producer.close(timeout=WRITE_WAIT_S)
        except KafkaError as error:
            log.warning("closing the ledger writer failed: %s", error)
