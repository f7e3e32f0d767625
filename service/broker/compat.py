"""Everything that reaches into kafka-python's private attributes, in one place (with
:mod:`.records`, its fetched records unpacked leanly).

kafka-python's public API waits without a limit on transactional requests, has no way
to commit offsets or fetch committed offsets from inside a rebalance callback (which
runs on its IO thread), parks fetched records of paused partitions in a way that can
starve them after a resume, and unpacks fetched records at a high cost per record. The
service works around each through the internals below, written for kafka-python 3.0:
:func:`check_version` refuses any other version at start, with the version found and
the one to install.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any, Protocol

import kafka
from kafka import KafkaConsumer, KafkaProducer
from kafka.errors import CoordinatorNotAvailableError, KafkaTimeoutError
from kafka.protocol.consumer import OffsetFetchRequest

from service.broker.records import LeanPartitionRecords
from service.errors import ConfigError

log = logging.getLogger("retrieval_monitor.kafka")

SUPPORTED_SERIES = (3, 0)
"""The kafka-python release series these internals were written for."""

NO_CLIENT_METRICS = {"metrics_enabled": False}
"""For the service's consumers and producer: kafka-python's own client metrics (sensors
recorded on every fetch, batch and request) are never read here (the service exports its
own), and recording them took about 1.5% of ``run``'s interpreter time (the producer's
sender thread spent an eighth of its time in ``Sensor.record``)."""


def check_version(version: str = kafka.__version__) -> None:
    """Raise ConfigError unless ``version`` is a kafka-python 3.0.x release."""
    try:
        series = tuple(int(part) for part in version.split(".")[:2])
    except ValueError:
        series = ()
    if series != SUPPORTED_SERIES:
        major, minor = SUPPORTED_SERIES
        raise ConfigError(
            f"kafka-python {version} is installed, but the Kafka edge relies on internals of "
            f"kafka-python {major}.{minor}.x (service/broker/compat.py); install it with "
            f"pip install 'kafka-python>={major}.{minor}.12,<{major}.{minor + 1}'"
        )


class Pending(Protocol):
    """A request of kafka-python's transaction manager (``TransactionalRequestResult``)."""

    def wait(self, timeout_ms: int | None = None) -> bool:
        """True once answered (successfully or not) within ``timeout_ms``."""


# -- the consumer ----------------------------------------------------------------------------


async def commit_in_callback(consumer: KafkaConsumer, offsets: Mapping[Any, Any]) -> None:
    """Commit ``offsets`` from a rebalance callback (the coordinator's async commit)."""
    await consumer._coordinator._commit_offsets_sync_async(dict(offsets))


async def committed_in_callback(
    consumer: KafkaConsumer, partitions: set[Any], timeout_ms: int
) -> dict[Any, Any]:
    """The committed offsets (with metadata) of ``partitions``, from a rebalance callback."""
    coordinator = consumer._coordinator
    committed: dict[Any, Any] = await coordinator.fetch_committed_offsets_async(
        partitions, timeout_ms=timeout_ms
    )
    return committed


def last_committed(
    consumer: KafkaConsumer, partitions: set[Any], timeout_ms: int
) -> dict[Any, Any]:
    """The last committed offsets (with metadata) of ``partitions``, leaving out offsets
    committed in transactions that have no marker yet, or KafkaTimeoutError after
    ``timeout_ms``.

    A ``read_committed`` consumer's fetch asks the broker for stable offsets only
    (``require_stable``), and the broker answers ``UNSTABLE_OFFSET_COMMIT`` while any
    transaction that committed offsets of the partition has no marker on the offsets
    partition, for as long as that lasts (for ever when the broker skipped the marker:
    :meth:`~service.broker.commits.CommitProtocol.rebuild_if_needed`). This is the same
    request without ``require_stable``: the broker answers with what is committed.
    """
    coordinator = consumer._coordinator  # 3.0.x internals: the coordinator, its manager
    manager = coordinator._manager
    if not partitions:
        return {}
    by_topic: dict[str, list[int]] = {}
    for tp in partitions:
        by_topic.setdefault(tp.topic, []).append(tp.partition)

    async def fetch() -> dict[Any, Any]:
        if not await coordinator.ensure_coordinator_ready_async(timeout_ms=timeout_ms):
            raise KafkaTimeoutError(f"no group coordinator within {timeout_ms} ms")
        node_id = coordinator.coordinator()
        if node_id is None:
            raise CoordinatorNotAvailableError()
        group = OffsetFetchRequest.OffsetFetchRequestGroup
        request = OffsetFetchRequest(
            group_id=coordinator.group_id,
            topics=[
                OffsetFetchRequest.OffsetFetchRequestTopic(name=t, partition_indexes=p)
                for t, p in by_topic.items()
            ],
            groups=[
                group(
                    group_id=coordinator.group_id,
                    topics=[
                        group.OffsetFetchRequestTopics(name=t, partition_indexes=p)
                        for t, p in by_topic.items()
                    ],
                )
            ],
            require_stable=False,
            min_version=0,
            max_version=8,
        )
        response = await manager.send(request, node_id=node_id)
        offsets: dict[Any, Any] = coordinator._handle_offset_fetch_response(response)
        return offsets

    async def bounded() -> dict[Any, Any]:
        found: dict[Any, Any] = await manager.wait_for(manager.call_soon(fetch), timeout_ms)
        return found

    found: dict[Any, Any] = consumer._net.run(bounded)
    return found


def partitions_for_topic(consumer: KafkaConsumer, topic: str, timeout_ms: int) -> set[int]:
    """The partitions of ``topic`` (empty if it does not exist), or KafkaTimeoutError
    after ``timeout_ms``. ``KafkaConsumer.partitions_for_topic`` waits for its metadata
    fetch without a limit, and in 3.0.12 that wait was seen to last for ever after the
    broker had restarted. The same steps as it takes, each bounded by what is left."""
    cluster = consumer._cluster  # 3.0.x internals: ClusterMetadata, its manager and loop
    partitions = cluster.partitions_for_topic(topic)
    if partitions is None:
        deadline = time.monotonic() + timeout_ms / 1000

        def fetch() -> None:
            left_ms = max(1, int((deadline - time.monotonic()) * 1000))
            consumer._net.run(consumer._manager.wait_for, cluster.request_update(), left_ms)

        if cluster.metadata_refresh_in_progress:  # a fetch of some topics only: let it end
            fetch()
        stash = cluster.need_all_topic_metadata
        cluster.need_all_topic_metadata = True
        try:
            fetch()
        finally:
            cluster.need_all_topic_metadata = stash
        partitions = cluster.partitions_for_topic(topic)
    return set(partitions or ())


def broker_connected(consumer: KafkaConsumer) -> bool:
    """Whether the consumer has a connection up to any broker it knows of (before it
    knows any, to the bootstrap servers)."""
    client = consumer._client  # a 3.0.x internal: KafkaClient
    brokers = client.cluster.brokers()
    if not brokers:
        return bool(client.bootstrap_connected())
    return any(client.connected(broker.node_id) for broker in brokers)


def fetch_state(consumer: KafkaConsumer, tp: Any) -> str:
    """What kafka-python's fetcher holds for ``tp``, for a log line when a partition goes
    unfetched: its subscription state and where buffered data of it waits."""
    subscription = consumer._subscription
    fetcher = consumer._fetcher
    state = subscription.assignment.get(tp)
    if state is None:
        return "not assigned"
    current = fetcher._next_partition_records
    facts = {
        "paused": state.paused,
        "valid position": state.has_valid_position,
        "awaiting reset": state.awaiting_reset,
        "fetchable": state.is_fetchable(),
        "completed fetch queued": any(
            f.topic_partition == tp for f in list(fetcher._completed_fetches)
        ),
        "in line": current is not None and current.topic_partition == tp,
        "parked": tp in fetcher._paused_partition_records
        or tp in fetcher._paused_completed_fetches,
    }
    return ", ".join(f"{name} {value}" for name, value in facts.items())


def seek_afresh(consumer: KafkaConsumer, tp: Any, offset: int | None) -> None:
    """Seek ``tp`` to ``offset`` (None: its beginning) and forget its high watermark.

    kafka-python keeps the high watermark of the last fetch answer across a seek. After
    a rebuild seeks back to the commit, that stale figure can equal the committed offset
    (the partition was read to its end when it was committed) while the log has grown
    since: the lag would read 0 and the partition would count as caught up, and idle,
    before a single record was fetched again, so that windows could close without the
    feedback still to be read (seen once in the suite's broker-fault test, after the
    settling of hanging offsets). Forgotten, the lag is unknown until a fetch answers.
    """
    if offset is None:
        consumer.seek_to_beginning(tp)
    else:
        consumer.seek(tp, offset)
    subscription = getattr(consumer, "_subscription", None)  # a 3.0.x internal
    state = None if subscription is None else subscription.assignment.get(tp)
    if state is not None:
        state.highwater = None


def lean_records(consumer: KafkaConsumer) -> None:
    """Have ``consumer`` unpack fetched record batches the lean way (:mod:`.records`).

    ``Fetcher`` builds each fetched partition's records with its class attribute
    ``PartitionRecords``; this consumer's fetcher gets the subclass instead.
    """
    consumer._fetcher.PartitionRecords = LeanPartitionRecords


def unpark_resumed(consumer: KafkaConsumer) -> None:
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


# -- the producer ----------------------------------------------------------------------------


def send_offsets(producer: KafkaProducer, offsets: Mapping[Any, Any], metadata: Any) -> Pending:
    """Start adding consumer offsets to the open transaction (not waiting for it)."""
    pending: Pending = producer._transaction_manager.send_offsets_to_transaction(
        dict(offsets), metadata
    )
    return pending


def begin_commit(producer: KafkaProducer) -> Pending:
    """Start committing the open transaction (not waiting for it)."""
    pending: Pending = producer._transaction_manager.begin_commit()
    return pending


def begin_abort(producer: KafkaProducer) -> Pending:
    """Start aborting the open transaction (not waiting for it)."""
    pending: Pending = producer._transaction_manager.begin_abort()
    return pending


def wake_sender(producer: KafkaProducer) -> None:
    """Make the sender thread send a request just queued, instead of at its next wake-up."""
    producer._sender.wakeup()


def stop_sender(producer: KafkaProducer, timeout_s: float = 5.0) -> None:
    """Stop the sender thread now, dropping what it has not sent.

    ``close(timeout=0)`` alone does not: it first flushes, which raises while records
    are pending, and leaves the sender thread running (and retrying).
    """
    sender = producer._sender
    sender.force_close()
    sender.join(timeout_s)
