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
from typing import Any, Protocol

import orjson
from kafka import KafkaProducer
from kafka.errors import KafkaError

from service.broker import compat
from service.errors import EventError
from service.metrics.ir import MetricKey
from service.stream.audit_join import AuditRequest
from service.stream.windows import ClosedWindow

log = logging.getLogger("retrieval_monitor.publisher")

MAX_DEAD_LETTER_BYTES = 512 * 1024
"""Larger bad records are cut (header ``truncated_from``) to stay below the broker limit."""
TRANSACTION_WAIT_MS = 30_000
"""How long one transactional request may take before the transaction is given up."""
REPLACE_WAIT_S = 300.0
"""How long replacing the producer (the broker may be away) is retried before giving up."""
PRODUCER_BATCH_BYTES = 256 * 1024
"""The producer's ``batch_size``: window records (a few KB each) are sent in bursts as
windows close, and kafka-python's default of 16 KB made a produce batch (and its
bookkeeping in the sender thread) of every three or four of them."""
PRODUCER_MAX_BLOCK_MS = 60_000
"""The producer's ``max_block_ms``: the bound of ``init_transactions`` and of a send
waiting for metadata or buffer space."""

Offsets = Mapping[Any, Any]
"""``TopicPartition`` -> ``OffsetAndMetadata``."""
Headers = list[tuple[str, bytes]]


class CommitError(Exception):
    """A commit did not complete: what was sent since the last commit may not be durable."""


class UnansweredError(CommitError):
    """A transactional request got no answer in time: its outcome on the broker is unknown."""


class Transport(Protocol):
    """What the publishers need of a producer."""

    def send(self, topic: str, key: bytes | None, value: bytes | None, headers: Headers) -> None:
        """Queue one record (in the open transaction, if any)."""

    def flush(self) -> None:
        """Wait until every queued record is acknowledged."""

    def begin(self) -> None:
        """Open a transaction."""

    def add_offsets(self, offsets: Offsets, group_metadata: Any, timeout_ms: int) -> None:
        """Add consumer offsets to the open transaction; raise UnansweredError after the wait."""

    def commit(self, timeout_ms: int) -> None:
        """Commit the open transaction; raise UnansweredError after the wait."""

    def abort(self, timeout_ms: int) -> None:
        """Abort the open transaction; raise UnansweredError after the wait."""

    def discard(self) -> None:
        """Stop at once, dropping what was not sent (the transport is not used again)."""

    def close(self) -> None:
        """Flush and close."""


class Committer(Protocol):
    """What committing needs of the consumer."""

    def group_metadata(self) -> Any:
        """The group generation, for ``send_offsets_to_transaction`` (fencing)."""

    def commit(self, offsets: Offsets) -> None:
        """Commit offsets synchronously (at-least-once mode)."""


class KafkaTransport:
    """A :class:`Transport` over kafka-python's ``KafkaProducer``, every wait bounded.

    ``KafkaProducer``'s own transactional methods wait without a limit: after a broker
    was killed a request could wait for ever, and the service with it.
    """

    def __init__(self, config: dict[str, Any]) -> None:
        self.producer = KafkaProducer(**config)
        self.transactional = "transactional_id" in config
        if self.transactional:
            try:
                self.producer.init_transactions()  # bounded by max_block_ms
            except KafkaError:
                self.producer.close(timeout=0)  # nothing sent yet: stops its threads
                raise

    def send(self, topic: str, key: bytes | None, value: bytes | None, headers: Headers) -> None:
        """Queue one record."""
        self.producer.send(topic, key=key, value=value, headers=headers)

    def flush(self) -> None:
        """Wait for every queued record."""
        self.producer.flush()

    def begin(self) -> None:
        """Open a transaction."""
        self.producer.begin_transaction()

    def _wait(self, what: str, pending: compat.Pending, timeout_ms: int) -> None:
        compat.wake_sender(self.producer)
        if not pending.wait(timeout_ms=timeout_ms):
            raise UnansweredError(f"{what} not answered within {timeout_ms} ms")

    def add_offsets(self, offsets: Offsets, group_metadata: Any, timeout_ms: int) -> None:
        """Add the offsets to the open transaction, waiting at most ``timeout_ms``."""
        pending = compat.send_offsets(self.producer, offsets, group_metadata)
        self._wait("send_offsets_to_transaction", pending, timeout_ms)

    def commit(self, timeout_ms: int) -> None:
        """Commit the open transaction, waiting at most ``timeout_ms``."""
        self._wait("commit_transaction", compat.begin_commit(self.producer), timeout_ms)

    def abort(self, timeout_ms: int) -> None:
        """Abort the open transaction, waiting at most ``timeout_ms``."""
        self._wait("abort_transaction", compat.begin_abort(self.producer), timeout_ms)

    def discard(self) -> None:
        """Stop the sender now and close, dropping what it has not sent."""
        compat.stop_sender(self.producer)
        try:
            self.producer.close(timeout=0)
        except KafkaError as error:
            log.warning("closing the old producer failed: %s", error)

    def close(self) -> None:
        """Flush and close the producer."""
        self.producer.close()


def producer_config(
    client: dict[str, Any], *, transactional: bool, transactional_id: str
) -> dict[str, Any]:
    """The publisher's producer settings (the same transactional id after every restart)."""
    extra: dict[str, Any] = {}
    if transactional:
        # The same id after a restart fences the crashed process and aborts its open
        # transaction at once (a new id would block read_committed readers until the old
        # transaction times out).
        extra = {
            "transactional_id": transactional_id,
            "enable_idempotence": True,
            "transaction_timeout_ms": 60_000,
        }
    return {
        **client,
        "acks": "all",
        "linger_ms": 20,
        "batch_size": PRODUCER_BATCH_BYTES,
        "max_block_ms": PRODUCER_MAX_BLOCK_MS,
        "client_id": "retrieval-monitor-publisher",
        **compat.NO_CLIENT_METRICS,
        **extra,
    }


class Publisher(ABC):
    """The producer side of the service: window records and dead letters, then a commit."""

    transactional: bool
    """Whether a failed commit takes back what was sent since the last one."""

    def __init__(self, transport: Transport, windows_topic: str, deadletter_topic: str) -> None:
        self.transport = transport
        self.windows_topic = windows_topic
        self.deadletter_topic = deadletter_topic
        self.labels_topic: str | None = None
        """Where each window's labels output goes with it (None: that output is off)."""
        self.audit_topic: str | None = None
        """Where the audit sample's requests go (``AUDIT_TOPIC``; None: nowhere)."""

    @abstractmethod
    def _send(self, topic: str, key: bytes | None, value: bytes | None, headers: Headers) -> None:
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
            self._send(self.windows_topic, window.key.encode(), record, [])
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

    def _send(self, topic: str, key: bytes | None, value: bytes | None, headers: Headers) -> None:
        self.transport.send(topic, key, value, headers)

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

    def _send(self, topic: str, key: bytes | None, value: bytes | None, headers: Headers) -> None:
        self._begin()
        self.transport.send(topic, key, value, headers)

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
