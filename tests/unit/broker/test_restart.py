"""Restart exactness (docs: shared/notes/exactly-once.md): a process may stop or crash at any
point; the next one starts each partition from its committed offsets and markers, and the
windows topic, read as "last record per key", must equal a clean run's, with every record of
a key identical. Counters summed over the process lifetimes must equal the clean run's.

These tests drive the real commit protocol (``service.broker.commits.CommitProtocol``) and
the real publishers with the broker, producer and consumer of ``fakes.py``: each lifetime
takes its partitions over from the committed offsets, polls, processes, publishes and
commits through the same code as ``run``, and then stops cleanly or crashes.
"""

from __future__ import annotations

import copy
import zlib
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Literal

import pytest
from kafka.structs import TopicPartition

from service.broker.commits import CommitProtocol
from service.broker.publisher import AtLeastOncePublisher, Publisher, TransactionalPublisher
from service.core.monitor import Monitor, MonitorConfig
from service.core.state import ServiceState
from service.sim.simulator import SimulationConfig, encode, generate
from service.stream.counters import Counts
from service.stream.events import (
    FeedbackEvent,
    QueryEvent,
    decode_feedback,
    decode_query,
    feedback_from,
    query_from,
)
from service.stream.join_state import JoinConfig
from service.stream.offsets import decode_metadata, encode_metadata
from service.stream.pipeline import Pipeline, PipelineConfig
from service.stream.reference import evaluate_event_log
from service.stream.topics import FEEDBACK, QUERIES, TOPICS
from service.stream.watermark import NEVER
from service.stream.windows import ClosedWindow
from service.times import HOUR_MS, rfc3339_millis
from tests.unit.broker.fakes import (
    EARLY_TOPIC,
    TOPIC_NAMES,
    WINDOWS_TOPIC,
    FakeBroker,
    FakeConsumer,
    FakeTransport,
    Record,
    Tamper,
)

MIN = 60_000
N_PARTITIONS = 2
JOIN = JoinConfig(
    attribution_ms=10 * MIN,
    clock_skew_ms=5_000,
    window_ms=2 * MIN,
    max_out_of_orderness_ms=MIN,
    idle_timeout_ms=30_000,
)
CONFIG = PipelineConfig(join=JOIN, ks=(1, 3, 5))
# More ingestion lag than the default (still below 20 s, within out-of-orderness), so that
# queries of a window arrive after the first query of the next one: re-reads then cross
# into windows that were already published.
SIM = SimulationConfig(
    seed=5,
    duration_ms=2 * HOUR_MS,
    queries_per_hour=2000,
    mean_arrival_delay_ms=8_000,
    lag_spike_rate=0.1,
)
NOW = SIM.end_ms + 86_400_000  # a fixed wall clock after the data: nothing is idle
ADVANCE_EVERY = 500  # records between advance + publish + commit
CUTS = (0.30, 0.55, 0.80)

Mode = Literal["transactional", "at_least_once"]
End = Literal["clean", "crash"]


@pytest.fixture(scope="module")
def records() -> list[Record]:
    out = []
    next_offset: Counter[tuple[int, int]] = Counter()
    for sim in generate(SIM):
        partition = zlib.crc32(sim.key.encode()) % N_PARTITIONS
        raw = encode(sim)
        event: QueryEvent | FeedbackEvent
        if sim.topic == "queries":
            topic, event = QUERIES, decode_query(raw)
        else:
            topic, event = FEEDBACK, decode_feedback(raw)
        out.append(Record(topic, partition, next_offset[topic, partition], event))
        next_offset[topic, partition] += 1
    return out


def cut_points(records: Sequence[Record], fractions: Iterable[float] = CUTS) -> list[int]:
    return [int(len(records) * f) for f in fractions]


@dataclass
class Life:
    """One process: its monitor and commit protocol over the shared fake broker."""

    pipeline: Pipeline
    protocol: CommitProtocol
    consumer: FakeConsumer

    def feed(self, batch: list[Record]) -> None:
        """What the loop's work does with a polled batch (under both locks)."""
        for record in batch:
            take = self.pipeline.query if record.topic == QUERIES else self.pipeline.feedback
            assert take(record.partition, record.offset, record.event) is None  # type: ignore[arg-type]


def start_life(
    broker: FakeBroker,
    log: Sequence[Record],
    limit: int,
    config: PipelineConfig,
    partitions: int,
    mode: Mode,
    tamper: Tamper | None = None,
) -> Life:
    """A new process: a fresh monitor and publisher, all partitions taken over."""
    monitor = Monitor(MonitorConfig(config), now_ms=lambda: NOW)
    state = ServiceState(monitor, lambda: NOW)
    publisher: Publisher
    if mode == "transactional":
        publisher = TransactionalPublisher(
            lambda: FakeTransport(broker, transactional=True), WINDOWS_TOPIC, "deadletter"
        )
    else:
        publisher = AtLeastOncePublisher(
            FakeTransport(broker, transactional=False), WINDOWS_TOPIC, "deadletter"
        )
    publisher.early_topic = EARLY_TOPIC
    consumer = FakeConsumer(broker, log, limit, partitions, tamper)
    protocol = CommitProtocol(state, publisher, consumer, TOPIC_NAMES)
    protocol.take_over(consumer.assignment(), consumer.committed_all())
    return Life(monitor.pipeline, protocol, consumer)


@dataclass
class Outcome:
    """What the windows topic and /metrics saw over all process lifetimes."""

    published: list[ClosedWindow] = field(default_factory=list)
    early: list[ClosedWindow] = field(default_factory=list)
    """The early windows' topic (``label_age_ms`` set)."""
    counts: list[Counts] = field(default_factory=list)  # one per lifetime, as it contributed
    lost: list[ClosedWindow] = field(default_factory=list)  # sent, never committed (crash)
    published_after_commit: list[ClosedWindow] = field(default_factory=list)
    reread: int = 0  # records read again after a restart
    reread_of_published: int = 0  # re-read queries of windows published before the restart
    committed: list[tuple[int, int]] = field(default_factory=list)  # (queries, feedback) at cuts
    progress: list[dict[int, tuple[int, set[str]]]] = field(default_factory=list)
    """At each stop: per partition, the committed ``closed`` marker and the keys visible."""

    def last_per_key(self) -> dict[str, ClosedWindow]:
        return {w.key: w for w in self.published}

    def early_once(self) -> dict[str, ClosedWindow]:
        """The early windows by key, each published exactly once."""
        by_key = {w.key: w for w in self.early}
        assert len(by_key) == len(self.early), "an early window was published twice"
        return by_key

    def conflicts(self) -> dict[str, list[ClosedWindow]]:
        by_key: dict[str, list[ClosedWindow]] = {}
        for w in self.published:
            by_key.setdefault(w.key, []).append(w)
        return {k: ws for k, ws in by_key.items() if any(w != ws[0] for w in ws)}

    def total(self, name: str) -> Counter[Any]:
        out: Counter[Any] = Counter()
        for counts in self.counts:
            out.update(getattr(counts, name))
        return out


def without_published_marker(metadata: str | None) -> str | None:
    markers = decode_metadata(metadata)
    return encode_metadata(NEVER, markers.counted_through, sorted(markers.waiting))


def without_counted_marker(metadata: str | None) -> str | None:
    return encode_metadata(decode_metadata(metadata).published_through_ms, 0)


def run(
    records: Sequence[Record],
    cuts: Sequence[int] = (),
    *,
    end: End = "clean",
    mode: Mode = "transactional",
    tamper: Tamper | None = None,
    config: PipelineConfig = CONFIG,
    partitions: int = N_PARTITIONS,
    batch: int = ADVANCE_EVERY,
    commit_every_batch: bool = True,
) -> Outcome:
    """Process ``records`` with a stop at each cut, then restart from the commits.

    ``end="clean"``: each lifetime stops cleanly (publish, commit). ``"crash"``: it dies
    after sending the windows closed since its last commit, before committing them (in
    transactional mode they are never visible; at least once, they are published again).
    ``tamper`` rewrites the committed markers a restart reads (to show the test sees it).
    """
    out = Outcome()
    broker = FakeBroker()
    bounds = [*cuts, len(records)]
    for index, limit in enumerate(bounds):
        life = start_life(broker, records, limit, config, partitions, mode, tamper)
        streams = life.pipeline.streams
        counted_through = {(t, p): streams[p].counted_from[t] for t in TOPICS for p in streams}
        published_through = {p: s.published_through_ms for p, s in streams.items()}
        snapshot = Counts()  # the counters as of this lifetime's last commit
        while polled := life.consumer.poll(batch):
            for record in polled:
                if record.offset < counted_through[record.topic, record.partition]:
                    out.reread += 1
                    if isinstance(record.event, QueryEvent):
                        ts = record.event.timestamp_ms
                        window_end = ts - ts % JOIN.window_ms + JOIN.window_ms
                        out.reread_of_published += window_end <= published_through[record.partition]
            # a commit after every full batch; the records after the last one are sent
            # but not committed when the lifetime ends (a crash loses or repeats them)
            full = commit_every_batch and len(polled) == batch
            life.protocol.cycle(partial(life.feed, polled), commit=full)
            life.protocol.rebuild_if_needed()
            if full:
                snapshot = copy.deepcopy(life.pipeline.counts)
        last = index == len(bounds) - 1
        if last:
            life.protocol.cycle(life.pipeline.end_of_input, commit=True)
            out.counts.append(life.pipeline.counts)
        elif end == "crash":
            sent = list(life.protocol.unconfirmed)
            (out.lost if mode == "transactional" else out.published_after_commit).extend(sent)
            out.counts.append(snapshot)
        else:
            life.protocol.cycle(lambda: None, commit=True)
            out.counts.append(life.pipeline.counts)
            offsets = [broker.offsets[TopicPartition(t, 0)].offset for t in TOPIC_NAMES]
            out.committed.append((offsets[0], offsets[1]))
            visible = {w.key for w in broker.windows()}
            out.progress.append(
                {
                    p: (
                        max(
                            decode_metadata(
                                broker.offsets[TopicPartition(t, p)].metadata
                            ).closed_through_ms
                            for t in TOPIC_NAMES
                        ),
                        visible,
                    )
                    for p in range(partitions)
                }
            )
    out.published = broker.windows()
    out.early = broker.windows(EARLY_TOPIC)
    return out


@pytest.fixture(scope="module")
def clean(records: list[Record]) -> Outcome:
    return run(records)


def test_clean_run_publishes_each_window_once_and_equals_the_offline_evaluation(
    records: list[Record], clean: Outcome
) -> None:
    windows = clean.last_per_key()
    assert len(windows) == len(clean.published) > 100
    queries = [r.event for r in records if isinstance(r.event, QueryEvent)]
    feedback = [r.event for r in records if isinstance(r.event, FeedbackEvent)]
    partition_of = {q.query_id: zlib.crc32(q.query_id.encode()) % N_PARTITIONS for q in queries}

    def offline(attribution_ms: int) -> dict[str, ClosedWindow]:
        return evaluate_event_log(
            queries,
            feedback,
            window_ms=JOIN.window_ms,
            attribution_ms=attribution_ms,
            clock_skew_ms=JOIN.clock_skew_ms,
            ks=CONFIG.ks,
            partition_of=partition_of,
        )

    assert windows == offline(JOIN.attribution_ms)
    # and each early window, once: the same evaluation with only the labels that came
    # within the label age
    early = clean.early_once()
    assert {k: replace(w, label_age_ms=None) for k, w in early.items()} == offline(JOIN.early_ms)
    assert {w.label_age_ms for w in early.values()} == {JOIN.early_ms}
    [counts] = clean.counts
    assert sum(counts.queries.values()) == len(queries)
    assert sum(counts.finalized.values()) == len(queries)


def assert_counters_match(restarted: Outcome, clean: Outcome) -> None:
    for name in ("events", "queries", "finalized", "late", "unmatched", "duplicates", "invalid"):
        assert restarted.total(name) == clean.total(name), name


@pytest.mark.parametrize("mode", ["transactional", "at_least_once"])
def test_clean_stops_reproduce_a_clean_run(
    records: list[Record], clean: Outcome, mode: Mode
) -> None:
    restarted = run(records, cut_points(records), mode=mode)
    # the restarts did re-read, including queries of windows already published
    assert restarted.reread > 1000
    assert restarted.reread_of_published > 0
    assert restarted.conflicts() == {}
    assert restarted.last_per_key() == clean.last_per_key()
    assert_counters_match(restarted, clean)
    # an early window is made once, before its window closes: a restart that re-reads its
    # window does not make it again (the ``early`` marker), whichever the mode
    assert restarted.early_once() == clean.early_once()


def test_the_progress_marker_says_which_windows_are_in(
    records: list[Record], clean: Outcome
) -> None:
    """Every window of a partition ending at or before its committed ``closed`` marker is
    on the topic with that commit (an absent one had no traffic); the marker only grows."""
    restarted = run(records, cut_points(records))
    expected = clean.last_per_key()
    last = dict.fromkeys(range(N_PARTITIONS), NEVER)
    for stop in restarted.progress:
        for p, (closed, visible) in stop.items():
            assert closed > last[p]  # a stop commits progress: it grows, never goes back
            last[p] = closed
            due = {k for k, w in expected.items() if w.partition == p and w.end_ms <= closed}
            assert due  # the marker is past some windows ...
            assert due <= visible  # ... and all of them are in
            later = {k for k, w in expected.items() if w.partition == p and w.end_ms > closed}
            assert later  # ... and not past the data


@pytest.mark.parametrize("fractions", [(0.05,), (0.5, 0.501, 0.502), (0.999,)])
def test_other_cut_points_reproduce_a_clean_run(
    records: list[Record], clean: Outcome, fractions: tuple[float, ...]
) -> None:
    restarted = run(records, cut_points(records, fractions))
    assert restarted.conflicts() == {}
    assert restarted.last_per_key() == clean.last_per_key()
    assert_counters_match(restarted, clean)


def test_crash_before_the_commit_republishes_the_lost_windows(
    records: list[Record], clean: Outcome
) -> None:
    crashed = run(records, cut_points(records, (0.31, 0.56, 0.81)), end="crash")
    assert len(crashed.lost) > 5  # sent in the open transaction, then lost with the process
    expected = clean.last_per_key()
    for w in crashed.lost:
        assert w == expected[w.key]
        assert crashed.published.count(w) == 1
    assert crashed.conflicts() == {}
    assert crashed.last_per_key() == expected
    assert_counters_match(crashed, clean)
    # the early windows lost with a transaction are made and published again, once
    assert crashed.early_once() == clean.early_once()


def test_crash_after_publishing_repeats_identical_records(
    records: list[Record], clean: Outcome
) -> None:
    crashed = run(
        records, cut_points(records, (0.31, 0.56, 0.81)), end="crash", mode="at_least_once"
    )
    assert len(crashed.published_after_commit) > 5
    for w in crashed.published_after_commit:
        assert crashed.published.count(w) == 2  # at least once: published again, identical
    assert crashed.conflicts() == {}
    assert crashed.last_per_key() == clean.last_per_key()
    assert crashed.total("queries") == clean.total("queries")
    assert crashed.total("events") == clean.total("events")


def test_finalising_less_often_than_polling_changes_nothing(
    records: list[Record], clean: Outcome
) -> None:
    """The consumer loop finalises every ADVANCE_EVERY_MS of wall time and at commits, not
    after every poll: the windows and every counter are those of finalising per batch
    (lateness is decided by the watermark when a record arrives)."""
    outcome = Outcome()
    broker = FakeBroker()
    life = start_life(broker, records, len(records), CONFIG, N_PARTITIONS, "transactional")
    batches = 0
    while polled := life.consumer.poll(50):
        batches += 1
        life.protocol.cycle(partial(life.feed, polled), commit=batches % 40 == 0, advance=False)
        if batches == 190:  # 30 batches after a commit: nothing finalised since
            assert life.protocol.unconfirmed == []
            assert broker.windows() != []  # (the commits finalised)
    life.protocol.cycle(life.pipeline.end_of_input, commit=True)
    outcome.published = broker.windows()
    outcome.counts.append(life.pipeline.counts)
    assert batches > 190
    assert outcome.conflicts() == {}
    assert outcome.last_per_key() == clean.last_per_key()
    assert_counters_match(outcome, clean)


def test_a_failed_transaction_is_rebuilt_from_the_last_commit(
    records: list[Record], clean: Outcome
) -> None:
    """The broker fails two commits: the protocol aborts, drops its state, takes every
    partition over from the last commit and re-reads; nothing is lost or counted twice."""
    broker_failures = [3, 7]
    outcome = Outcome()
    broker = FakeBroker(fail_commits=broker_failures)
    life = start_life(broker, records, len(records), CONFIG, N_PARTITIONS, "transactional")
    while polled := life.consumer.poll(ADVANCE_EVERY):
        life.protocol.cycle(partial(life.feed, polled), commit=True)
        life.protocol.rebuild_if_needed()
    life.protocol.cycle(life.pipeline.end_of_input, commit=True)
    outcome.published = broker.windows()
    outcome.counts.append(life.pipeline.counts)
    assert broker.commits > max(broker_failures)
    # the pipeline-health series count the commits that succeeded, not the attempts
    assert life.protocol.state.health.commits == broker.commits - len(broker_failures)
    assert life.protocol.state.health.last_commit_ms == NOW
    assert life.consumer.delivered > len(records)  # the partitions were read again
    assert outcome.conflicts() == {}
    assert outcome.last_per_key() == clean.last_per_key()
    assert len(outcome.published) == len(clean.published)  # aborted records never visible
    assert_counters_match(outcome, clean)


def test_without_the_published_marker_windows_would_be_published_twice(
    records: list[Record], clean: Outcome
) -> None:
    bad = run(records, cut_points(records), tamper=without_published_marker)
    assert bad.conflicts() != {}  # re-read queries of published windows make partial windows
    assert bad.last_per_key() != clean.last_per_key()
    assert sum(bad.total("finalized").values()) > sum(clean.total("finalized").values())


def test_without_counted_through_records_would_be_counted_twice(
    records: list[Record], clean: Outcome
) -> None:
    bad = run(records, cut_points(records), tamper=without_counted_marker)
    assert bad.last_per_key() == clean.last_per_key()  # the windows do not depend on it
    assert sum(bad.total("events").values()) > sum(clean.total("events").values())
    assert sum(bad.total("queries").values()) > sum(clean.total("queries").values())


# -- feedback still waiting for its query at a commit ----------------------------------------

T0 = 1_796_083_200_000
SMALL = PipelineConfig(
    join=JoinConfig(
        attribution_ms=10 * MIN,
        clock_skew_ms=5_000,
        window_ms=MIN,
        max_out_of_orderness_ms=MIN,
        idle_timeout_ms=None,
    ),
    ks=(1, 3, 5),
)


def q_event(query_id: str, ts_ms: int) -> QueryEvent:
    body = {
        "query_id": query_id,
        "timestamp": rfc3339_millis(ts_ms),
        "retriever": "r",
        "results": ["a"],
    }
    return query_from(body)


def fb_event(query_id: str, ts_ms: int) -> FeedbackEvent:
    body = {
        "query_id": query_id,
        "timestamp": rfc3339_millis(ts_ms),
        "chunk_id": "a",
        "signal": "click",
    }
    return feedback_from(body)


def run_small(records: Sequence[Record], cut: int | None = None) -> Outcome:
    """One partition; a clean stop before ``records[cut]``, then a restart from the commit.

    Windows are published every 10 records and committed only at the stop.
    """
    return run(
        records,
        [] if cut is None else [cut],
        config=SMALL,
        partitions=1,
        batch=10,
        commit_every_batch=False,
    )


def unmatched(outcome: Outcome) -> Counter[str]:
    return outcome.total("unmatched")


def test_feedback_waiting_for_a_query_that_comes_after_the_commit_is_re_read() -> None:
    records = [
        Record(FEEDBACK, 0, 0, fb_event("x", T0 + 2_000)),  # before its query: it waits
        Record(QUERIES, 0, 0, q_event("q0", T0)),
        # <- the stop: no open window holds feedback, only the waiting one needs offset 0
        Record(QUERIES, 0, 1, q_event("x", T0 + 1_000)),
        Record(FEEDBACK, 0, 1, fb_event("q0", T0 + 3_000)),
    ]
    clean = run_small(records)
    [window] = clean.published
    assert (window.queries, window.labelled) == (2, 2)
    restarted = run_small(records, cut=2)
    assert restarted.committed == [(0, 0)]
    assert restarted.last_per_key() == clean.last_per_key()
    assert restarted.published == [window]


def ghost_records() -> list[Record]:
    """Feedback for a query that never comes, among ordinary traffic."""
    out = [Record(FEEDBACK, 0, 0, fb_event("ghost", T0))]
    for i in range(30):
        ts = T0 + i * MIN
        out.append(Record(QUERIES, 0, i, q_event(f"q{i}", ts)))
        out.append(Record(FEEDBACK, 0, i + 1, fb_event(f"q{i}", ts + 1_000)))
    return out


def test_orphan_feedback_is_counted_unmatched_in_a_clean_run() -> None:
    assert unmatched(run_small(ghost_records())) == Counter({"no_query": 1})


def test_orphan_feedback_waiting_at_a_commit_is_counted_once_after_a_restart() -> None:
    clean = run_small(ghost_records())
    restarted = run_small(ghost_records(), cut=20)
    assert restarted.committed[0][1] == 0  # the orphan (offset 0) was still waiting: re-read
    assert restarted.last_per_key() == clean.last_per_key()
    assert unmatched(restarted) == Counter({"no_query": 1})


def _many_ghosts() -> list[Record]:
    """Three orphans, then enough traffic that windows are published before a cut."""
    out = [Record(FEEDBACK, 0, i, fb_event(f"ghost{i}", T0)) for i in range(3)]
    for i in range(45):
        ts = T0 + i * MIN
        out.append(Record(QUERIES, 0, i, q_event(f"q{i}", ts)))
        out.append(Record(FEEDBACK, 0, i + 3, fb_event(f"q{i}", ts + 1_000)))
    return out


@pytest.mark.parametrize("cut", [29, 65])
def test_re_read_feedback_of_published_windows_is_not_counted_unmatched(cut: int) -> None:
    """Only the feedback that was waiting at the commit counts after a restart.

    The re-read also brings back feedback whose queries were in windows published
    before the commit (their queries lie below the committed query offset): it must not
    be counted as unmatched a second time.
    """
    clean = run_small(_many_ghosts())
    restarted = run_small(_many_ghosts(), cut=cut)
    assert unmatched(clean) == Counter({"no_query": 3})
    assert unmatched(restarted) == unmatched(clean)
    assert restarted.last_per_key() == clean.last_per_key()
