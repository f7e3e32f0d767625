"""The streaming core: validated events in, closed windows out (no Kafka, no HTTP).

``run``, ``demo``, ``replay`` and the tests drive the same :class:`Pipeline` with
records and an injected clock. Per record it applies the timestamp guard, the label
caps and the join of its partition; :meth:`Pipeline.advance` moves the watermarks and
finalises every closable window of every partition in one vectorised batch through the
metric core, which is what makes streaming results equal the offline evaluation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from service.errors import EventError
from service.metrics.ir import DEFAULT_KS, metric_keys
from service.stream.audit_join import AuditConfig, AuditJoin, AuditRequest
from service.stream.audit_step import AuditDoors, close_audits, has_audits, take_with_audits
from service.stream.counters import Counts, LabelCap
from service.stream.events import AuditEvent, FeedbackEvent, QueryEvent
from service.stream.finalise import early_windows, finalise
from service.stream.join import PartitionStream
from service.stream.join_state import Held, Intake, JoinConfig, WindowKey
from service.stream.labels import LabelPolicy
from service.stream.mined import LabelRecorder
from service.stream.offsets import Restart, commit_plan
from service.stream.prepared import Prepared, Record
from service.stream.topics import FEEDBACK, QUERIES, TOPICS, Topic
from service.stream.watermark import NEVER
from service.stream.windows import ClosedWindow, WindowIdent, WindowSink
from service.times import duration_field, durations_field


@dataclass(frozen=True, slots=True)
class PipelineConfig:
    """Everything the core needs, in milliseconds (the defaults are the settings': see
    :mod:`service.config`)."""

    join: JoinConfig = field(default_factory=JoinConfig)
    ks: tuple[int, ...] = DEFAULT_KS
    max_future_skew_ms: int = duration_field("5m")
    max_pending_queries: int = 1_000_000
    max_pending_feedback: int = 1_000_000
    max_label_values: int = 50
    rolling_ms: tuple[int, ...] = durations_field("15m,1h,24h")
    labels: LabelPolicy = field(default_factory=LabelPolicy)
    audit: AuditConfig = field(default_factory=AuditConfig)


class Pipeline(AuditDoors):
    """All partitions assigned to this process and their counters."""

    def __init__(
        self,
        config: PipelineConfig,
        now_ms: Callable[[], int],
        counts: Counts | None = None,
        sinks: Iterable[WindowSink] = (),
        recorder: LabelRecorder | None = None,
    ) -> None:
        self.config = config
        self.now_ms = now_ms
        self.counts = counts if counts is not None else Counts()
        self.metric_keys = metric_keys(config.ks)
        self.streams: dict[int, PartitionStream] = {}
        self.held = Held()
        """Pending queries and waiting feedback over all partitions (kept by the streams)."""
        self.retriever_cap = LabelCap("retriever", config.max_label_values, self.counts)
        self.segment_cap = LabelCap("segment", config.max_label_values, self.counts)
        self.sinks: list[WindowSink] = list(sinks)
        """Told of every durable window and every closed boundary (the window view)."""
        self._closed_through_ms: int | None = None
        """The detector's boundary as of the last advance: every window (early window, when
        they are made) ending at or before this has closed."""
        self.early_out: list[ClosedWindow] = []
        """The early windows made since they were last taken: by the publisher
        (:meth:`take_early`, ``run``), or given to the sinks with the closed windows
        (:meth:`deliver`)."""
        self._confirmed: dict[WindowIdent, int] = {}
        """The windows confirmed lately (by ident), with their end (to ignore a re-publish)."""
        self._confirmed_check = 100_000
        self.audit_requests: list[AuditRequest] | None = None
        """Where every partition's audit requests go as they are made (None: nowhere)."""
        self.audit_state = False
        """Whether the audit joins keep their changes for the audit state topic (``run``)."""
        self.intake = Intake(
            now_ms=now_ms,
            counts=self.counts,
            held=self.held,
            retriever_cap=self.retriever_cap,
            segment_cap=self.segment_cap,
            recorder=recorder,
            max_future_skew_ms=config.max_future_skew_ms,
            max_pending_queries=config.max_pending_queries,
            max_pending_feedback=config.max_pending_feedback,
            grade=config.labels.grade,
            evict_queries=self.evict_queries,
            evict_feedback=self.evict_feedback,
        )
        """What every partition shares as it takes records."""

    @property
    def recorder(self) -> LabelRecorder | None:
        """Keeps what the labels output needs (None: that output is off)."""
        return self.intake.recorder

    @recorder.setter
    def recorder(self, recorder: LabelRecorder | None) -> None:
        self.intake.recorder = recorder

    # -- assignment ----------------------------------------------------------------------

    def assign(
        self,
        partition: int,
        published_through_ms: int = NEVER,
        counted_from: tuple[int, int] = (0, 0),
        waiting_offsets: frozenset[int] = frozenset(),
        closed_through_ms: int = NEVER,
        *,
        early_through_ms: int = NEVER,
    ) -> PartitionStream:
        """Start a partition with empty state (the re-read from committed offsets rebuilds it)."""
        self.revoke(partition)  # (a partition assigned again starts over)
        stream = PartitionStream(
            partition,
            self.config.join,
            self.intake,
            published_through_ms=published_through_ms,
            counted_from=counted_from,
            waiting_offsets=waiting_offsets,
            closed_through_ms=closed_through_ms,
            early_through_ms=early_through_ms,
        )
        if self.config.audit.rate > 0:
            audit, join = self.config.audit, self.config.join
            stream.audits = AuditJoin(
                audit, self.config.ks, join.window_ms, self.counts.audit_outcomes
            )
            stream.audits.requests = self.audit_requests
            stream.audits.changed = {} if self.audit_state else None
        self.streams[partition] = stream  # (revoke above forgot the closed boundary)
        return stream

    def revoke(self, partition: int) -> None:
        """Drop a partition's state (after its closed windows were published and committed)."""
        stream = self.streams.pop(partition, None)
        if stream is not None:
            stream.release()
            self.early_out = [w for w in self.early_out if w.partition != partition]
        self._closed_through_ms = None

    def take_over(
        self, partition: int, restart: Restart, counted: Sequence[int] | None = None
    ) -> None:
        """Start a partition that this process takes over from its restart point (the
        markers of its last commit); ``counted``: the offsets (per topic) below which an
        earlier life of this process counted its records, when it dropped the partition
        without a commit. Neither topic is idle before its lag is known."""
        stream = self.assign(
            partition,
            restart.published_through_ms,
            restart.counted_from,
            restart.waiting_offsets,
            restart.closed_through_ms,
            early_through_ms=restart.early_through_ms,
        )
        if counted is not None:  # dead letters of an aborted transaction go again
            stream.count_from(counted)
        for topic in TOPICS:
            stream.set_backlog(topic, True)

    def partitions(self) -> list[int]:
        """The partitions assigned here."""
        return list(self.streams)

    def owns(self, partition: int) -> bool:
        """Whether ``partition`` is assigned here (its records are taken)."""
        return partition in self.streams

    # -- records -------------------------------------------------------------------------

    def query(self, partition: int, offset: int, event: QueryEvent) -> EventError | None:
        """Take a valid query event; return an error when the guard rejects it."""
        failures = self.take(partition, [(QUERIES, offset, event)])
        return failures[0][1] if failures else None

    def feedback(
        self, partition: int, offset: int, event: FeedbackEvent | AuditEvent
    ) -> EventError | None:
        """Take a valid feedback (or audit) event; an error when it is refused."""
        failures = self.take(partition, [(FEEDBACK, offset, event)])
        return failures[0][1] if failures else None

    def take(
        self,
        partition: int,
        batch: Sequence[Record],
        prepared: Prepared | None = None,
    ) -> list[tuple[int, EventError]]:
        """Take valid events of one partition in order, ``(topic, offset, event)`` each;
        return ``(position in batch, error)`` for those the timestamp guard rejects.

        The work is per batch where it can be: one clock read (for the guard and the
        idleness of every record), settings and state in locals, the events counted and
        the offsets noted once per topic (``read_through``), what does not depend on the
        join made for the whole batch (``prepared.prepare``, or ``prepared`` when the
        caller has it); per record, the usual paths of the join are written out
        (``PartitionStream.take``).
        """
        stream = self.streams[partition]
        if has_audits(batch):  # (the audits go to the audit join)
            skew = self.config.max_future_skew_ms
            return take_with_audits(stream, batch, prepared, self.counts, self.now_ms(), skew)
        return stream.take(batch, prepared)

    def is_new(self, partition: int, topic: Topic, offset: int) -> bool:
        """False for a record that an earlier owner of the partition already handled."""
        return self.streams[partition].is_new(topic, offset)

    def ignored(self, partition: int, topic: Topic, offset: int) -> None:
        """Count a record that the input mapping skips (not an event)."""
        if self.streams[partition].seen(topic, offset, self.now_ms()):
            self.counts.ignored[topic] += 1

    def invalid(self, partition: int, topic: Topic, offset: int, reason: str) -> None:
        """Count a record that failed validation (the caller dead-letters it)."""
        stream = self.streams[partition]
        if stream.seen(topic, offset, self.now_ms()):
            self.counts.events[topic] += 1
            self.counts.invalid[topic, reason] += 1

    def evict_queries(self) -> None:
        """Evict the oldest queries of the fullest partition while the total is over the cap.

        An eviction is counted once: not again for a record an earlier owner (or an
        earlier life of this process) already counted.
        """
        while self.pending_queries > self.config.max_pending_queries:
            victim = max(self.streams.values(), key=_n_pending)
            if not victim.evict_oldest_query():
                return

    def evict_feedback(self) -> None:
        """Evict the oldest waiting feedback of the partition holding most while the total
        is over the cap (counted once, as queries are)."""
        while self.pending_feedback > self.config.max_pending_feedback:
            victim = max(self.streams.values(), key=_n_orphans)
            if not victim.evict_oldest_feedback():
                return

    # -- the edge's view of the partitions -------------------------------------------------

    def set_backlog(self, partition: int, topic: Topic, behind: bool) -> None:
        """Whether ``topic``'s partition still has unread records (then it is never idle);
        nothing for a partition not assigned here."""
        stream = self.streams.get(partition)
        if stream is not None:
            stream.set_backlog(topic, behind)

    def latest_event_ms(self, partition: int) -> tuple[int, int]:
        """The largest event times seen on a partition, per topic (``NEVER`` before one)."""
        stream = self.streams[partition]
        return stream.latest_event_ms(QUERIES), stream.latest_event_ms(FEEDBACK)

    def counted_through(self, partition: int) -> list[int] | None:
        """Per topic, the offset below which every record of the partition was counted
        here (None: not assigned)."""
        stream = self.streams.get(partition)
        return None if stream is None else [stream.counted_through(t) for t in TOPICS]

    def commit_plans(
        self, started: Mapping[int, Mapping[Topic, int]]
    ) -> dict[int, dict[Topic, tuple[int, str]]]:
        """Per assigned partition, what to commit: per topic the offset and its markers
        (``offsets.commit_plan``); ``started``: the offsets each partition was taken over
        from."""
        return {p: commit_plan(stream, started.get(p)) for p, stream in self.streams.items()}

    # -- time ----------------------------------------------------------------------------

    def advance(self) -> list[ClosedWindow]:
        """Move every watermark; make the early windows that are due (:meth:`take_early`),
        then finalise and return the windows that closed."""
        closing: list[tuple[PartitionStream, WindowKey]] = []
        due: list[tuple[PartitionStream, WindowKey]] = []
        join = self.config.join
        attribution, age = join.attribution_ms, join.early_age_ms
        for stream in self.streams.values():
            closable = stream.advance()
            due.extend((stream, key) for key in stream.early_closable())
            closing.extend((stream, key) for key in closable)
        # every window ending at or before this has closed in every assigned partition;
        # unknown while any partition has no event time yet (e.g. re-read after a rebuild)
        wm = self.watermark_ms
        self._closed_through_ms = None
        if wm is not None:
            limit = wm - (attribution if age is None else age)
            self._closed_through_ms = limit - limit % join.window_ms
        if age is not None:
            self.early_out += early_windows(due, self.config.ks, join.window_ms, age)
        closed = close_audits(self.streams.values(), self._finalise(closing), attribution)
        if self.recorder is not None and wm is not None:
            limit = wm - attribution - join.window_ms - join.clock_skew_ms
            self.recorder.expire(limit)
        return closed

    def take_early(self) -> list[ClosedWindow]:
        """The early windows made since the last call (``run``: to publish)."""
        windows, self.early_out = self.early_out, []
        return windows

    def end_of_input(self) -> None:
        """No more records will come: the next advance finalises everything pending."""
        join = self.config.join
        for stream in self.streams.values():
            stream.end_of_input(join.attribution_ms + join.window_ms)

    def finish(self) -> list[ClosedWindow]:
        """End of input: finalise everything pending (replay)."""
        self.end_of_input()
        return self.advance()

    def _finalise(self, closing: list[tuple[PartitionStream, WindowKey]]) -> list[ClosedWindow]:
        return finalise(closing, self.config.ks, self.config.join.window_ms, self.recorder)

    def mark_sent(self, windows: Iterable[ClosedWindow]) -> None:
        """Windows were sent: move each partition's published-through marker (for commits)."""
        for w in windows:
            stream = self.streams.get(w.partition)
            if stream is not None:
                stream.mark_sent(w.end_ms)

    def confirm(self, windows: Iterable[ClosedWindow]) -> None:
        """Windows are durable: fold them into the counters, summaries and rolling views.

        A window confirmed before (published again after a failed commit in at-least-once
        mode: the record is identical) is not counted again.
        """
        windows = [w.without_labels() for w in windows if w.ident not in self._confirmed]
        for w in windows:
            self._confirmed[w.ident] = w.end_ms
        if len(self._confirmed) > self._confirmed_check:
            self._forget_confirmed()
        for w in windows:
            self.counts.finalized[w.retriever, w.segment, True] += w.labelled
            self.counts.finalized[w.retriever, w.segment, False] += w.unlabelled
            self.counts.add_published(w.retriever, w.segment, w.metrics)
            self.counts.windows_published += 1
        for sink in self.sinks:
            sink.add(windows)
            if self._closed_through_ms is not None:
                sink.advance(self._closed_through_ms)

    def _forget_confirmed(self) -> None:
        """Keep the keys of windows that a re-read could still publish again."""
        newest = max(self._confirmed.values())
        horizon = newest - 2 * self.config.join.attribution_ms - 2 * max(self.config.rolling_ms)
        self._confirmed = {k: end for k, end in self._confirmed.items() if end >= horizon}
        self._confirmed_check = max(100_000, 2 * len(self._confirmed))

    def deliver(self, windows: Iterable[ClosedWindow]) -> None:
        """Windows are durable without a broker (replay, demo): sent and confirmed at once,
        and the early windows made with them."""
        early = self.take_early()
        if early:
            for sink in self.sinks:
                sink.add_early(early)
        windows = list(windows)
        self.mark_sent(windows)
        self.confirm(windows)

    # -- gauges --------------------------------------------------------------------------

    @property
    def pending_queries(self) -> int:
        """Queries held in memory, all partitions."""
        return self.held.queries

    @property
    def pending_feedback(self) -> int:
        """Feedback events waiting for their query, all partitions."""
        return self.held.feedback

    @property
    def watermark_ms(self) -> int | None:
        """The minimum watermark over assigned partitions (None before any event time)."""
        values = [s.watermark_ms for s in self.streams.values()]
        if not values or min(values) == NEVER:
            return None
        return min(values)


def _n_pending(stream: PartitionStream) -> int:
    return stream.pending_count


def _n_orphans(stream: PartitionStream) -> int:
    return stream.n_orphans
