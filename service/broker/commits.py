"""The commit protocol: what is published, what is confirmed, what is counted, what is rebuilt.

One component owns every piece of it, so it can be read (and tested) in one place:

* **sent, unconfirmed**: closed windows go to the publisher as soon as they close and
  wait in :attr:`CommitProtocol.unconfirmed` until a commit makes them durable; only
  then are they folded into the counters, summaries, rolling views and the detector.
* **the markers**: each commit's metadata says how far the partition's windows (and its
  early windows) were published, how far its records were counted, and which feedback
  still waits for its query (:mod:`service.stream.offsets`): a take-over starts there.
* **counted, uncommitted**: a partition dropped without a commit remembers how far this
  process counted it, so re-reading it counts nothing twice (:attr:`CommitProtocol.counted`).
* **the rebuild decision**: after a failed transaction, or when committed offsets could
  not be fetched, every assigned partition is dropped and started again from its last
  commit, by the loop (:meth:`CommitProtocol.rebuild_if_needed`).

Two locks, always taken in this order: the producer lock (every use of the publisher,
from the loop and from rebalance callbacks on kafka-python's IO thread), then the state
lock (the monitor and the health the HTTP side reads). The state lock is never held
while waiting on the broker. The at-least-once commit waits on the consumer's
coordinator, which runs the rebalance callbacks; it is therefore made outside the
producer lock, so that a callback waiting for that lock cannot deadlock it.

Broker failures arrive as ``KafkaError`` or :class:`~service.broker.publisher.CommitError`
and are handled here; anything else (a programming error) is not swallowed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from kafka import TopicPartition
from kafka.errors import KafkaError, KafkaTimeoutError
from kafka.structs import OffsetAndMetadata

from service.broker import compat
from service.broker.audit_state import AuditStateReader
from service.broker.failpoints import failpoint
from service.broker.hanging import SETTLE_AFTER_S, HangingOffsets
from service.broker.publisher import Publisher
from service.broker.transport import CommitError
from service.core.state import ServiceState
from service.stream.offsets import restart_from
from service.stream.topics import TOPICS, Topic
from service.stream.windows import ClosedWindow

log = logging.getLogger("retrieval_monitor.kafka")

BROKER_ERRORS = (KafkaError, CommitError)
"""What a commit may raise when the broker refuses, fails or does not answer."""
COMMITTED_WAIT_MS = 30_000
"""How long fetching the committed offsets of every assigned partition may take before it
is retried later (one budget for all of them, not one each)."""


class GroupConsumer(Protocol):
    """What the protocol needs of the consumer (kafka-python's ``KafkaConsumer``)."""

    def group_metadata(self) -> Any:
        """The group generation, for transactional offset commits (fencing)."""

    def commit(self, offsets: Mapping[Any, Any]) -> None:
        """Commit offsets synchronously."""

    def committed(self, partition: Any, metadata: bool, timeout_ms: int) -> Any:
        """The committed offset (with metadata) of one topic partition, or None."""

    def assignment(self) -> set[Any]:
        """The topic partitions assigned to this member."""

    def seek(self, partition: Any, offset: int) -> None:
        """Read ``partition`` from ``offset`` next."""

    def seek_to_beginning(self, *partitions: Any) -> None:
        """Read ``partitions`` from their first offset next."""


class CommitProtocol:
    """Publishes closed windows and commits them with the offsets and restart markers."""

    def __init__(
        self,
        state: ServiceState,
        publisher: Publisher,
        consumer: GroupConsumer,
        topics: tuple[str, str],
        hanging: HangingOffsets | None = None,
    ) -> None:
        self.state = state
        self.pipeline = state.pipeline
        self.lock = state.lock
        self.publisher = publisher
        self.consumer = consumer
        self.topics = topics
        self.producer_lock = threading.Lock()
        """Serialises every use of the publisher (taken before the state lock)."""
        self.unconfirmed: list[ClosedWindow] = []
        """Windows sent since the last commit: durable, and counted, only once it succeeds."""
        self.counted: dict[int, list[int]] = {}
        """Per partition dropped without a commit: offsets (queries, feedback) below which
        this process already counted the records; re-reading them counts nothing again."""
        self.started: dict[int, dict[Topic, int]] = {}
        """Per partition taken over, the offsets it started reading from (per topic)."""
        self._needs_rebuild = False
        self._rebuild_lock = threading.Lock()
        """Guards the rebuild decision, which callbacks and the loop both make."""
        self.hanging = hanging
        self.audit_reader: AuditStateReader | None = None  # (None: auditing is off)
        """Settles offsets left unstable by a skipped transaction marker (transactional)."""

    # -- the loop (main thread) ---------------------------------------------------------------

    def cycle(self, work: Callable[[], None], commit: bool, advance: bool = True) -> bool:
        """Under both locks run ``work`` (process a batch) and, with ``advance`` or
        ``commit``, finalise and send what closed; then commit.

        Closed windows ride in the open transaction until the next commit: committing per
        poll would cost a transaction per batch in catch-up. Returns whether a commit was
        made (successfully or not).
        """
        with self.producer_lock:
            with self.lock:
                work()
                if advance or commit:  # the offsets committed are those of what was sent
                    self._send(self.pipeline.advance())
                offsets = self._offsets() if commit else None
            if offsets is not None and self.publisher.transactional:
                self._commit(offsets)
        if offsets is not None and not self.publisher.transactional:
            self._commit(offsets)  # waits on the consumer: outside the producer lock
        return offsets is not None

    def dead_letter(self, record: Any, error: Any) -> None:
        """Send a bad record to the dead-letter topic, in the open transaction (both locks)."""
        self.publisher.dead_letter(record, error)

    def rebuild_if_needed(self) -> None:
        """Drop all state and restart every partition from its last committed offsets.

        Every partition assigned to the consumer is taken over, so also those whose
        committed offsets a rebalance could not fetch. If the fetch fails again (the
        broker is away), it is retried on a later loop, and the partitions stay without
        state until then.
        """
        with self._rebuild_lock:
            if not self._needs_rebuild:
                return
            self._needs_rebuild = False
        with self.lock:
            dropped = set(self.pipeline.partitions())
            self._remember_counted(dropped)
            for p in dropped:
                self.pipeline.revoke(p)
            self.unconfirmed = []
            self.state.health.assigned = 0
        tps = set(self.consumer.assignment())  # a rebalance may have moved some
        if not tps:
            return
        started = self.hanging.now() if self.hanging is not None else 0.0
        try:
            committed = self._committed(tps)
        except KafkaError as error:
            log.warning("fetching the committed offsets failed (%s); retrying", error)
            self._settle_hanging(tps, error, started)
            self._rebuild_later()
            return
        if self.hanging is not None:
            self.hanging.settled()
        self.take_over(tps, {tp: m for tp, m in committed.items() if m is not None})

    def _settle_hanging(self, tps: set[Any], error: Exception, started: float) -> None:
        """Commit the last committed offsets again when a skipped transaction marker left
        them unstable for good (:mod:`service.broker.hanging`)."""
        if self.hanging is None or not self.publisher.transactional:
            return
        offsets = self.hanging.to_settle(tps, error, started)
        if not offsets:
            return
        log.warning(
            "the committed offsets have stayed unstable for %.0f s while the broker answers: "
            "a transaction without its marker on the offsets partition (docs/runbook.md); "
            "committing the last committed offsets of %d partitions again to settle it",
            SETTLE_AFTER_S,
            len(offsets),
        )
        with self.producer_lock:
            try:
                self.publisher.commit(offsets, self.consumer)
            except BROKER_ERRORS as failed:
                log.warning("settling the offsets failed (%s); retrying later", failed)
                self.publisher.abort()
                return
        self.hanging.settled()

    def _committed(self, tps: Iterable[Any]) -> dict[Any, Any]:
        """The committed offsets of ``tps``, all within ``COMMITTED_WAIT_MS``."""
        deadline = time.monotonic() + COMMITTED_WAIT_MS / 1000
        out = {}
        for tp in tps:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                raise KafkaTimeoutError(f"committed offsets not fetched in {COMMITTED_WAIT_MS} ms")
            out[tp] = self.consumer.committed(tp, metadata=True, timeout_ms=left_ms)
        return out

    # -- rebalance callbacks (kafka-python's IO thread) ------------------------------------------

    async def assigned(self, assigned: Iterable[Any]) -> None:
        """The rebalance assigned these topic partitions: fetch their committed offsets
        and take them over (or, if the fetch fails, let the loop take them over later)."""
        tps = set(assigned)
        try:
            committed = await compat.committed_in_callback(self.consumer, tps, COMMITTED_WAIT_MS)
        except KafkaError as error:  # e.g. offsets of a transaction still pending
            self.take_over_later({tp.partition for tp in tps}, error)
            return
        self.take_over(tps, committed)

    async def revoked(self, revoked: Iterable[Any]) -> None:
        """The rebalance revokes these topic partitions: hand them over, and in
        at-least-once mode commit what is left through the coordinator's async API."""
        offsets = self.hand_over({tp.partition for tp in revoked})
        if offsets:
            try:
                await compat.commit_in_callback(self.consumer, offsets)
            except KafkaError as error:  # the new owner re-reads from the older commit
                log.warning("commit on revoke failed (%s); the next owner re-reads more", error)

    def take_over(self, assigned: set[Any], committed: Mapping[Any, Any]) -> None:
        """Start newly assigned partitions from their committed offsets and markers."""
        partitions = {tp.partition for tp in assigned}
        by_topic = {t: {tp.partition for tp in assigned if tp.topic == t} for t in self.topics}
        if by_topic[self.topics[0]] != by_topic[self.topics[1]]:
            log.error("assignment is not co-partitioned: %s", sorted(map(str, assigned)))
        with self.lock:
            for p in sorted(partitions):
                if self.pipeline.owns(p):
                    continue
                tps = [TopicPartition(t, p) for t in self.topics]
                meta = [committed.get(tp) for tp in tps]
                restart = restart_from(*(m.metadata if m is not None else None for m in meta))
                # (with what an earlier life of this process counted, if it dropped the
                # partition uncommitted: dead letters of an aborted transaction go again)
                self.pipeline.take_over(p, restart, self.counted.pop(p, None))
                if not self._load_audits(p):
                    continue
                # Always restart from the commit: a partition kept across an eager
                # rebalance would otherwise continue from its position, and the state
                # dropped on revoke would never be rebuilt.
                started = self.started[p] = {}
                for topic, tp, m in zip(TOPICS, tps, meta, strict=True):
                    if m is None or m.offset is None or m.offset < 0:
                        compat.seek_afresh(self.consumer, tp, None)
                        started[topic] = 0  # below the log start: the consumer resets
                    else:
                        compat.seek_afresh(self.consumer, tp, m.offset)
                        started[topic] = m.offset
            self.state.health.assigned = len(self.pipeline.partitions())
        log.info("assigned partitions %s", sorted(partitions))

    def _load_audits(self, partition: int) -> bool:
        """Read the partition's audit state back; False (the partition dropped, for the
        loop to take over later) when the broker cannot be read."""
        if self.audit_reader is None:
            return True
        try:
            self.pipeline.load_audits(partition, self.audit_reader.read(partition))
        except KafkaError as error:
            log.warning("reading the audit state of partition %d failed (%s)", partition, error)
            self.pipeline.revoke(partition)
            self._rebuild_later()
            return False
        return True

    def take_over_later(self, partitions: set[int], error: Exception) -> None:
        """The committed offsets of newly assigned partitions could not be fetched.

        The loop fetches them again (:meth:`rebuild_if_needed` takes over every assigned
        partition without state); until then their records are skipped (the take-over
        seeks back to the commit).
        """
        log.warning(
            "fetching the committed offsets of partitions %s failed (%s); retrying",
            sorted(partitions),
            error,
        )
        self._rebuild_later()

    def hand_over(self, partitions: set[int]) -> Mapping[Any, Any]:
        """Publish what is closed, commit, and drop the partitions.

        Returns the offsets still to commit through the coordinator (at-least-once mode);
        in transactional mode they are committed here, with the windows.
        """
        with self.producer_lock:
            with self.lock:
                self._send(self.pipeline.advance())
                offsets = self._offsets()
            committed = True
            left: Mapping[Any, Any] = {}
            try:
                left = self.publisher.commit_on_revoke(offsets, self.consumer)
            except BROKER_ERRORS as error:  # the next owner re-reads from the older commit
                log.warning("commit on revoke failed (%s); the next owner re-reads more", error)
                self.publisher.abort()
                committed = not self.publisher.transactional
            with self.lock:
                if committed:
                    self._confirm()
                else:  # aborted: never visible to read_committed readers, so not counted
                    self.unconfirmed = []
                for p in partitions:
                    self.pipeline.revoke(p)
                self.state.health.assigned = len(self.pipeline.partitions())
            log.info("revoked partitions %s", sorted(partitions))
        return left

    def drop(self, partitions: set[int]) -> None:
        """Partitions were lost (another member owns them): drop state, commit nothing.

        The open transaction may hold their windows: it is aborted, and every partition
        still assigned is rebuilt from its last commit.
        """
        with self.producer_lock:
            self.publisher.abort()
            with self.lock:
                self.unconfirmed = []
                self._remember_counted(partitions)
                for p in partitions:
                    self.pipeline.revoke(p)
                self.state.health.assigned = len(self.pipeline.partitions())
                remaining = bool(self.pipeline.partitions())
        if self.publisher.transactional and remaining:
            self._rebuild_later()
        log.warning("lost partitions %s; their state was dropped", sorted(partitions))

    # -- the steps ------------------------------------------------------------------------------

    def _send(self, windows: list[ClosedWindow]) -> None:
        """Send the early and the closed windows, and move the markers (both locks)."""
        # (the early windows' marker moved as they were made: it is committed with them)
        self.publisher.windows(self.pipeline.take_early(), self.pipeline.metric_keys)
        if windows:
            self.publisher.windows(windows, self.pipeline.metric_keys)
            self.publisher.audit_requests(self.pipeline.take_audit_requests())
            self.pipeline.mark_sent(windows)
            self.unconfirmed.extend(windows)
        changes = self.pipeline.audit_changes()
        if changes:  # (with the windows they closed with, and the offsets)
            self.publisher.audit_state(changes)

    def _offsets(self) -> dict[Any, OffsetAndMetadata]:
        """The offsets and markers of every partition, after closed windows were sent."""
        return {
            TopicPartition(self.topics[topic], p): OffsetAndMetadata(offset, metadata, -1)
            for p, plan in self.pipeline.commit_plans(self.started).items()
            for topic, (offset, metadata) in plan.items()
        }

    def _commit(self, offsets: Mapping[Any, Any]) -> None:
        if self.unconfirmed:  # only commits that carry windows are crash points
            failpoint("before-commit", f"{len(self.unconfirmed)} windows uncommitted")
        try:
            self.publisher.commit(offsets, self.consumer)
        except BROKER_ERRORS as error:
            if not self.publisher.transactional:  # records are out; a rebalance re-commits
                log.warning("commit failed (%s); will retry after the rebalance", error)
            else:
                log.warning("transaction failed (%s); rebuilding from the last commit", error)
                self.publisher.abort()
                self._rebuild_later()  # done by the loop, outside the producer lock
                return
        if self.unconfirmed:
            failpoint("after-commit", f"{len(self.unconfirmed)} windows committed, uncounted")
        with self.lock:
            self._confirm()
            health = self.state.health
            health.commits += 1
            health.last_commit_ms = self.state.wall_ms()

    def _confirm(self) -> None:
        """The sent windows are durable: count them (under the state lock)."""
        self.pipeline.confirm(self.unconfirmed)
        self.unconfirmed = []

    def _rebuild_later(self) -> None:
        with self._rebuild_lock:
            self._needs_rebuild = True

    def _remember_counted(self, partitions: Iterable[int]) -> None:
        """Before dropping partitions uncommitted: what this process counted already."""
        for p in partitions:
            marks = self.pipeline.counted_through(p)
            if marks is not None:
                old = self.counted.get(p, marks)
                self.counted[p] = [max(a, b) for a, b in zip(marks, old, strict=True)]
