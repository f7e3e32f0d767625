"""A live stream for the integration tests: events produced in a thread at a steady rate,
every one delivered (checked, and sent again when a send failed) through broker faults."""

from __future__ import annotations

import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from kafka import KafkaProducer
from kafka.errors import KafkaError
from kafka.producer.future import FutureRecordMetadata

from service.sim.simulator import SimEvent
from tests.integration.kafka_helpers import Topics, send_event


class PacedProducer:
    """Produces events in a thread at ``per_second``, so the stream is live while a test
    acts on it; ``produced`` counts what was delivered.

    Every record's send is checked: one that failed is sent again (``resent``), and a
    producer that cannot flush within ``STALL_S`` is closed and replaced (``stalls``;
    every thread's stack at the first stall is kept in ``dump_to``). Under broker faults
    a record whose first send landed but whose answer was lost can then be in the topic
    twice, unless the producer is idempotent; tests that inflict faults read the topics
    back and count what is there.
    """

    STALL_S = 60
    """A flush that takes longer is a stall: the producer is replaced."""
    GIVE_UP_S = 900
    """A slice of events not delivered by then fails the stream."""

    def __init__(
        self,
        topics: Topics,
        events: list[SimEvent],
        per_second: int,
        dump_to: Path | None = None,
        **config: Any,
    ) -> None:
        self.produced = 0
        self.resent = 0
        self.stalls = 0
        self.error: BaseException | None = None
        self.dump_to = dump_to
        """Where the first stall writes every thread's stack (for a kafka-python report)."""
        self._config = config
        """More kafka-python producer settings."""
        self._thread = threading.Thread(
            target=self._run, args=(topics, events, per_second), daemon=True
        )
        self._thread.start()

    def _new(self, bootstrap: str) -> KafkaProducer:
        return KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5, **self._config)

    def _run(self, topics: Topics, events: list[SimEvent], per_second: int) -> None:
        producer = self._new(topics.bootstrap)
        try:
            step = max(1, per_second // 20)
            started = time.monotonic()
            for i in range(0, len(events), step):
                producer = self._deliver(producer, topics, events[i : i + step], i)
                self.produced = min(len(events), i + step)
                time.sleep(max(0.0, started + self.produced / per_second - time.monotonic()))
        except BaseException as error:  # reported by join()
            self.error = error
        finally:
            producer.close(timeout=5)

    def _deliver(
        self, producer: KafkaProducer, topics: Topics, events: list[SimEvent], at: int
    ) -> KafkaProducer:
        """Send ``events`` until every one is acknowledged; return the producer in use
        (a new one when the old one stalled)."""
        deadline = time.monotonic() + self.GIVE_UP_S
        while True:
            sent = [(event, _send(producer, topics, event)) for event in events]
            if not _flushed(producer, self.STALL_S):
                self._stalled(at)
                producer.close(timeout=0)
                producer = self._new(topics.bootstrap)
            events = [e for e, future in sent if future is None or not _acknowledged(future)]
            if not events:
                return producer
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"the input producer could not deliver events from {at} on within "
                    f"{self.GIVE_UP_S} s ({len(events)} left)"
                )
            self.resent += len(events)
            time.sleep(1)

    def _stalled(self, at: int) -> None:
        """Count a stall; keep every thread's stack of the first in ``dump_to``."""
        self.stalls += 1
        if self.stalls == 1 and self.dump_to is not None:
            stacks = "\n\n".join(
                f"thread {ident}:\n" + "".join(traceback.format_stack(frame))
                for ident, frame in sys._current_frames().items()
            )
            self.dump_to.write_text(f"flush stalled at event {at}\n\n{stacks}")

    def join(self, timeout_s: float = 300) -> None:
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "the producer did not finish"
        assert self.error is None, self.error


def _send(producer: KafkaProducer, topics: Topics, event: SimEvent) -> FutureRecordMetadata | None:
    """The send's future, or None when the send itself failed (e.g. no metadata in time)."""
    try:
        return send_event(producer, topics, event)
    except KafkaError:
        return None


def _flushed(producer: KafkaProducer, timeout_s: float) -> bool:
    try:
        producer.flush(timeout=timeout_s)
    except KafkaError:  # KafkaTimeoutError
        return False
    return True


def _acknowledged(future: FutureRecordMetadata) -> bool:
    return bool(future.is_done and future.succeeded())
