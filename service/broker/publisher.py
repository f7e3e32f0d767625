"""Publishing closed windows and dead letters, made durable together with the offsets.

Two strategies behind one interface (:class:`Publisher`), chosen by ``EXACTLY_ONCE``:

* :class:`TransactionalPublisher` (the default): a Kafka transaction spans from one
  commit to the next. Window records, dead letters and the consumer offsets (with the
  restart markers in their metadata) are committed atomically with
  ``send_offsets_to_transaction``, so a crash either keeps all of them or none: a window
  is never published twice and never counted twice on ``/metrics``. Readers of the
  windows topic use ``isolation.level=read_committed``.
* :class:`AtLeastOncePublisher`: records are flushed, then the offsets are committed. A
  crash between the two re-publishes identical window records (harmless to a compacted
  topic).

Both talk to the broker through a :class:`Transport` (a kafka-python producer in
:class:`KafkaTransport`; a fake in the unit tests), so the commit protocol above them
runs the same with or without a broker.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import orjson
from kafka.errors import KafkaError

from service.broker.transport import (
    MAX_DEAD_LETTER_BYTES,
    REPLACE_WAIT_S,
    TRANSACTION_WAIT_MS,
    CommitError,
    Committer,
    Headers,
    KafkaTransport,
    Offsets,
    Transport,
    UnansweredError,
    producer_config,
)
from service.errors import EventError
from service.metrics.ir import MetricKey
from service.stream.audit_join import AuditRequest
from service.stream.windows import ClosedWindow

log = logging.getLogger("retrieval_monitor.publisher")


class Publisher(ABC):
    """The producer side of the service: window records and dead letters, then a commit."""

    transactional: bool
    """Whether a failed commit takes back what was sent since the last one."""

    def __init__(self, transport: Transport, windows_topic: str, deadletter_topic: str) -> None:
        self.transport = transport
        self.windows_topic = windows_topic
        self.deadletter_topic = deadletter_topic
        self.early_topic: str | None = None
        """Where the early windows go (``EARLY_WINDOWS_TOPIC``; None: none are made)."""
        self.labels_topic: str | None = None
        """Where each window's labels output goes with it (None: that output is off)."""
        self.audit_topic: str | None = None
        """Where the audit sample's requests go (``AUDIT_TOPIC``; None: nowhere)."""
        self.audit_state_topic: str | None = None
        """Where the audit joins' state goes (``AUDIT_STATE_TOPIC``; None: auditing off)."""

    @abstractmethod
    def _send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Headers,
        partition: int | None = None,
    ) -> None:
        """Send one record (in the open transaction, if any)."""

    def dead_letter(self, record: Any, error: EventError) -> None:
        """Send a bad record as it was, with the reason and its source in headers."""
        headers = [
            ("reason", error.reason.encode()),
            ("error", str(error).encode()[:1000]),
            ("source_topic", record.topic.encode()),
            ("source_partition", str(record.partition).encode()),
            ("source_offset", str(record.offset).encode()),
        ]
        value = record.value
        if value is not None and len(value) > MAX_DEAD_LETTER_BYTES:
            headers.append(("truncated_from", str(len(value)).encode()))
            value = value[:MAX_DEAD_LETTER_BYTES]
        # a record needs a key or a value: a keyless tombstone gets its source as key
        key = record.key
        if key is None and value is None:
            key = f"{record.topic}[{record.partition}]@{record.offset}".encode()
        self._send(self.deadletter_topic, key, value, headers)

    def windows(self, windows: Iterable[ClosedWindow], metric_keys: tuple[MetricKey, ...]) -> None:
        """Send closed windows (durable only after :meth:`commit`)."""
        labels = self.labels_topic
        for window in windows:
            record = orjson.dumps(window.to_record(metric_keys))
            final = window.label_age_ms is None
            topic = self.windows_topic if final else self.early_topic
            if topic is None:
                raise ValueError("an early window, and no topic for early windows")
            self._send(topic, window.key.encode(), record, [])
            if labels is not None:
                for query in window.labels:
                    self._send(labels, str(query["query_id"]).encode(), orjson.dumps(query), [])

    def audit_requests(self, requests: Iterable[AuditRequest]) -> None:
        """Send audit requests, keyed by query id, with the windows they closed with (a
        request sent twice, after a crash, is the same record)."""
        topic = self.audit_topic
        if topic is not None:
            for request in requests:
                record = orjson.dumps(request.to_record())
                self._send(topic, request.query_id.encode(), record, [])

    def audit_state(self, changes: Mapping[int, Mapping[str, AuditRequest | None]]) -> None:
        """Send the audit state records that changed, each to its input partition's
        partition of the state topic (None: a tombstone, the request is forgotten)."""
        topic = self.audit_state_topic
        if topic is None:
            return
        for partition, requests in changes.items():
            for query_id, request in requests.items():
                value = None if request is None else orjson.dumps(request.to_state())
                self._send(topic, query_id.encode(), value, [], partition)

    @abstractmethod
    def commit(self, offsets: Offsets, consumer: Committer) -> None:
        """Make everything sent so far durable together with ``offsets``.

        Raises CommitError or KafkaError; the caller then decides from
        :attr:`transactional` whether what was sent is lost.
        """

    @abstractmethod
    def commit_on_revoke(self, offsets: Offsets, consumer: Committer) -> Offsets:
        """:meth:`commit` from a rebalance callback; returns offsets still to commit there."""

    @abstractmethod
    def abort(self) -> None:
        """Take back what was sent since the last commit, where that is possible."""

    def close(self) -> None:
        """Abort what is open and close the producer."""
        self.abort()
        self.transport.close()


class AtLeastOncePublisher(Publisher):
    """Flush the records, then commit the offsets: a crash in between repeats records."""

    transactional = False

    def _send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Headers,
        partition: int | None = None,
    ) -> None:
        self.transport.send(topic, key, value, headers, partition)

    def commit(self, offsets: Offsets, consumer: Committer) -> None:
        """Flush, then commit the offsets synchronously."""
        self.transport.flush()
        if offsets:
            consumer.commit(offsets)

    def commit_on_revoke(self, offsets: Offsets, consumer: Committer) -> Offsets:
        """Flush; the offsets go back to the callback (the consumer cannot commit there)."""
        self.transport.flush()
        return offsets

    def abort(self) -> None:
        """Nothing to take back: sent records are out."""


class TransactionalPublisher(Publisher):
    """One Kafka transaction from commit to commit: records and offsets, all or none."""

    transactional = True

    def __init__(
        self, connect: Callable[[], Transport], windows_topic: str, deadletter_topic: str
    ) -> None:
        super().__init__(connect(), windows_topic, deadletter_topic)
        self._connect = connect
        self._open = False
        self._unanswered = False
        """A transactional request was given up unanswered: its outcome is unknown."""

    def _send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Headers,
        partition: int | None = None,
    ) -> None:
        self._begin()
        self.transport.send(topic, key, value, headers, partition)

    def _begin(self) -> None:
        if not self._open:
            self.transport.begin()
            self._open = True

    def _bounded(self, step: Callable[[int], None]) -> None:
        try:
            step(TRANSACTION_WAIT_MS)
        except UnansweredError:
            self._unanswered = True
            raise

    def commit(self, offsets: Offsets, consumer: Committer) -> None:
        """One atomic commit of the open transaction with ``offsets``."""
        if offsets:
            self._begin()
            metadata = consumer.group_metadata()
            self._bounded(lambda wait: self.transport.add_offsets(offsets, metadata, wait))
        if self._open:
            self._bounded(self.transport.commit)
            self._open = False

    def commit_on_revoke(self, offsets: Offsets, consumer: Committer) -> Offsets:
        """Commit here, in the callback: nothing is left for the consumer to commit."""
        self.commit(offsets, consumer)
        return {}

    def abort(self) -> None:
        """Drop the open transaction (its records are never seen by read_committed readers).

        After a request went unanswered, or if the abort fails or hangs, the producer is
        replaced instead (:meth:`_replace`).
        """
        if not (self._open or self._unanswered):
            return
        self._open = False
        if self._unanswered:
            log.warning("a transactional request went unanswered; replacing the producer")
        else:
            try:
                self._bounded(self.transport.abort)
                return
            except (KafkaError, CommitError) as error:  # fenced, closed, or stuck
                log.warning("abort_transaction failed (%s); replacing the producer", error)
        self._unanswered = False
        self._replace()

    def _replace(self) -> None:
        """Close the producer and start one with the same transactional id.

        Its ``init_transactions`` fences the old one and makes the broker abort whatever
        transaction the old one left open, including requests it had queued or sent
        without an answer. A local abort cannot: it may complete without telling the
        broker, and the broker then keeps the transaction (and the offsets committed in
        it, which block every ``read_committed`` fetch of the group's offsets) open.
        Retried while the broker is away, for at most ``REPLACE_WAIT_S``.
        """
        self.transport.discard()
        deadline = time.monotonic() + REPLACE_WAIT_S
        while True:
            try:
                self.transport = self._connect()
                return
            except KafkaError as error:
                if time.monotonic() >= deadline:
                    raise
                log.warning("starting a new producer failed (%s); retrying", error)
                time.sleep(1)


def make_publisher(
    client: dict[str, Any],
    windows_topic: str,
    deadletter_topic: str,
    *,
    transactional: bool,
    transactional_id: str,
) -> Publisher:
    """The publisher of the chosen strategy, over a kafka-python producer."""
    config = producer_config(client, transactional=transactional, transactional_id=transactional_id)
    if transactional:
        return TransactionalPublisher(
            lambda: KafkaTransport(config), windows_topic, deadletter_topic
        )
    return AtLeastOncePublisher(KafkaTransport(config), windows_topic, deadletter_topic)
