"""Restart exactness (docs: shared/notes/exactly-once.md): a process may stop or crash at any
point; the next one starts each partition from its committed offsets and markers, and the
windows topic, read as "last record per key", must equal a clean run's, with every record of
a key identical. Counters summed over the process lifetimes must equal the clean run's.

Kafka is simulated: a record is (topic, partition, offset, event) in one global arrival
order; a restarted process re-reads, in that same order, every record at or after the
committed offset of its topic partition, then goes on with new records.
"""

from __future__ import annotations

import copy
import zlib
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from service.sim.simulator import SimulationConfig, encode, generate
from service.stream.counters import Counts
from service.stream.events import FeedbackEvent, QueryEvent, decode_feedback, decode_query
from service.stream.join import JoinConfig
from service.stream.offsets import commit_plan, restart_from
from service.stream.pipeline import Pipeline, PipelineConfig
from service.stream.reference import evaluate_event_log
from service.stream.topics import FEEDBACK, QUERIES
from service.stream.watermark import NEVER
from service.stream.windows import ClosedWindow
from service.times import HOUR_MS, rfc3339_millis

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


@dataclass(frozen=True, slots=True)
class Record:
    topic: int  # QUERIES or FEEDBACK
    partition: int
    offset: int
    event: QueryEvent | FeedbackEvent


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
class Outcome:
    """What the windows topic and /metrics saw over all process lifetimes."""

    published: list[ClosedWindow] = field(default_factory=list)
    counts: list[Counts] = field(default_factory=list)  # one per lifetime, as it contributed
    lost: list[ClosedWindow] = field(default_factory=list)  # closed, never published (crash)
    published_after_commit: list[ClosedWindow] = field(default_factory=list)
    reread: int = 0  # records read again after a restart
    reread_of_published: int = 0  # re-read queries of windows published before the restart

    def last_per_key(self) -> dict[str, ClosedWindow]:
        return {w.key: w for w in self.published}

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


def feed(pipeline: Pipeline, record: Record) -> None:
    if isinstance(record.event, QueryEvent):
        error = pipeline.query(record.partition, record.offset, record.event)
    else:
        error = pipeline.feedback(record.partition, record.offset, record.event)
    assert error is None


def run(
    records: Sequence[Record],
    cuts: Sequence[int] = (),
    *,
    crash: str | None = None,
    marker: bool = True,
    counted: bool = True,
) -> Outcome:
    """Process ``records`` with a stop at each cut, then restart from the commits.

    ``crash=None``: a clean stop (advance, publish, commit). ``"before_publish"``: windows
    closed since the last commit are lost unpublished, with the counters since that commit.
    ``"after_publish"``: they were published but the commit after them was lost.
    ``marker``/``counted=False`` drop the restart markers (to show the test sees it).
    """
    out = Outcome()
    committed: dict[tuple[int, int], tuple[int, str]] = {}  # (topic, partition) -> plan
    bounds = [*cuts, len(records)]
    for life, end in enumerate(bounds):
        pipeline = Pipeline(CONFIG, now_ms=lambda: NOW)
        start: dict[tuple[int, int], int] = {}
        counted_through: dict[tuple[int, int], int] = {}
        published_through: dict[int, int] = {}
        for p in range(N_PARTITIONS):
            meta = [committed.get((t, p), (0, None))[1] for t in (QUERIES, FEEDBACK)]
            restart = restart_from(*meta)
            pipeline.assign(
                p,
                restart.published_through_ms if marker else NEVER,
                restart.counted_from if counted else (0, 0),
                restart.waiting_offsets if counted else frozenset(),
            )
            published_through[p] = restart.published_through_ms
            for t in (QUERIES, FEEDBACK):
                start[t, p] = committed.get((t, p), (0, ""))[0]
                counted_through[t, p] = restart.counted_from[t]
        snapshot = Counts()  # the counters as of this lifetime's last commit

        def publish(windows: list[ClosedWindow], pipeline: Pipeline = pipeline) -> None:
            out.published.extend(windows)
            pipeline.published(windows)

        def commit(pipeline: Pipeline = pipeline) -> None:
            nonlocal snapshot
            for p in range(N_PARTITIONS):
                for t, plan in commit_plan(pipeline.streams[p]).items():
                    committed[t, p] = plan
            snapshot = copy.deepcopy(pipeline.counts)

        n = 0
        for record in records[:end]:
            where = (record.topic, record.partition)
            if record.offset < start[where]:
                continue
            if record.offset < counted_through[where]:
                out.reread += 1
                if isinstance(record.event, QueryEvent):
                    ts = record.event.timestamp_ms
                    window_end = ts - ts % JOIN.window_ms + JOIN.window_ms
                    out.reread_of_published += window_end <= published_through[record.partition]
            feed(pipeline, record)
            n += 1
            if n % ADVANCE_EVERY == 0:
                publish(pipeline.advance())
                commit()
        if life == len(bounds) - 1:
            publish(pipeline.finish())
            out.counts.append(pipeline.counts)
        elif crash == "before_publish":
            out.lost.extend(pipeline.advance())
            out.counts.append(snapshot)
        elif crash == "after_publish":
            windows = pipeline.advance()
            publish(windows)
            out.published_after_commit.extend(windows)
            out.counts.append(snapshot)
        else:
            publish(pipeline.advance())
            commit()
            out.counts.append(pipeline.counts)
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
    expected = evaluate_event_log(
        queries,
        feedback,
        window_ms=JOIN.window_ms,
        attribution_ms=JOIN.attribution_ms,
        clock_skew_ms=JOIN.clock_skew_ms,
        ks=CONFIG.ks,
        partition_of=partition_of,
    )
    assert windows == expected
    [counts] = clean.counts
    assert sum(counts.queries.values()) == len(queries)
    assert sum(counts.finalized.values()) == len(queries)


def assert_counters_match(restarted: Outcome, clean: Outcome) -> None:
    for name in ("events", "queries", "finalized", "late", "unmatched", "duplicates", "invalid"):
        assert restarted.total(name) == clean.total(name), name


def test_clean_stops_reproduce_a_clean_run(records: list[Record], clean: Outcome) -> None:
    restarted = run(records, cut_points(records))
    # the restarts did re-read, including queries of windows already published
    assert restarted.reread > 1000
    assert restarted.reread_of_published > 0
    assert restarted.conflicts() == {}
    assert restarted.last_per_key() == clean.last_per_key()
    assert_counters_match(restarted, clean)


@pytest.mark.parametrize("fractions", [(0.05,), (0.5, 0.501, 0.502), (0.999,)])
def test_other_cut_points_reproduce_a_clean_run(
    records: list[Record], clean: Outcome, fractions: tuple[float, ...]
) -> None:
    restarted = run(records, cut_points(records, fractions))
    assert restarted.conflicts() == {}
    assert restarted.last_per_key() == clean.last_per_key()
    assert_counters_match(restarted, clean)


def test_crash_before_publishing_republishes_the_lost_windows(
    records: list[Record], clean: Outcome
) -> None:
    crashed = run(records, cut_points(records, (0.31, 0.56, 0.81)), crash="before_publish")
    assert len(crashed.lost) > 5  # closed, then lost with the process
    expected = clean.last_per_key()
    for w in crashed.lost:
        assert w == expected[w.key]
        assert crashed.published.count(w) == 1
    assert crashed.conflicts() == {}
    assert crashed.last_per_key() == expected
    assert_counters_match(crashed, clean)


def test_crash_after_publishing_repeats_identical_records(
    records: list[Record], clean: Outcome
) -> None:
    crashed = run(records, cut_points(records, (0.31, 0.56, 0.81)), crash="after_publish")
    assert len(crashed.published_after_commit) > 5
    for w in crashed.published_after_commit:
        assert crashed.published.count(w) == 2  # at least once: published again, identical
    assert crashed.conflicts() == {}
    assert crashed.last_per_key() == clean.last_per_key()
    assert crashed.total("queries") == clean.total("queries")
    assert crashed.total("events") == clean.total("events")


def test_without_the_published_marker_windows_would_be_published_twice(
    records: list[Record], clean: Outcome
) -> None:
    bad = run(records, cut_points(records), marker=False)
    assert bad.conflicts() != {}  # re-read queries of published windows make partial windows
    assert bad.last_per_key() != clean.last_per_key()
    assert sum(bad.total("finalized").values()) > sum(clean.total("finalized").values())


def test_without_counted_through_records_would_be_counted_twice(
    records: list[Record], clean: Outcome
) -> None:
    bad = run(records, cut_points(records), counted=False)
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
    return QueryEvent.model_validate(body)


def fb_event(query_id: str, ts_ms: int) -> FeedbackEvent:
    body = {
        "query_id": query_id,
        "timestamp": rfc3339_millis(ts_ms),
        "chunk_id": "a",
        "signal": "click",
    }
    return FeedbackEvent.model_validate(body)


@dataclass
class SmallRun:
    windows: list[ClosedWindow] = field(default_factory=list)
    unmatched: Counter[str] = field(default_factory=Counter)  # summed over lifetimes
    committed: list[tuple[int, int]] = field(default_factory=list)  # (queries, feedback) at cuts

    def last_per_key(self) -> dict[str, ClosedWindow]:
        return {w.key: w for w in self.windows}


def run_small(records: Sequence[Record], cut: int | None = None) -> SmallRun:
    """One partition; a clean stop before ``records[cut]``, then a restart from the commit."""
    out = SmallRun()
    pipeline = Pipeline(SMALL, now_ms=lambda: NOW)
    pipeline.assign(0)

    def publish(windows: list[ClosedWindow]) -> None:
        out.windows.extend(windows)
        pipeline.published(windows)

    for i, record in enumerate(records):
        if i == cut:
            publish(pipeline.advance())
            plan = commit_plan(pipeline.streams[0])
            starts = (plan[QUERIES][0], plan[FEEDBACK][0])
            out.committed.append(starts)
            out.unmatched.update(pipeline.counts.unmatched)
            restart = restart_from(plan[QUERIES][1], plan[FEEDBACK][1])
            pipeline = Pipeline(SMALL, now_ms=lambda: NOW)
            pipeline.assign(
                0, restart.published_through_ms, restart.counted_from, restart.waiting_offsets
            )
            for old in records[:i]:
                if old.offset >= starts[old.topic]:
                    feed(pipeline, old)
        feed(pipeline, record)
        if i % 10 == 9:
            publish(pipeline.advance())
    publish(pipeline.finish())
    out.unmatched.update(pipeline.counts.unmatched)
    return out


def test_feedback_waiting_for_a_query_that_comes_after_the_commit_is_re_read() -> None:
    records = [
        Record(FEEDBACK, 0, 0, fb_event("x", T0 + 2_000)),  # before its query: it waits
        Record(QUERIES, 0, 0, q_event("q0", T0)),
        # <- the stop: no open window holds feedback, only the waiting one needs offset 0
        Record(QUERIES, 0, 1, q_event("x", T0 + 1_000)),
        Record(FEEDBACK, 0, 1, fb_event("q0", T0 + 3_000)),
    ]
    clean = run_small(records)
    [window] = clean.windows
    assert (window.queries, window.labelled) == (2, 2)
    restarted = run_small(records, cut=2)
    assert restarted.committed == [(0, 0)]
    assert restarted.last_per_key() == clean.last_per_key()
    assert restarted.windows == [window]


def ghost_records() -> list[Record]:
    """Feedback for a query that never comes, among ordinary traffic."""
    out = [Record(FEEDBACK, 0, 0, fb_event("ghost", T0))]
    for i in range(30):
        ts = T0 + i * MIN
        out.append(Record(QUERIES, 0, i, q_event(f"q{i}", ts)))
        out.append(Record(FEEDBACK, 0, i + 1, fb_event(f"q{i}", ts + 1_000)))
    return out


def test_orphan_feedback_is_counted_unmatched_in_a_clean_run() -> None:
    assert run_small(ghost_records()).unmatched == Counter({"no_query": 1})


def test_orphan_feedback_waiting_at_a_commit_is_counted_once_after_a_restart() -> None:
    clean = run_small(ghost_records())
    restarted = run_small(ghost_records(), cut=20)
    assert restarted.committed[0][1] == 0  # the orphan (offset 0) was still waiting: re-read
    assert restarted.last_per_key() == clean.last_per_key()
    assert restarted.unmatched == Counter({"no_query": 1})


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
    assert clean.unmatched == Counter({"no_query": 3})
    assert restarted.unmatched == clean.unmatched
    assert restarted.last_per_key() == clean.last_per_key()
