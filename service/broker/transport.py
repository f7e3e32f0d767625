"""The producer under the publishers: a :class:`Transport` (kafka-python's producer in
:class:`KafkaTransport`, every wait bounded; a fake in the unit tests), its settings, and
what committing needs of the consumer (:class:`Committer`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

from kafka import KafkaProducer
from kafka.errors import KafkaError

from service.broker import compat

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

    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Headers,
        partition: int | None = None,
    ) -> None:
        """Queue one record (in the open transaction, if any); ``partition`` None: the
        key's partition."""

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

    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Headers,
        partition: int | None = None,
    ) -> None:
        """Queue one record."""
        self.producer.send(topic, key=key, value=value, headers=headers, partition=partition)

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
