"""The global view: every replica follows the whole windows topic and the group's progress.

Each replica publishes the windows of the partitions it owns, in transactions that also
commit the group's offsets with a per-partition progress marker (``closed``: every window
of that input partition ending at or before it is on the topic). A follower thread reads
back *all* of it, whoever wrote it:

1. the window records of every partition of the windows topic (``read_committed``, the
   last record per key: every record of a key is identical), into the replica's
   :class:`~service.core.monitor.WindowView`;
2. every ``interval``, the group's committed offsets of both input topics (an admin
   OffsetFetch, which reads committed transactions only), whose markers say how far
   each input partition's windows are complete;
3. then the high watermark of every windows partition (read uncommitted, so it lies past
   every transaction that committed before step 2), and it reads on until its
   ``read_committed`` position passes all of them: only then are the windows behind that
   progress in the view, and the progress is applied. A transaction still open at that
   moment delays it until it ends (a commit interval, or the transaction timeout after a
   crash).

Since every replica applies the same committed records in the same order of boundaries,
every replica's rolling views, windows, comparisons and regressions are the same.

With a regressions topic (``run``), the follower first reads it whole into a ledger that
the detector takes back (:mod:`service.broker.ledger`: regressions opened or closed before
the windows read back survive a restart), and after each batch of boundaries it writes
the detector's new decisions to it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.errors import KafkaError

from service.broker import compat
from service.broker.ledger import LedgerWriter, read_ledger
from service.broker.waits import METADATA_WAIT_MS
from service.core.state import ServiceState
from service.stream.offsets import decode_metadata
from service.stream.watermark import NEVER
from service.stream.windows import ClosedWindow

log = logging.getLogger("retrieval_monitor.follower")

Observed = tuple[dict[int, int], dict[int, int], dict[TopicPartition, int]]
"""The group's committed progress (final, early windows), and the windows topics' ends."""


class WindowRecord(Protocol):
    """What the follower reads of a windows-topic record."""

    value: bytes
    timestamp: int
    offset: int
    partition: int


def decode_windows(records: Iterable[WindowRecord]) -> tuple[list[ClosedWindow], int, int | None]:
    """The windows in a batch of windows-topic records (the early windows' topic's too),
    how many records were not window records (logged with their place and skipped: the
    view goes on with the others), and the oldest record's timestamp (None without
    records)."""
    windows: list[ClosedWindow] = []
    bad = 0
    oldest = None
    for record in records:
        oldest = record.timestamp if oldest is None else min(oldest, record.timestamp)
        try:
            windows.append(ClosedWindow.from_json(record.value))
        except (ValueError, KeyError, TypeError) as error:
            bad += 1
            log.warning(
                "skipped a record of the windows topic that is not a window record "
                "(partition %d, offset %d: %s); only this service should write to that topic",
                record.partition,
                record.offset,
                error,
            )
    return windows, bad, oldest


def progress_of(committed: Mapping[Any, Any]) -> tuple[dict[int, int], dict[int, int]]:
    """Input partition -> its ``closed`` marker, and -> its ``early`` marker (the early
    windows' progress), over the commits of both topics."""
    closed: dict[int, int] = {}
    early: dict[int, int] = {}
    for tp, meta in committed.items():
        if meta is None or meta.offset is None or meta.offset < 0:
            continue
        markers = decode_metadata(meta.metadata)
        for out, through in (
            (closed, markers.closed_through_ms),
            (early, markers.early_through_ms),
        ):
            if through != NEVER:
                out[tp.partition] = max(out.get(tp.partition, NEVER), through)
    return closed, early


def first_offsets(
    consumer: KafkaConsumer, tps: list[TopicPartition], since_ms: int
) -> dict[TopicPartition, int]:
    """Where to start reading each partition: its first record from ``since_ms`` on, or,
    with none, its end as it was *before* that lookup. Taken the other way round, a
    transaction committed between the two requests (a replica's first windows, which
    create the topic, and the backlog's many windows in one transaction) would be
    skipped: no stable record from ``since_ms`` yet, then an end past them all."""
    ends = consumer.end_offsets(tps)
    starts = consumer.offsets_for_times(dict.fromkeys(tps, since_ms))
    return {tp: ends[tp] if starts.get(tp) is None else starts[tp].offset for tp in tps}


class WindowFollower:
    """Reads the windows topic and the group's progress into the state's window view."""

    def __init__(
        self,
        state: ServiceState,
        client: dict[str, Any],
        *,
        windows_topic: str,
        early_topic: str | None = None,
        group_id: str,
        input_topics: tuple[str, str],
        partitions: int,
        since_ms: int,
        interval_s: float,
        regressions_topic: str | None = None,
    ) -> None:
        self.state = state
        self.view = state.view
        self.windows_topic = windows_topic
        self.early_topic = early_topic
        """Where the early windows are (None: none are made)."""
        self.group_id = group_id
        self.inputs = [TopicPartition(t, p) for t in input_topics for p in range(partitions)]
        self.partitions = partitions
        self.interval_s = interval_s
        self._client = client
        self._since_ms = since_ms
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="window-follower", daemon=True)
        self.consumer = KafkaConsumer(
            **client,
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_committed",
            client_id="retrieval-monitor-follower",
            **compat.NO_CLIENT_METRICS,
        )
        compat.lean_records(self.consumer)
        self._ends = KafkaConsumer(  # read uncommitted: its end offsets are high watermarks
            **client,
            group_id=None,
            enable_auto_commit=False,
            client_id="retrieval-monitor-ends",
            **compat.NO_CLIENT_METRICS,
        )
        self.admin = KafkaAdminClient(**client, client_id="retrieval-monitor-progress")
        self.tps: list[TopicPartition] = []
        self.regressions_topic = regressions_topic
        self.writer = None if regressions_topic is None else LedgerWriter(client, regressions_topic)

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Assign every windows partition from ``since_ms`` on, and start reading."""
        self._assign()
        self._thread.start()

    def _assign(self) -> None:
        """Read every partition of the windows topics (none until both are there: they are
        created on first use)."""
        tps = []
        for topic in (self.windows_topic, self.early_topic):
            if topic is not None:
                found = compat.partitions_for_topic(self.consumer, topic, METADATA_WAIT_MS)
                if not found:
                    return
                tps += [TopicPartition(topic, p) for p in sorted(found)]
        self.tps = tps
        if self.tps:
            self.consumer.assign(self.tps)
            for tp, offset in first_offsets(self.consumer, self.tps, self._since_ms).items():
                self.consumer.seek(tp, offset)

    def stop(self) -> None:
        """Stop reading and close the clients."""
        self._stop.set()
        self._thread.join(timeout=10)
        if self.writer is not None:
            self.writer.close()
        for close in (self.consumer.close, self._ends.close, self.admin.close):
            try:
                close()
            except KafkaError as error:
                log.warning("closing the follower's clients failed: %s", error)

    # -- the loop (its own thread) -------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._follow()
        except Exception as error:  # a bug: say so on /healthz (a restart), do not hide it
            log.exception("the window follower stopped")
            with self.state.lock:
                self.state.health.failed = f"the window follower stopped: {error!r}"
            raise

    def _restore(self) -> None:
        """Read the regressions topic to its end, and give the detector its ledger (before
        any boundary is evaluated); a broker that cannot be read is tried again."""
        topic = self.regressions_topic
        while topic is not None and not self._stop.is_set():
            try:
                ledger = read_ledger(self._client, topic)
            except KafkaError as error:
                log.warning("reading %s failed (%s); retrying", topic, error)
                self._stop.wait(1.0)
                continue
            with self.state.lock:
                self.view.detector.restore(ledger)
            log.info(
                "read %d records of %s back (through %s, %d not ledger records)",
                len(ledger.values),
                topic,
                ledger.through_ms,
                ledger.bad_records,
            )
            return

    def _write(self) -> None:
        """Write the detector's new decisions (and any that failed before)."""
        recorder = self.view.detector.recorder
        if self.writer is None or recorder is None:
            return
        with self.state.lock:
            records = recorder.take()
        self.writer.write(records)

    def _follow(self) -> None:
        self._restore()
        pending: Observed | None = None
        next_check = 0.0
        while not self._stop.is_set():
            try:
                self._read(timeout_ms=200)
                now = self.state.wall_ms() / 1000
                if pending is None and now >= next_check:
                    if not self.tps:  # the first window of any replica creates the topic
                        self._assign()
                    # no progress before the topic can be read: its windows would be missed
                    pending = self._observe() if self.tps else None
                    next_check = now + self.interval_s
                if pending is not None and self._caught_up(pending[2]):
                    closed, early = pending[0], pending[1]
                    with self.state.lock:
                        now_ms = self.state.wall_ms()
                        self.view.apply_progress(closed, self.partitions, now_ms, early)
                    pending = None
                    self._write()
            except KafkaError as error:  # the broker is away: try again, stay in place
                log.warning("following %s failed (%s); retrying", self.windows_topic, error)
                pending = None
                self._stop.wait(1.0)

    def _read(self, timeout_ms: int) -> None:
        if not self.tps:
            self._stop.wait(timeout_ms / 1000)
            return
        batches = self.consumer.poll(timeout_ms=timeout_ms).values()
        # the record that waited longest sets the delay
        windows, bad, oldest = decode_windows(r for records in batches for r in records)
        if windows or bad:
            with self.state.lock:
                final: list[ClosedWindow] = []
                early: list[ClosedWindow] = []
                for w in windows:
                    (final if w.label_age_ms is None else early).append(w)
                if final:
                    self.view.add(final)
                if early:
                    self.view.add_early(early)
                self.view.bad_records += bad
                if oldest is not None:
                    self.view.delay_ms = max(0, self.state.wall_ms() - oldest)

    def _observe(self) -> Observed:
        """The group's committed progress, then the windows topics' high watermarks."""
        groups = self.admin.list_group_offsets({self.group_id: self.inputs})
        closed, early = progress_of(groups.get(self.group_id, {}))
        ends: dict[TopicPartition, int] = self._ends.end_offsets(self.tps) if self.tps else {}
        return closed, early, ends

    def _caught_up(self, ends: Mapping[TopicPartition, int]) -> bool:
        return all(self.consumer.position(tp) >= end for tp, end in ends.items())
