"""The Kafka edge (kafka-python): consume both topics, publish windows and dead letters.

One consumer group subscribed to both input topics with the range assignor, so a
member holds the same partition numbers of both (they must have equal partition
counts; checked at start). Values are read as raw bytes and parsed here, so a poison
pill is dead-lettered instead of blocking its partition. Auto-commit is off: after
closed windows are published and flushed, the lowest offsets still needed are
committed with the restart markers (``service.stream.offsets``).

Threads: kafka-python runs rebalance callbacks on its IO thread. The pipeline lock is
never held while this (main) thread waits on the consumer, so a callback that takes
the lock cannot deadlock with it; callbacks publish with the producer (its own thread)
and commit through the coordinator's async API.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Iterable
from typing import Any

import orjson
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.consumer.subscription_state import AsyncConsumerRebalanceListener
from kafka.coordinator.assignors.range import RangePartitionAssignor
from kafka.errors import KafkaError, RetriableError
from kafka.structs import OffsetAndMetadata

from service.broker.failpoints import failpoint
from service.broker.history import read_window_history
from service.broker.publisher import Publisher
from service.config import Settings
from service.errors import ConfigError, EventError
from service.state import ServiceState
from service.stream.events import decode_feedback, decode_query
from service.stream.offsets import commit_plan, restart_from
from service.stream.topics import FEEDBACK, QUERIES
from service.stream.watermark import NEVER
from service.stream.windows import ClosedWindow

log = logging.getLogger("retrieval_monitor.kafka")

KAFKA_RETRY_S = 1.0
"""Back-off after a retriable Kafka error (e.g. the broker is restarting) before retrying."""
COMMITTED_WAIT_MS = 30_000
"""How long one fetch of the committed offsets may take before it is retried later."""


def check_copartitioned(queries: int | None, feedback: int | None, settings: Settings) -> int:
    """Refuse to run unless both input topics exist with the same partition count."""
    names = (settings.queries_topic, settings.feedback_topic)
    for name, count in zip(names, (queries, feedback), strict=True):
        if not count:
            raise ConfigError(
                f"topic {name!r} does not exist on {settings.kafka_bootstrap_servers}; create it "
                f"with as many partitions as {names[1] if name == names[0] else names[0]!r}"
            )
    if queries != feedback:
        raise ConfigError(
            f"topics {names[0]!r} ({queries} partitions) and {names[1]!r} ({feedback} partitions) "
            "must have the same partition count: a query and its feedback are joined by "
            "partition number. Add partitions to the smaller one (kafka-topics --alter "
            "--partitions N) and make the producers key both topics by query_id."
        )
    return queries or 0


class _Listener(AsyncConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, edge: KafkaEdge) -> None:
        self.edge = edge

    async def on_partitions_revoked(self, revoked: Any) -> None:
        offsets = self.edge.hand_over({tp.partition for tp in revoked})
        if offsets:  # at-least-once mode: commit through the coordinator's async API
            try:
                await self.edge.consumer._coordinator._commit_offsets_sync_async(offsets)
            except Exception as error:  # the new owner re-reads from the older commit
                log.warning("commit on revoke failed (%s); the next owner re-reads more", error)

    async def on_partitions_assigned(self, assigned: Any) -> None:
        tps = set(assigned)
        coordinator = self.edge.consumer._coordinator
        try:
            committed = await coordinator.fetch_committed_offsets_async(
                tps, timeout_ms=COMMITTED_WAIT_MS
            )
        except KafkaError as error:  # e.g. offsets of a transaction still pending
            self.edge.take_over_later({tp.partition for tp in tps}, error)
            return
        self.edge.take_over(tps, committed)

    async def on_partitions_lost(self, lost: Any) -> None:
        self.edge.drop({tp.partition for tp in lost})


class KafkaEdge:
    """Consumer loop around the pipeline of a :class:`ServiceState`."""

    def __init__(self, settings: Settings, state: ServiceState) -> None:
        self.settings = settings
        self.state = state
        self.pipeline = state.pipeline
        self.lock = state.lock
        self.topics = (settings.queries_topic, settings.feedback_topic)
        client = settings.kafka_client_config()
        try:
            self.consumer = KafkaConsumer(
                **client,
                group_id=settings.group_id,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                # also makes offset fetches wait for commits still being written
                isolation_level="read_committed",
                partition_assignment_strategy=[RangePartitionAssignor],
                max_poll_records=settings.max_poll_records,
                session_timeout_ms=settings.session_timeout,
                heartbeat_interval_ms=max(100, min(3000, settings.session_timeout // 3)),
                client_id="retrieval-monitor",
            )
            self.publisher = Publisher(
                client,
                settings.windows_topic,
                settings.deadletter_topic,
                transactional=settings.exactly_once,
                transactional_id=settings.transactional_id
                or f"{settings.group_id}-{socket.gethostname()}-{settings.http_port}",
            )
        except KafkaError as error:
            raise ConfigError(
                f"cannot connect to Kafka at {settings.kafka_bootstrap_servers} ({error}): "
                "the broker did not answer, or refused the connection's security (a listener "
                f"that is not {settings.kafka_security_protocol}, a TLS certificate not "
                "trusted by --kafka-ssl-cafile, or SASL credentials it does not accept); "
                "check --kafka-bootstrap-servers and the --kafka-security-* / "
                "--kafka-ssl-* / --kafka-sasl-* settings (the broker's log names the cause)"
            ) from None
        # Lock order: producer lock, then the pipeline lock. The producer lock serialises
        # every use of the (transactional) producer between this thread and callbacks.
        self._producer_lock = threading.Lock()
        self._unconfirmed: list[ClosedWindow] = []
        self._history: dict[int, list[ClosedWindow]] = {}
        """Windows read back at start, by partition, until the partition is assigned."""
        self._counted: dict[int, list[int]] = {}
        """Per partition dropped without a commit: offsets (queries, feedback) below which
        this process already counted the records; re-reading them counts nothing again."""
        self._needs_rebuild = False
        self._last_commit_ms = 0
        self._last_lag_ms = 0

    # -- start ---------------------------------------------------------------------------

    def start(self) -> None:
        """Check the topics, read back recent windows, and join the group."""
        counts = [self.consumer.partitions_for_topic(t) for t in self.topics]
        n = check_copartitioned(
            len(counts[0]) if counts[0] else None,
            len(counts[1]) if counts[1] else None,
            self.settings,
        )
        log.info("topics %s and %s have %d partitions each", *self.topics, n)
        self._history = read_window_history(
            self.settings.kafka_client_config(),
            self.settings.windows_topic,
            self.state.wall_ms() - self.state.monitor.history_ms,
        )
        self.consumer.subscribe(list(self.topics), listener=_Listener(self))

    # -- rebalance callbacks (IO thread) -------------------------------------------------

    def take_over(self, assigned: set[Any], committed: dict[Any, Any]) -> None:
        """Start newly assigned partitions from their committed offsets and markers."""
        partitions = {tp.partition for tp in assigned}
        by_topic = {t: {tp.partition for tp in assigned if tp.topic == t} for t in self.topics}
        if by_topic[self.topics[0]] != by_topic[self.topics[1]]:
            log.error("assignment is not co-partitioned: %s", sorted(map(str, assigned)))
        with self.lock:
            for p in sorted(partitions):
                if p in self.pipeline.streams:
                    continue
                tps = [TopicPartition(t, p) for t in self.topics]
                meta = [committed.get(tp) for tp in tps]
                restart = restart_from(*(m.metadata if m is not None else None for m in meta))
                self.pipeline.assign(
                    p, restart.published_through_ms, restart.counted_from, restart.waiting_offsets
                )
                counted = self._counted.pop(p, None)
                if counted is not None:  # dead letters of an aborted transaction go again
                    stream = self.pipeline.streams[p]
                    merged = zip(counted, stream.counted_from, strict=True)
                    stream.counted_from = [max(a, b) for a, b in merged]
                # what earlier owners published and committed (later windows come again)
                history = self._history.pop(p, [])
                self.pipeline.restore(
                    w for w in history if w.end_ms <= restart.published_through_ms
                )
                # Always restart from the commit: a partition kept across an eager
                # rebalance would otherwise continue from its position, and the state
                # dropped on revoke would never be rebuilt.
                for tp, m in zip(tps, meta, strict=True):
                    if m is None or m.offset is None or m.offset < 0:
                        self.consumer.seek_to_beginning(tp)
                    else:
                        self.consumer.seek(tp, m.offset)
            self.state.health.assigned = len(self.pipeline.streams)
        log.info("assigned partitions %s", sorted(partitions))

    def take_over_later(self, partitions: set[int], error: Exception) -> None:
        """The committed offsets of newly assigned partitions could not be fetched.

        The loop fetches them again (:meth:`_rebuild` takes over every assigned partition
        without state); until then their records are skipped (the take-over seeks back to
        the commit).
        """
        log.warning(
            "fetching the committed offsets of partitions %s failed (%s); retrying",
            sorted(partitions),
            error,
        )
        self._needs_rebuild = True

    def hand_over(self, partitions: set[int]) -> dict[Any, OffsetAndMetadata]:
        """Publish what is closed, commit, and drop the partitions.

        Returns the offsets still to commit through the coordinator (at-least-once mode);
        in transactional mode they are committed here, with the windows.
        """
        with self._producer_lock:
            with self.lock:
                self._send(self.pipeline.advance())
                offsets = self._offsets(set(self.pipeline.streams))
            committed = True
            try:
                self.publisher.commit(offsets, self.consumer.group_metadata, None)
            except Exception as error:  # the next owner re-reads from the older commit
                log.warning("commit on revoke failed (%s); the next owner re-reads more", error)
                self.publisher.abort()
                offsets, committed = {}, self.publisher.transactional is False
            with self.lock:
                if committed:
                    self._confirm()
                else:  # aborted: never visible to read_committed readers, so not counted
                    self._unconfirmed = []
                for p in partitions:
                    self.pipeline.revoke(p)
                self.state.health.assigned = len(self.pipeline.streams)
            log.info("revoked partitions %s", sorted(partitions))
        return {} if self.publisher.transactional else offsets

    def drop(self, partitions: set[int]) -> None:
        """Partitions were lost (another member owns them): drop state, commit nothing.

        The open transaction may hold their windows: it is aborted, and every partition
        still assigned is rebuilt from its last commit.
        """
        with self._producer_lock:
            self.publisher.abort()
            with self.lock:
                self._unconfirmed = []
                self._remember_counted(partitions)
                for p in partitions:
                    self.pipeline.revoke(p)
                self.state.health.assigned = len(self.pipeline.streams)
        if self.publisher.transactional and self.pipeline.streams:
            self._needs_rebuild = True
        log.warning("lost partitions %s; their state was dropped", sorted(partitions))

    # -- the loop ------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Poll, process, publish, commit until ``stop`` is set; then hand everything over."""
        settings = self.settings
        while not stop.is_set():
            _unpark(self.consumer)
            try:
                batch = self.consumer.poll(
                    timeout_ms=settings.poll_timeout, max_records=settings.max_poll_records
                )
            except RetriableError as error:  # e.g. the broker is down: retry, stay in place
                log.warning("polling Kafka failed (%s); retrying in %.0f s", error, KAFKA_RETRY_S)
                self.state.beat()
                stop.wait(KAFKA_RETRY_S)
                continue
            now = self.state.wall_ms()
            with self._producer_lock:
                with self.lock:
                    self.state.health.last_poll_ms = now
                    for tp, records in batch.items():
                        self._process(tp, records)
                    self._send(self.pipeline.advance())
                    # Closed windows ride in the open transaction until the next commit:
                    # committing per poll would cost a transaction per batch in catch-up.
                    due = now - self._last_commit_ms >= settings.commit_interval
                    offsets = self._offsets(set(self.pipeline.streams)) if due else None
                if offsets is not None and self.publisher.transactional:
                    self._commit(offsets)
            if offsets is not None and not self.publisher.transactional:
                self._commit(offsets)  # blocks on the consumer: outside the locks
            if offsets is not None:
                self._last_commit_ms = now
            if self._needs_rebuild:
                self._needs_rebuild = False
                self._rebuild()
            if now - self._last_lag_ms >= 1000:
                self._update_lag()
                self._last_lag_ms = now
            if batch or self.state.health.paused:
                self._balance()
            self.state.beat()
        self.close()

    def close(self) -> None:
        """Clean stop: publish, commit, leave the group."""
        with self._producer_lock:
            with self.lock:
                self._send(self.pipeline.advance())
                offsets = self._offsets(set(self.pipeline.streams))
            if self.publisher.transactional:
                self._commit(offsets)
        if not self.publisher.transactional:
            self._commit(offsets)
        self.consumer.unsubscribe()
        self.consumer.close(autocommit=False)
        self.publisher.close()

    def _process(self, tp: Any, records: Iterable[Any]) -> None:
        partition = tp.partition
        if partition not in self.pipeline.streams:
            return  # revoked while these were in flight
        is_query = tp.topic == self.topics[0]
        decode = decode_query if is_query else decode_feedback
        take = self.pipeline.query if is_query else self.pipeline.feedback
        topic = QUERIES if is_query else FEEDBACK
        for record in records:
            value = record.value
            try:
                if value is None:
                    raise EventError("empty", "the record has no value (a tombstone?)")
                failure = take(partition, record.offset, decode(value))  # type: ignore[arg-type]
            except EventError as error:
                self.pipeline.invalid(partition, topic, record.offset, error.reason)
                failure = error
            # a re-read record was dead-lettered by the owner that first read it
            if failure is not None and self.pipeline.is_new(partition, topic, record.offset):
                self._dead_letter(record, failure)

    def _dead_letter(self, record: Any, error: EventError) -> None:
        where = f"{record.topic}[{record.partition}]@{record.offset}"
        log.warning("dead-lettered %s: %s: %s", where, error.reason, error)
        self.publisher.dead_letter(record, error)
        self.state.health.deadletters += 1

    def _send(self, windows: list[ClosedWindow]) -> None:
        """Send closed windows and move the markers (under both locks)."""
        if windows:
            self.publisher.windows(windows, self.pipeline.metric_keys)
            self.pipeline.mark_published(windows)
            self._unconfirmed.extend(windows)

    def _offsets(self, partitions: Iterable[int]) -> dict[Any, OffsetAndMetadata]:
        """The offsets and markers to commit, after closed windows were sent (both locks)."""
        out = {}
        for p in partitions:
            stream = self.pipeline.streams.get(p)
            if stream is None:
                continue
            for topic, (offset, metadata) in commit_plan(stream).items():
                out[TopicPartition(self.topics[topic], p)] = OffsetAndMetadata(offset, metadata, -1)
        return out

    def _confirm(self) -> None:
        """The sent windows are durable: count them (under the pipeline lock)."""
        self.pipeline.confirm_published(self._unconfirmed)
        self._unconfirmed = []

    def _commit(self, offsets: dict[Any, OffsetAndMetadata]) -> None:
        if self._unconfirmed:  # only commits that carry windows are crash points
            failpoint("before-commit", f"{len(self._unconfirmed)} windows uncommitted")
        try:
            self.publisher.commit(offsets, self.consumer.group_metadata, self.consumer.commit)
        except Exception as error:
            if not self.publisher.transactional:  # records are out; a rebalance re-commits
                log.warning("commit failed (%s); will retry after the rebalance", error)
            else:
                log.warning("transaction failed (%s); rebuilding from the last commit", error)
                self.publisher.abort()
                self._needs_rebuild = True  # done outside the producer lock
                return
        if self._unconfirmed:
            failpoint("after-commit", f"{len(self._unconfirmed)} windows committed, uncounted")
        with self.lock:
            self._confirm()

    def _rebuild(self) -> None:
        """Drop all state and restart every partition from its last committed offsets.

        Every partition assigned to the consumer is taken over, so also those whose
        committed offsets a rebalance could not fetch. If the fetch fails again (the
        broker is away), it is retried on a later loop, and the partitions stay without
        state until then.
        """
        with self.lock:
            dropped = set(self.pipeline.streams)
            self._remember_counted(dropped)
            for p in dropped:
                self.pipeline.revoke(p)
            self._unconfirmed = []
            self.state.health.assigned = 0
        tps = set(self.consumer.assignment())  # a rebalance may have moved some
        if not tps:
            return
        try:
            committed = {
                tp: self.consumer.committed(tp, metadata=True, timeout_ms=COMMITTED_WAIT_MS)
                for tp in tps
            }
        except KafkaError as error:
            log.warning("fetching the committed offsets failed (%s); retrying", error)
            self._needs_rebuild = True
            return
        self.take_over(tps, {tp: m for tp, m in committed.items() if m is not None})

    def _remember_counted(self, partitions: set[int]) -> None:
        """Before dropping partitions uncommitted: what this process counted already."""
        for p in partitions:
            s = self.pipeline.streams.get(p)
            if s is not None:
                marks = [s.counted_through(t) for t in (QUERIES, FEEDBACK)]
                old = self._counted.get(p, marks)
                self._counted[p] = [max(a, b) for a, b in zip(marks, old, strict=True)]

    def _balance(self) -> None:
        """Backpressure: pause a topic partition whose event time runs ahead of the other.

        While one topic of a partition is read far behind the other, the leading one fills
        the pending state (queries waiting for feedback that is still unread, or orphan
        feedback waiting for queries). It is paused while it leads by more than
        ``max_topic_lead`` and the other still has a backlog, and resumed once the other
        is within half of that or has caught up. The consumer keeps polling (paused
        partitions are simply not fetched), so it stays in the group.
        """
        lead = self.settings.max_topic_lead
        if lead <= 0:
            return
        lag = self.state.health.lag
        paused = {(tp.topic, tp.partition) for tp in self.consumer.paused()}
        pause, resume = [], []
        with self.lock:
            for p, stream in self.pipeline.streams.items():
                wm = stream.watermark
                for topic, other in ((QUERIES, FEEDBACK), (FEEDBACK, QUERIES)):
                    key = (self.topics[topic], p)
                    mine, theirs = wm.max_ts(topic), wm.max_ts(other)
                    # before both have been read, the first fetch of the other is due
                    ahead = 0 if NEVER in (mine, theirs) else mine - theirs
                    behind = lag.get((self.topics[other], p), 1) > 0  # unknown: behind
                    if key in paused:
                        if not behind or ahead <= lead // 2:
                            resume.append(TopicPartition(*key))
                    elif behind and ahead > lead:
                        pause.append(TopicPartition(*key))
        assigned = self.consumer.assignment()
        if pause := [tp for tp in pause if tp in assigned]:
            self.consumer.pause(*pause)
            log.debug("paused %s: their event time leads the other topic", _names(pause))
        if resume := [tp for tp in resume if tp in assigned]:
            self.consumer.resume(*resume)
            log.debug("resumed %s", _names(resume))
        self.state.health.paused = {(tp.topic, tp.partition) for tp in self.consumer.paused()}

    def _update_lag(self) -> None:
        """Lag per topic partition; one with a backlog (or not yet known) is never idle."""
        lag: dict[tuple[str, int], int] = {}
        unknown: set[tuple[str, int]] = set()
        for tp in self.consumer.assignment():
            high = self.consumer.highwater(tp)
            try:  # position() may wait for committed offsets: never for long here
                position = self.consumer.position(tp, timeout_ms=1000) if high is not None else None
            except KafkaError:
                position = None
            if high is None or position is None:
                unknown.add((tp.topic, tp.partition))  # no fetch response yet
            else:
                lag[tp.topic, tp.partition] = max(0, high - position)
        with self.lock:
            self.state.health.lag = lag
            for topic, partition in [*lag, *unknown]:
                stream = self.pipeline.streams.get(partition)
                if stream is not None:
                    kind = QUERIES if topic == self.topics[0] else FEEDBACK
                    behind = (topic, partition) in unknown or lag[topic, partition] > 0
                    stream.watermark.set_backlog(kind, behind)


def _unpark(consumer: KafkaConsumer) -> None:
    """Work around a kafka-python 3.0 fetcher bug that starves resumed partitions.

    Records fetched for a partition that is then paused are parked (KAFKA-7548), and the
    partition is not fetched again until they are handed back. ``Fetcher`` hands them
    back only while its in-line slot ``_next_partition_records`` is ``None``, but it
    leaves drained objects there, so a resumed partition could stay parked, and unread,
    forever (seen here: a feedback partition's position frozen after a resume, its lag
    never shrinking). Before each poll, parked records of partitions no longer paused
    are dropped instead: their position never moved past them, so the next fetch reads
    them again from the broker.
    """
    fetcher = getattr(consumer, "_fetcher", None)
    parked = getattr(fetcher, "_paused_partition_records", None)
    if not parked:
        return
    subscription = getattr(consumer, "_subscription", None)
    if subscription is None:
        return
    for tp in [tp for tp in parked if not subscription.is_paused(tp)]:
        parked.pop(tp).drain()


def _names(tps: Iterable[Any]) -> str:
    return ", ".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(tps))


def produce_events(settings: Settings, events: Iterable[Any]) -> int:
    """Produce simulated events to the input topics, keyed by query id; return the count."""
    producer = KafkaProducer(**settings.kafka_client_config(), acks="all", linger_ms=20)
    topics = {"queries": settings.queries_topic, "feedback": settings.feedback_topic}
    n = 0
    try:
        for event in events:
            producer.send(
                topics[event.topic], key=event.key.encode(), value=orjson.dumps(event.event)
            )
            n += 1
        producer.flush()
    finally:
        producer.close()
    return n
