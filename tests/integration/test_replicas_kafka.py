"""Properties 3 (rebalance-safe), 4 (co-partitioned assignment) and 16 (scale-invariant).

Replicas of one consumer group share the partitions. The oracle is the offline
evaluation of the events: the windows on the windows topic (each key once, one value),
and the counter totals on ``/metrics`` summed over every process lifetime, each scraped
once the process has handed its partitions over (``SHUTDOWN_GRACE`` keeps the final
counts on ``/metrics`` after a clean stop). While the replicas run, the group
coordinator's assignment is read again and again: every member holds the same partition
numbers of both topics, and no partition belongs to two members.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import pytest

from service.sim.simulator import SimEvent
from tests.integration.kafka_helpers import (
    FAST,
    ServiceProcess,
    Topics,
    check_counts,
    check_windows,
    expected_windows,
    group_assignment,
    produce,
    published_windows,
    report_figures,
    stop_and_scrape,
    total,
    traffic,
    wait_all_published,
)
from tests.integration.paced_producer import PacedProducer

pytestmark = [pytest.mark.integration, pytest.mark.faults, pytest.mark.slow]

REPLICA = {**FAST, "max_poll_records": "100", "commit_interval": "200ms", "shutdown_grace": "60s"}


class AssignmentWatch:
    """Reads the group's assignment every 200 ms in a thread; records every violation."""

    def __init__(self, topics: Topics) -> None:
        self.topics = topics
        self.snapshots = 0
        self.max_members = 0
        self.violations: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            try:
                members = group_assignment(self.topics.bootstrap, self.topics.group)
            except Exception:  # the group may be between generations
                continue
            self.snapshots += 1
            self.max_members = max(self.max_members, len(members))
            owners: dict[int, str] = {}
            for member, by_topic in members.items():
                queries = by_topic.get(self.topics.queries, set())
                feedback = by_topic.get(self.topics.feedback, set())
                if queries != feedback:
                    self.violations.append(f"{member}: queries {queries} != feedback {feedback}")
                for p in queries:
                    if p in owners:
                        self.violations.append(f"partition {p}: {owners[p]} and {member}")
                    owners[p] = member

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _events(seed: int) -> list[SimEvent]:
    return traffic(seed=seed, hours=4.0)


def test_a_replica_joining_and_leaving_mid_stream_changes_nothing(
    topics: Topics, tmp_path: Path
) -> None:
    """The stream is live (produced at 1,000 records a second while the replicas run):
    B joins a third of the way in and leaves, cleanly, two thirds of the way in."""
    events = _events(61)
    expected = expected_windows(events)
    n = len(events)
    watch = AssignmentWatch(topics)
    a = ServiceProcess(topics, tmp_path / "a.log", **REPLICA, transactional_id="r-a")
    a.wait_ready()
    producer = PacedProducer(topics, events, per_second=1000)
    a.wait_progressing(lambda: producer.produced >= n // 3, "a third produced (and read by A)")
    b = ServiceProcess(topics, tmp_path / "b.log", **REPLICA, transactional_id="r-b")
    b.wait_until(  # B joined: the group rebalanced and B reads its half
        lambda: total(b.samples(), "retrieval_events_total") > 0, 90, "B reading"
    )
    b.wait_progressing(lambda: producer.produced >= 2 * n // 3, "two thirds produced", [a])
    b_read = total(b.samples(), "retrieval_events_total")
    b_final = stop_and_scrape(b)  # B leaves mid-stream; A takes its partitions back
    left_at = producer.produced
    producer.join()
    wait_all_published(a, topics, len(expected))
    a_final = stop_and_scrape(a)
    watch.stop()

    print(
        f"\nrebalance: {n} records in (live, 1,000/s); B joined at {n // 3}+ produced, "
        f"read {b_read:.0f} and left at {left_at} produced; {len(expected)} windows out; "
        f"{watch.snapshots} assignment snapshots, up to {watch.max_members} members"
    )
    assert left_at < n, "B left after the stream ended: not mid-stream"
    assert total(b_final, "retrieval_windows_published_total") > 0, "B published nothing"
    assert watch.max_members == 2
    assert watch.violations == []
    check_windows(topics, expected)
    check_counts([a_final, b_final], expected)
    report_figures("replica joins and leaves", "1 join, 1 leave", n, topics, expected)


def test_one_replica_and_two_give_the_same_results(topics: Topics, tmp_path: Path) -> None:
    events = _events(62)
    expected = expected_windows(events)
    produce(topics, events)
    n_queries = sum(1 for e in events if e.topic == "queries")

    def finalized(*services: ServiceProcess) -> float:
        samples = [s.samples() for s in services]
        return sum(total(x, "retrieval_queries_finalized_total") for x in samples)

    one = replace(topics, windows=f"{topics.windows}.one", group=f"{topics.group}-one")
    single = ServiceProcess(one, tmp_path / "one.log", **REPLICA, transactional_id="one")
    single.wait_progressing(lambda: finalized(single) == n_queries, "one replica: all final")
    single_final = stop_and_scrape(single)

    watch = AssignmentWatch(topics)
    pair = [
        ServiceProcess(topics, tmp_path / f"two-{i}.log", **REPLICA, transactional_id=f"two-{i}")
        for i in range(2)
    ]
    pair[0].wait_progressing(
        lambda: finalized(*pair) == n_queries, "two replicas: all final", pair[1:]
    )
    pair_final = [stop_and_scrape(s) for s in pair]
    watch.stop()

    assert all(total(s, "retrieval_windows_published_total") > 0 for s in pair_final)
    assert watch.max_members == 2
    assert watch.violations == []
    assert published_windows(one)[0] == published_windows(topics)[0]
    check_windows(one, expected)
    check_windows(topics, expected)
    report_figures("1 replica", "none", len(events), one, expected)
    report_figures("2 replicas", "2 members, 1 leaves at the end", len(events), topics, expected)
    check_counts([single_final], expected)
    check_counts(pair_final, expected)
