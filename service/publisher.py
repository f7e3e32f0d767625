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
from collections.abc import Callable, Iterable
from typing import Any

import orjson
from kafka import KafkaProducer

from service.errors import EventError
from service.windows import ClosedWindow

log = logging.getLogger("retrieval_monitor.publisher")

MAX_DEAD_LETTER_BYTES = 512 * 1024
"""Larger bad records are cut (header ``truncated_from``) to stay below the broker limit."""


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
        self.producer = KafkaProducer(
            **client, acks="all", linger_ms=20, client_id="retrieval-monitor-publisher", **extra
        )
        self._open = False
        if transactional:
            self.producer.init_transactions()

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
            if offsets:
                self._begin()
                self.producer.send_offsets_to_transaction(offsets, group_metadata())
            if self._open:
                self.producer.commit_transaction()
                self._open = False
            return
        self.producer.flush()
        if offsets and commit_offsets is not None:
            commit_offsets(offsets)

    def abort(self) -> None:
        """Drop the open transaction (its records are never seen by read_committed readers)."""
        if self.transactional and self._open:
            try:
                self.producer.abort_transaction()
            except Exception as error:  # the producer may be fenced or closed already
                log.warning("abort_transaction failed: %s", error)
            self._open = False

    def close(self) -> None:
        """Abort what is open and close the producer."""
        self.abort()
        self.producer.close()
