"""The consumer loop (kafka-python): poll both topics, decode, process, hand to the commits.

One consumer group subscribed to both input topics with the range assignor, so a
member holds the same partition numbers of both (they must have equal partition
counts; checked at start). Values are read as raw bytes and parsed here, so a poison
pill is dead-lettered instead of blocking its partition. Auto-commit is off: what is
published and committed, and when, is the commit protocol's (``commits.py``).

Threads: kafka-python runs rebalance callbacks on its IO thread; they go to the commit
protocol, which takes the producer lock and then the state lock, and never holds the
state lock while waiting on the broker. This (main) thread polls with no lock held.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from kafka.consumer.subscription_state import AsyncConsumerRebalanceListener
from kafka.coordinator.assignors.range import RangePartitionAssignor
from kafka.errors import KafkaError, KafkaTimeoutError, RetriableError

from service.broker import compat, waits
from service.broker.audit_state import AuditStateReader, ensure_topic
from service.broker.commits import CommitProtocol
from service.broker.hanging import HangingOffsets
from service.broker.publisher import make_publisher
from service.config import Settings
from service.core.state import ServiceState
from service.errors import ConfigError, EventError
from service.mapping.mapper import load_mapper
from service.stream.events import decode_feedback, decode_query
from service.stream.mined import LabelRecorder
from service.stream.records import take_records
from service.stream.topics import FEEDBACK, QUERIES
from service.stream.watermark import NEVER

log = logging.getLogger("retrieval_monitor.kafka")

KAFKA_RETRY_S = 1.0
"""Back-off after a retriable Kafka error (e.g. the broker is restarting) before retrying."""
ADVANCE_EVERY_MS = 500
"""Wall time between finalisations (and at every commit): in catch-up a poll brings 2,000
records and closes a few windows, and finalising them a poll at a time cost twice as
much per window as finalising many at once (which equals it: lateness is decided by
the watermark when a record arrives, not by when windows are finalised)."""


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
    """Rebalance callbacks (kafka-python's IO thread): each is the commit protocol's."""

    def __init__(self, commits: CommitProtocol) -> None:
        self.commits = commits

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self.commits.revoked(revoked)

    async def on_partitions_assigned(self, assigned: Any) -> None:
        await self.commits.assigned(assigned)

    async def on_partitions_lost(self, lost: Any) -> None:
        self.commits.drop({tp.partition for tp in lost})


class KafkaEdge:
    """The consumer loop around the monitor of a :class:`ServiceState`."""

    def __init__(self, settings: Settings, state: ServiceState) -> None:
        compat.check_version()
        self.settings = settings
        self.state = state
        self.pipeline = state.pipeline
        self.lock = state.lock
        self.topics = (settings.queries_topic, settings.feedback_topic)
        self.mapper = load_mapper(settings.input_mapping)
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
                session_timeout_ms=settings.session_timeout_ms,
                heartbeat_interval_ms=max(100, min(3000, settings.session_timeout_ms // 3)),
                client_id="retrieval-monitor",
                **compat.NO_CLIENT_METRICS,
            )
            compat.lean_records(self.consumer)
            publisher = make_publisher(
                client,
                settings.windows_topic,
                settings.deadletter_topic,
                transactional=settings.exactly_once,
                transactional_id=settings.transactional_id
                or f"{settings.group_id}-{socket.gethostname()}-{settings.http_port}",
            )
            self._client = client
            if self.pipeline.config.join.early_age_ms is not None:
                publisher.early_topic = settings.early_topic
            if settings.audit_rate > 0:
                publisher.audit_state_topic = settings.audit_state_topic
                self.pipeline.audit_state = True
                if settings.audit_topic:
                    publisher.audit_topic = settings.audit_topic
                    self.pipeline.keep_audit_requests([])
            if settings.labels_topic:
                publisher.labels_topic = settings.labels_topic
                self.pipeline.recorder = LabelRecorder(settings.labels_query_text)
        except KafkaError as error:
            raise ConfigError(
                f"cannot connect to Kafka at {settings.kafka_bootstrap_servers} ({error}): "
                "the broker did not answer, or refused the connection's security (a listener "
                f"that is not {settings.kafka_security_protocol}, a TLS certificate not "
                "trusted by --kafka-ssl-cafile, or SASL credentials it does not accept); "
                "check --kafka-bootstrap-servers and the --kafka-security-* / "
                "--kafka-ssl-* / --kafka-sasl-* settings (the broker's log names the cause)"
            ) from None
        consumer = self.consumer
        self.commits = CommitProtocol(
            state,
            publisher,
            consumer,
            self.topics,
            HangingOffsets(lambda tps, wait_ms: compat.last_committed(consumer, tps, wait_ms)),
        )
        self._last_commit_ms = 0
        self._last_advance_ms = 0
        self._last_lag_ms = 0
        self._unfetched_since: dict[Any, int] = {}
        """Assigned topic partitions with no fetch answer yet, since when (wall ms)."""

    # -- start ---------------------------------------------------------------------------

    def start(self) -> int:
        """Check the topics and join the group; return the partition count."""
        try:
            counts = [
                compat.partitions_for_topic(self.consumer, t, waits.METADATA_WAIT_MS)
                for t in self.topics
            ]
        except KafkaTimeoutError:
            raise ConfigError(
                f"Kafka at {self.settings.kafka_bootstrap_servers} did not describe the topics "
                f"{' and '.join(map(repr, self.topics))} within "
                f"{waits.METADATA_WAIT_MS // 1000} s: the broker is unreachable or overloaded; "
                "the service exits so that its supervisor starts it again"
            ) from None
        n = check_copartitioned(
            len(counts[0]) if counts[0] else None,
            len(counts[1]) if counts[1] else None,
            self.settings,
        )
        log.info("topics %s and %s have %d partitions each", *self.topics, n)
        if self.settings.audit_rate > 0:  # (before joining: a take-over reads it)
            ensure_topic(self._client, self.settings.audit_state_topic, n)
            self.commits.audit_reader = AuditStateReader(
                self._client, self.settings.audit_state_topic
            )
        self.consumer.subscribe(list(self.topics), listener=_Listener(self.commits))
        return n

    # -- the loop ------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Poll, process, publish, commit until ``stop`` is set; then hand everything over."""
        settings = self.settings
        state = self.state
        while not stop.is_set():
            compat.unpark_resumed(self.consumer)
            try:
                with state.waiting_on_broker("poll", waits.poll_limit_ms(settings)):
                    batch = self.consumer.poll(
                        timeout_ms=settings.poll_timeout_ms, max_records=settings.max_poll_records
                    )
            except RetriableError as error:  # e.g. the broker is down: retry, stay in place
                log.warning("polling Kafka failed (%s); retrying in %.0f s", error, KAFKA_RETRY_S)
                state.broker_seen(False)
                state.beat()
                stop.wait(KAFKA_RETRY_S)
                continue
            state.broker_seen(compat.broker_connected(self.consumer))
            now = state.wall_ms()

            def work(batch: dict[Any, list[Any]] = batch, now: int = now) -> None:
                self.state.health.last_poll_ms = now
                for tp, records in batch.items():
                    self._process(tp, records)

            due = now - self._last_commit_ms >= settings.commit_interval_ms
            advance = due or now - self._last_advance_ms >= ADVANCE_EVERY_MS
            with state.waiting_on_broker("commit", waits.commit_limit_ms()):
                if self.commits.cycle(work, commit=due, advance=advance):
                    self._last_commit_ms = now
            if advance:
                self._last_advance_ms = now
            with state.waiting_on_broker("rebuild", waits.rebuild_limit_ms()):
                self.commits.rebuild_if_needed()
            if now - self._last_lag_ms >= 1000:
                partitions = len(self.consumer.assignment())
                with state.waiting_on_broker("lag", waits.lag_limit_ms(partitions)):
                    self._update_lag()
                self._last_lag_ms = now
            if batch or state.health.paused:
                self._balance()
            state.beat()
        self.close()

    def close(self) -> None:
        """Clean stop: publish, commit, leave the group."""
        self.commits.cycle(lambda: None, commit=True)
        self.consumer.unsubscribe()
        self.consumer.close(autocommit=False)
        self.commits.publisher.close()
        if self.commits.audit_reader is not None:
            self.commits.audit_reader.close()

    def _process(self, tp: Any, records: Iterable[Any]) -> None:
        """Decode and take one topic partition's records (under both locks)."""
        partition = tp.partition
        if not self.pipeline.owns(partition):
            return  # revoked while these were in flight
        is_query = tp.topic == self.topics[0]
        decode: Callable[[bytes], Any]
        if self.mapper is None:
            decode = decode_query if is_query else decode_feedback
        else:
            decode = self.mapper.decode_query if is_query else self.mapper.decode_feedback
        topic = QUERIES if is_query else FEEDBACK
        records = list(records)
        failures = take_records(
            self.pipeline, partition, ((topic, r.offset, r.value) for r in records), decode
        )
        # a re-read record was dead-lettered by the owner that first read it
        for position, failure in failures:  # (in offset order)
            record = records[position]
            if self.pipeline.is_new(partition, topic, record.offset):
                self._dead_letter(record, failure)

    def _dead_letter(self, record: Any, error: EventError) -> None:
        where = f"{record.topic}[{record.partition}]@{record.offset}"
        log.warning("dead-lettered %s: %s: %s", where, error.reason, error)
        self.commits.dead_letter(record, error)
        self.state.health.deadletters += 1

    def _balance(self) -> None:
        """Backpressure: pause a topic partition whose event time runs ahead of the other.

        While one topic of a partition is read far behind the other, the leading one fills
        the pending state (queries waiting for feedback that is still unread, or orphan
        feedback waiting for queries). It is paused while it leads by more than
        ``max_topic_lead`` and the other still has a backlog, and resumed once the other
        is within half of that or has caught up. The consumer keeps polling (paused
        partitions are simply not fetched), so it stays in the group.
        """
        lead = self.settings.max_topic_lead_ms
        if lead <= 0:
            return
        paused = {(tp.topic, tp.partition) for tp in self.consumer.paused()}
        pause, resume = [], []
        with self.lock:
            lag = self.state.health.lag
            for p in self.pipeline.partitions():
                latest = self.pipeline.latest_event_ms(p)
                for topic, other in ((QUERIES, FEEDBACK), (FEEDBACK, QUERIES)):
                    key = (self.topics[topic], p)
                    mine, theirs = latest[topic], latest[other]
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
        now_paused = {(tp.topic, tp.partition) for tp in self.consumer.paused()}
        with self.lock:
            self.state.health.paused = now_paused

    def _note_unfetched(self, tp: Any) -> None:
        """Log (once) a partition left without a fetch answer while the broker answers."""
        now = self.state.wall_ms()
        since = self._unfetched_since.setdefault(tp, now)
        if 0 <= now - since - UNFETCHED_WARN_MS < 1000 and self.state.health.broker_connected:
            log.warning(
                "%s[%s] has had no fetch answer for %d s with the broker up: %s",
                tp.topic,
                tp.partition,
                (now - since) // 1000,
                compat.fetch_state(self.consumer, tp),
            )

    def _update_lag(self) -> None:
        """Lag per topic partition; one with a backlog (or not yet known) is never idle."""
        lag: dict[tuple[str, int], int] = {}
        unknown: set[tuple[str, int]] = set()
        for tp in self.consumer.assignment():
            high = self.consumer.highwater(tp)
            try:  # position() may wait for committed offsets: never for long here
                position = (
                    self.consumer.position(tp, timeout_ms=waits.LAG_WAIT_MS)
                    if high is not None
                    else None
                )
            except KafkaError:
                position = None
            if high is None or position is None:
                unknown.add((tp.topic, tp.partition))  # no fetch response yet
                self._note_unfetched(tp)
            else:
                self._unfetched_since.pop(tp, None)
                lag[tp.topic, tp.partition] = max(0, high - position)
        with self.lock:
            self.state.health.lag = lag
            for topic, partition in [*lag, *unknown]:
                kind = QUERIES if topic == self.topics[0] else FEEDBACK
                behind = (topic, partition) in unknown or lag[topic, partition] > 0
                self.pipeline.set_backlog(partition, kind, behind)


UNFETCHED_WARN_MS = 60_000
"""A partition assigned this long without a fetch answer while the broker answers is
logged once, with what kafka-python's fetcher holds for it."""


def _names(tps: Iterable[Any]) -> str:
    return ", ".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(tps))
