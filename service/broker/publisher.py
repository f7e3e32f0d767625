"""Publishing closed windows and dead letters, made durable together with the offsets.

Two modes:

* **transactional** (the default): a Kafka transaction spans from one commit to the
  next. Window records, dead letters and the consumer offsets (with the restart markers
  in their metadata) are committed atomically with ``send_offsets_to_transaction``, so a
  crash either keeps all of them or none: a window is never published twice and never
  counted twice on ``/metrics``. Readers of the windows topic use
  ``isolation.level=read_committed``.
* **at least once**: records are flushed, then the offsets are committed. A crash
  between the two re-publishes identical window records (harmless to a compacted topic).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import orjson
from kafka import KafkaProducer
from kafka.errors import KafkaError, KafkaTimeoutError

from service.errors import EventError
from service.stream.windows import ClosedWindow

log = logging.getLogger("retrieval_monitor.publisher")

MAX_DEAD_LETTER_BYTES = 512 * 1024
"""Larger bad records are cut (header ``truncated_from``) to stay below the broker limit."""
TRANSACTION_WAIT_MS = 30_000
"""How long one transactional request may take before the transaction is given up."""
REPLACE_WAIT_S = 300.0
"""How long replacing the producer (the broker may be away) is retried before giving up."""


class Publisher:
    """The producer side of the service."""

    def __init__(
        self,
        client: dict[str, Any],
        windows_topic: str,
        deadletter_topic: str,
        *,
        transactional: bool,
        transactional_id: str,
    ) -> None:
        self.windows_topic = windows_topic
        self.deadletter_topic = deadletter_topic
        self.transactional = transactional
        extra: dict[str, Any] = {}
        if transactional:
            # The same id after a restart fences the crashed process and aborts its open
            # transaction at once (a new id would block read_committed readers until the
            # old transaction times out).
            extra = {
                "transactional_id": transactional_id,
                "enable_idempotence": True,
                "transaction_timeout_ms": 60_000,
            }
        self._config = {
            **client,
            "acks": "all",
            "linger_ms": 20,
            "client_id": "retrieval-monitor-publisher",
            **extra,
        }
        self.producer = self._new_producer()
        self._open = False
        self._unanswered = False
        """A transactional request was given up unanswered: its outcome is unknown."""

    def _new_producer(self) -> KafkaProducer:
        producer = KafkaProducer(**self._config)
        if self.transactional:
            try:
                producer.init_transactions()  # bounded by max_block_ms
            except Exception:
                producer.close(timeout=0)  # nothing sent yet: stops its threads
                raise
        return producer

    def _replace_producer(self) -> None:
        """Close the producer and start one with the same transactional id.

        Its ``init_transactions`` fences the old one and makes the broker abort whatever
        transaction the old one left open, including requests it had queued or sent
        without an answer. A local abort cannot: it may complete without telling the
        broker, and the broker then keeps the transaction (and the offsets committed in
        it, which block every ``read_committed`` fetch of the group's offsets) open.
        Retried while the broker is away, for at most ``REPLACE_WAIT_S``.
        """
        self._discard_producer()
        deadline = time.monotonic() + REPLACE_WAIT_S
        while True:
            try:
                self.producer = self._new_producer()
                return
            except KafkaError as error:
                if time.monotonic() >= deadline:
                    raise
                log.warning("starting a new producer failed (%s); retrying", error)
                time.sleep(1)

    def _discard_producer(self) -> None:
        """Stop the producer now, dropping what it has not sent.

        ``close(timeout=0)`` alone does not: it first flushes, which raises while
        records are pending, and leaves the sender thread running (and retrying).
        """
        sender = self.producer._sender
        sender.force_close()
        sender.join(5)
        try:
            self.producer.close(timeout=0)
        except Exception as error:
            log.warning("closing the old producer failed: %s", error)

    def _step(self, what: str, start: Callable[[], Any]) -> None:
        """One transactional request, waited for at most ``TRANSACTION_WAIT_MS``.

        ``KafkaProducer``'s own methods wait without a limit; after a broker was killed
        a request could wait for ever, and the service with it.
        """
        result = start()
        self.producer._sender.wakeup()
        if not result.wait(timeout_ms=TRANSACTION_WAIT_MS):
            self._unanswered = True
            raise KafkaTimeoutError(f"{what} not answered within {TRANSACTION_WAIT_MS} ms")

    def _begin(self) -> None:
        if self.transactional and not self._open:
            self.producer.begin_transaction()
            self._open = True

    def dead_letter(self, record: Any, error: EventError) -> None:
        """Send a bad record as it was, with the reason and its source in headers."""
        self._begin()
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
        self.producer.send(self.deadletter_topic, value=value, key=key, headers=headers)

    def windows(self, windows: Iterable[ClosedWindow], metric_keys: tuple[str, ...]) -> None:
        """Send closed windows (durable only after :meth:`commit`)."""
        for window in windows:
            self._begin()
            self.producer.send(
                self.windows_topic,
                key=window.key.encode(),
                value=orjson.dumps(window.to_record(metric_keys)),
            )

    def commit(
        self,
        offsets: dict[Any, Any],
        group_metadata: Callable[[], Any],
        commit_offsets: Callable[[dict[Any, Any]], None] | None,
    ) -> None:
        """Make everything sent so far durable together with ``offsets``.

        Transactional: one atomic commit. Otherwise: flush, then ``commit_offsets``
        (skipped when None: the caller commits through the coordinator itself).
        Raises on failure; the caller then rebuilds its state from the last commit.
        """
        if self.transactional:
            manager = self.producer._transaction_manager
            if offsets:
                self._begin()
                metadata = group_metadata()
                self._step(
                    "send_offsets_to_transaction",
                    lambda: manager.send_offsets_to_transaction(offsets, metadata),
                )
            if self._open:
                self._step("commit_transaction", manager.begin_commit)
                self._open = False
            return
        self.producer.flush()
        if offsets and commit_offsets is not None:
            commit_offsets(offsets)

    def abort(self) -> None:
        """Drop the open transaction (its records are never seen by read_committed readers).

        After a request went unanswered, or if the abort fails or hangs, the producer is
        replaced instead (:meth:`_replace_producer`).
        """
        if not (self.transactional and (self._open or self._unanswered)):
            return
        self._open = False
        if self._unanswered:
            log.warning("a transactional request went unanswered; replacing the producer")
        else:
            try:
                self._step("abort_transaction", self.producer._transaction_manager.begin_abort)
                return
            except Exception as error:  # fenced, closed, or stuck: start afresh
                log.warning("abort_transaction failed (%s); replacing the producer", error)
        self._unanswered = False
        self._replace_producer()

    def close(self) -> None:
        """Abort what is open and close the producer."""
        self.abort()
        self.producer.close()
