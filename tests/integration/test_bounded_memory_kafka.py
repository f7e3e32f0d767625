"""Property 10, bounded memory, against the real broker: millions of records, capped state.

1,000,000 query events that never get feedback and 1,000,000 feedback events whose query
never comes are produced to the 4 partitions of fresh topics (from two processes), dated
over the last three hours. The service runs with a one-day attribution window, so
nothing can be finalised or expire: every record would stay in memory but for the caps
``max_pending_queries`` and ``max_pending_feedback`` (100,000 each, a tenth of the input).

While it consumes, every 0.5 s: its resident memory (``VmRSS`` of the process), the
pending gauges (a ``/metrics`` scrape) and ``/readyz``. Checked:

* every record is counted as an event, none as late, duplicate, invalid or unmatched;
* evictions are counted exactly: ``retrieval_evicted_total{kind}`` = received - kept;
* ``/readyz`` answers 200 at every sample once it first has;
* the pending gauges never exceed the caps, and end exactly at them;
* memory plateaus: from the moment both topics have delivered more records than the caps
  (the evictions start), the peak RSS over the last half of the consumption time is at
  most ``PLATEAU`` (1.15) times the peak over the first quarter.

This test found two bugs, now fixed: the caps were checked only against the partition
that received the record (the gauges went up to 17% over), and evicted query ids stayed
referenced until their window closed (RSS grew 1.22-1.25 times).

Checked by breaking the protection: ``RETRIEVAL_MONITOR_TEST_MEMORY_CAP=3000000`` (caps
above the input) runs the same test with nothing evicted; RSS then grows with the input
(1.95 to 2.2 times from the first quarter to the last half) and the test fails on the plateau
(figures in docs/reliability.md). ``pytest -s`` prints the figures.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.integration.kafka_helpers import (
    HOUR_MS,
    STALL_S,
    BulkSpec,
    ServiceProcess,
    Topics,
    produce_bulk,
    rss_bytes,
    total,
)

N_QUERIES = 1_000_000
N_ORPHANS = 1_000_000
REFERENCE_CAP = 100_000
"""The caps of the default run; the plateau is measured from when both topics passed them."""
CAP = int(os.environ.get("RETRIEVAL_MONITOR_TEST_MEMORY_CAP", str(REFERENCE_CAP)))
PLATEAU = 1.15
"""Peak RSS of the last half / peak RSS of the first quarter after the caps were reached."""
SAMPLE_S = 0.5
READ_BOUND_S = 1800.0
"""The overall bound of reading the 2,000,000 records (some 75 s on an idle machine: the
150 scrapes 0.5 s apart of docs/reliability.md): the test waits while they are read
(``STALL_S`` at most with none read), not for a fixed time, but not for ever."""


pytestmark = [pytest.mark.integration, pytest.mark.faults, pytest.mark.slow]


@dataclass
class RssSampler:
    """Samples a process's RSS every ``SAMPLE_S`` in a thread: [(monotonic time, bytes)]."""

    pid: int
    samples: list[tuple[float, int]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            self.samples.append((time.monotonic(), rss_bytes(self.pid)))
            self.stop.wait(SAMPLE_S)

    def peak(self, start: float, end: float) -> int:
        return max((rss for t, rss in self.samples if start <= t <= end), default=0)

    def at(self, moment: float) -> int:
        return min(self.samples, key=lambda sample: abs(sample[0] - moment))[1]


@dataclass(frozen=True)
class Observation:
    """One scrape: (queries, feedback) each of events read, pending and evicted."""

    t: float
    events: tuple[float, float]
    pending: tuple[float, float]
    evicted: tuple[float, float]


def observe(service: ServiceProcess, topics: Topics) -> Observation | None:
    s = service.samples()
    if not s:
        return None
    return Observation(
        t=time.monotonic(),
        events=(
            total(s, "retrieval_events_total", topic=topics.queries),
            total(s, "retrieval_events_total", topic=topics.feedback),
        ),
        pending=(total(s, "retrieval_pending_queries"), total(s, "retrieval_pending_feedback")),
        evicted=(
            total(s, "retrieval_evicted_total", kind="query"),
            total(s, "retrieval_evicted_total", kind="feedback"),
        ),
    )


def mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def test_state_stays_under_the_caps_and_memory_plateaus(topics: Topics, tmp_path: Path) -> None:
    began = time.monotonic()
    now_ms = time.time_ns() // 1_000_000
    start_ms, span_ms = now_ms - 3 * HOUR_MS, 3 * HOUR_MS - 10 * 60_000
    produced = produce_bulk(
        [
            BulkSpec("query", topics.queries, "never-answered-", N_QUERIES, start_ms, span_ms),
            BulkSpec("orphan", topics.feedback, "no-such-query-", N_ORPHANS, start_ms, span_ms),
        ]
    )
    produce_s = time.monotonic() - began
    assert [sum(per_partition) for per_partition, _ in produced] == [N_QUERIES, N_ORPHANS]
    n = N_QUERIES + N_ORPHANS
    print(
        f"\nproduced {N_QUERIES:,} never-answered queries (per partition {produced[0][0]}) "
        f"and {N_ORPHANS:,} orphan feedback events ({produced[1][0]}) from two processes "
        f"in {produce_s:.1f} s ({n / produce_s:,.0f} records/s)"
    )

    spawned = time.monotonic()
    service = ServiceProcess(
        topics,
        tmp_path / "service.log",
        attribution_window="1d",
        max_pending_queries=str(CAP),
        max_pending_feedback=str(CAP),
    )
    sampler = RssSampler(service.process.pid)
    thread = threading.Thread(target=sampler.run, daemon=True)
    thread.start()
    observations: list[Observation] = []
    not_ready: list[tuple[float, int]] = []
    try:
        service.wait_ready(timeout_s=120)
        ready_at = time.monotonic()
        # as long as it reads (a busy machine reads slower), up to READ_BOUND_S in all
        moved_at, read = ready_at, 0.0
        while True:
            if service.process.poll() is not None:
                raise AssertionError(f"the service exited: {service.tail()}")
            now = time.monotonic()
            if now - moved_at >= STALL_S or now - ready_at >= READ_BOUND_S:
                stalled = now - moved_at >= STALL_S
                why = f"none read for {now - moved_at:.0f} s" if stalled else "the bound passed"
                raise AssertionError(
                    f"not all read: {read:,.0f} of {n:,} records in {now - ready_at:.0f} s "
                    f"({why}); last observation {observations[-1:]}\n{service.tail(100)}"
                )
            status = service.get("/readyz")[0]
            if status != 200:
                not_ready.append((round(time.monotonic() - ready_at, 1), status))
            seen = observe(service, topics)
            if seen is not None:
                observations.append(seen)
                if sum(seen.events) >= n:
                    break
                if sum(seen.events) > read:
                    moved_at, read = seen.t, sum(seen.events)
            time.sleep(SAMPLE_S)
        consumed_at = observations[-1].t
        # the lag gauge is refreshed once a second
        service.wait_until(
            lambda: total(service.samples(), "retrieval_consumer_lag") == 0, 60, "lag 0"
        )
        status = service.get("/readyz")[0]
        if status != 200:
            not_ready.append((round(time.monotonic() - ready_at, 1), status))
        final = service.samples()
    finally:
        sampler.stop.set()
        thread.join()
        code = service.stop() if service.process.poll() is None else service.process.returncode
    assert code == 0, service.tail()

    received = (
        total(final, "retrieval_events_total", topic=topics.queries),
        total(final, "retrieval_events_total", topic=topics.feedback),
    )
    kept = (total(final, "retrieval_pending_queries"), total(final, "retrieval_pending_feedback"))
    evicted = (
        total(final, "retrieval_evicted_total", kind="query"),
        total(final, "retrieval_evicted_total", kind="feedback"),
    )
    peak_pending = (
        max(o.pending[0] for o in observations),
        max(o.pending[1] for o in observations),
    )
    print(
        f"caps {CAP:,} each; received {received[0]:,.0f} queries and {received[1]:,.0f} "
        f"feedback; kept {kept[0]:,.0f} and {kept[1]:,.0f}; evicted {evicted[0]:,.0f} and "
        f"{evicted[1]:,.0f}; largest pending gauges in {len(observations)} scrapes: "
        f"{peak_pending[0]:,.0f} and {peak_pending[1]:,.0f}; /readyz not 200: {len(not_ready)}"
    )

    # the plateau: from both topics past the (reference) caps to the end of the input
    past_caps = [o.t for o in observations if min(o.events) > REFERENCE_CAP]
    assert past_caps[0] < consumed_at, "no sample between passing the caps and the end"
    t0 = past_caps[0]
    span = consumed_at - t0
    first_quarter = sampler.peak(t0, t0 + span / 4)
    last_half = sampler.peak(t0 + span / 2, consumed_at)
    ratio = last_half / first_quarter
    print(
        f"RSS: peak {mib(first_quarter)} in the first quarter after the caps were reached, "
        f"{mib(last_half)} in the last half: {ratio:.3f}x (limit {PLATEAU}); overall peak "
        f"{mib(max(rss for _, rss in sampler.samples))} ({len(sampler.samples)} samples)"
    )
    timeline = []
    for tenth in range(1, 11):
        seen = next(o for o in observations if sum(o.events) >= tenth * n / 10)
        timeline.append(f"{sum(seen.events) / 1000:,.0f}k {mib(sampler.at(seen.t))}")
    print(f"RSS by records read: {', '.join(timeline)}")
    print(
        f"time: produce {produce_s:.1f} s; service ready {ready_at - spawned:.1f} s after its "
        f"start; read all {consumed_at - ready_at:.1f} s after ready "
        f"({n / (consumed_at - ready_at):,.0f} records/s); plateau measured over {span:.1f} s; "
        f"test {time.monotonic() - began:.1f} s"
    )

    assert received == (N_QUERIES, N_ORPHANS)
    for name in (
        "retrieval_late_events_total",
        "retrieval_duplicate_events_total",
        "retrieval_invalid_events_total",
        "retrieval_feedback_unmatched_total",
        "retrieval_queries_finalized_total",
    ):
        assert total(final, name) == 0, name
    assert evicted == (received[0] - kept[0], received[1] - kept[1])
    assert not not_ready, f"/readyz not 200 at (s after ready, status): {not_ready[:10]}"
    assert max(peak_pending) <= CAP, f"pending gauges above the caps: {peak_pending} > {CAP}"
    assert kept == (min(CAP, N_QUERIES), min(CAP, N_ORPHANS)), "pending at the end"
    assert ratio <= PLATEAU, f"memory did not plateau: {ratio:.3f}x"
