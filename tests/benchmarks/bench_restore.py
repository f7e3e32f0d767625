"""Benchmark: restore time after a kill -9 at large state, against the first read.

Needs the real broker (``make kafka-up``; ``RETRIEVAL_MONITOR_TEST_KAFKA`` overrides
127.0.0.1:9092). Fresh topics with unique names are created (queries and feedback with 4
partitions each) and ``--queries`` query events (default 1,000,000; ``--results`` ranked
chunk ids each, 20 by default) are produced to the queries topic from two processes,
keyed by query id, dated over the last three hours. No feedback: with a one-day
attribution window and ``max_pending_queries`` above N, every query stays pending.

Per repetition, in a fresh consumer group:

* **first read** (the baseline): ``python -m service run`` starts; the time from its
  process start until ``retrieval_pending_queries`` is N and ``retrieval_consumer_lag``
  is 0 on all 8 topic partitions. The benchmark then waits until a commit carries
  restart markers covering every record (so the crash is at a committed, large state),
  notes the process's RSS, and kills it with SIGKILL;
* **restore**: a new process with the same group and transactional id starts at once;
  (a) the time from its start to ``/readyz`` 200 (this includes the wait for the group
  coordinator to drop the dead member: up to ``--session-timeout``), and (b) to the
  state rebuilt: pending N again and lag 0 on all 8 topic partitions.

Each end is known to within one scrape (0.25 s). The figure of merit is the ratio
restore / first read (how much of a full re-read a restart costs). Not a test: figures,
not assertions. ``--max-pending-queries`` below N runs the same with the cap in force
(pending is then the cap, not N): it shows whether the cap also bounds the restore.

    python tests/benchmarks/bench_restore.py [--queries 1000000] [--repeat 1]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: make the tests package importable
    sys.path.insert(0, str(ROOT))

from tests.integration.kafka_helpers import (  # noqa: E402
    BOOTSTRAP,
    HOUR_MS,
    PARTITIONS,
    BulkSpec,
    ServiceProcess,
    Topics,
    produce_bulk,
    rss_bytes,
    total,
)

SCRAPE_S = 0.25


class BenchError(Exception):
    """A run failed (not a slow figure)."""


def state(service: ServiceProcess) -> tuple[float, int, float, float, float] | None:
    """(pending queries, lag series seen, total lag, queries read, evicted) from /metrics."""
    s = service.samples()
    if not s:
        return None
    lag_series = sum(1 for name, _ in s if name == "retrieval_consumer_lag")
    return (
        total(s, "retrieval_pending_queries"),
        lag_series,
        total(s, "retrieval_consumer_lag"),
        total(s, "retrieval_events_total"),
        total(s, "retrieval_evicted_total"),
    )


def wait_for(
    service: ServiceProcess, pending: int, timeout_s: float, spawned: float
) -> dict[str, Any]:
    """Scrape until ``pending`` queries are held and nothing is left to read."""
    ready_s: float | None = None
    deadline = time.monotonic() + timeout_s
    while True:
        if service.process.poll() is not None:
            raise BenchError(f"the service exited ({service.process.returncode}): {service.tail()}")
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout_s:.0f} s: {service.tail()}")
        now = time.monotonic()
        if ready_s is None and service.get("/readyz")[0] == 200:
            ready_s = now - spawned
        seen = state(service)
        if seen is not None and ready_s is not None:
            held, lag_series, lag, events, evicted = seen
            if held == pending and lag_series == 2 * PARTITIONS and lag == 0:
                return {
                    "ready_s": ready_s,
                    "rebuilt_s": now - spawned,
                    "events": events,
                    "evicted": evicted,
                    "rss": rss_bytes(service.process.pid),
                }
        time.sleep(max(0.0, SCRAPE_S - (time.monotonic() - now)))


def markers_cover(admin: Any, group: str, topic: str, ends: list[int]) -> bool:
    """Whether the group's commits on ``topic`` mark every record as counted."""
    offsets = admin.list_group_offsets(group).get(group, {})
    counted = {}
    for tp, meta in offsets.items():
        if tp.topic == topic and meta.metadata:
            counted[tp.partition] = json.loads(meta.metadata).get("counted", -1)
    return all(counted.get(p, -1) >= end for p, end in enumerate(ends))


def one_round(
    admin: Any,
    topics: Topics,
    tmp: Path,
    n: int,
    ends: list[int],
    settings: dict[str, str],
    timeout_s: float,
) -> dict[str, Any]:
    """First read, commit, kill -9, restore; return the figures."""
    pending = min(n, int(settings["max_pending_queries"]))
    spawned = time.monotonic()
    first = ServiceProcess(topics, tmp / f"{topics.group}-first.log", **settings)
    try:
        read = wait_for(first, pending, timeout_s, spawned)
        deadline = time.monotonic() + 60
        while not markers_cover(admin, topics.group, topics.queries, ends):
            if time.monotonic() > deadline:
                raise BenchError("no commit covered every record within 60 s")
            time.sleep(SCRAPE_S)
        rss = rss_bytes(first.process.pid)
    finally:
        first.stop(signal.SIGKILL)
    spawned = time.monotonic()
    second = ServiceProcess(topics, tmp / f"{topics.group}-restore.log", **settings)
    try:
        restore = wait_for(second, pending, timeout_s, spawned)
    finally:
        code = second.stop() if second.process.poll() is None else second.process.returncode
    if code != 0:
        raise BenchError(f"the restored service exited with {code}: {second.tail()}")
    return {"first": read, "rss_at_kill": rss, "restore": restore}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--queries", type=int, default=1_000_000)
    parser.add_argument("--results", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--session-timeout", default="6s", help="service setting (default 6s)")
    parser.add_argument(
        "--max-pending-queries", type=int, help="service cap (default: twice --queries)"
    )
    parser.add_argument("--keep-topics", action="store_true", help="do not delete them at the end")
    args = parser.parse_args()
    if args.queries < 2 or args.repeat < 1 or args.results < 1:
        parser.error("--queries must be at least 2, --repeat and --results positive")
    n = args.queries
    cap = args.max_pending_queries or 2 * n
    timeout_s = 120 + n / 1000

    from kafka.admin import KafkaAdminClient, NewTopic

    try:
        admin = KafkaAdminClient(bootstrap_servers=BOOTSTRAP, request_timeout_ms=10_000)
    except Exception as error:
        sys.exit(f"no Kafka broker on {BOOTSTRAP} ({error}); start one with `make kafka-up`")
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    topics = Topics(
        queries=f"{prefix}.queries",
        feedback=f"{prefix}.feedback",
        windows=f"{prefix}.windows",
        deadletter=f"{prefix}.deadletter",
        group=prefix,
    )
    names = [topics.queries, topics.feedback, topics.windows, topics.deadletter]
    groups: list[str] = []
    admin.create_topics(
        [NewTopic(name, num_partitions=PARTITIONS, replication_factor=1) for name in names[:2]]
        + [NewTopic(name, num_partitions=1, replication_factor=1) for name in names[2:]]
    )
    admin.wait_for_topics(names, timeout_ms=30_000)
    try:
        start = time.perf_counter()
        now_ms = time.time_ns() // 1_000_000
        half = n // 2
        start_ms, span_ms = now_ms - 3 * HOUR_MS, 3 * HOUR_MS - 10 * 60_000
        specs = [
            BulkSpec(
                "query", topics.queries, f"{prefix}-{part}-", count, start_ms, span_ms, args.results
            )
            for part, count in (("a", half), ("b", n - half))
        ]
        produced = produce_bulk(specs)
        ends = [sum(column) for column in zip(*(p for p, _ in produced), strict=True)]
        settings = {
            "attribution_window": "1d",
            "max_pending_queries": str(cap),
            "session_timeout": args.session_timeout,
        }
        print(
            f"data: {n:,} query events x {args.results} results, no feedback, "
            f"{os.cpu_count()} cores; produced to {PARTITIONS} partitions ({ends}) in "
            f"{time.perf_counter() - start:.1f} s"
        )
        shown = " ".join(f"{k}={v}" for k, v in settings.items())
        print(f"service settings: {shown} transactional_id=<group>-bench (the others: defaults)")
        rounds = []
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(args.repeat):
                group = f"{prefix}-{r}"
                groups.append(group)
                round_topics = dataclasses.replace(topics, group=group)
                round_settings = {**settings, "transactional_id": f"{group}-bench"}
                rounds.append(
                    one_round(admin, round_topics, Path(tmp), n, ends, round_settings, timeout_s)
                )
        report(rounds, n, cap)
    except BenchError as error:
        sys.exit(f"error: {error}")
    finally:
        if not args.keep_topics:
            try:
                admin.delete_topics(names)
                if groups:
                    admin.delete_groups(groups)
            except Exception as error:  # leftovers are harmless; say so and go on
                print(f"warning: cleanup of {prefix}.* failed: {error}", file=sys.stderr)
        admin.close()


def report(rounds: list[dict[str, Any]], n: int, cap: int) -> None:
    """Print the figures of each round, their medians and the ratio lines."""
    for i, r in enumerate(rounds):
        first, restore = r["first"], r["restore"]
        print(
            f"round {i + 1}: first read {first['rebuilt_s']:.1f} s (ready {first['ready_s']:.1f} "
            f"s); RSS at the kill {r['rss_at_kill'] / 2**20:,.0f} MiB; restore: ready "
            f"{restore['ready_s']:.1f} s, state rebuilt {restore['rebuilt_s']:.1f} s; "
            f"records counted again {restore['events']:,.0f}, evictions on the restore "
            f"{restore['evicted']:,.0f} (first read: {first['evicted']:,.0f})"
        )

    def median(part: str, key: str) -> float:
        return statistics.median(r[part][key] for r in rounds)

    first_s, ready_s, rebuilt_s = (
        median("first", "rebuilt_s"),
        median("restore", "ready_s"),
        median("restore", "rebuilt_s"),
    )
    pending = min(n, cap)
    print(
        f"first read of {n:,} queries to {pending:,} pending, from process start: median "
        f"{first_s:.1f} s ({n / first_s:,.0f} records/s)"
    )
    print(
        f"restore after kill -9: /readyz 200 after median {ready_s:.1f} s, state rebuilt "
        f"({pending:,} pending, lag 0) after median {rebuilt_s:.1f} s"
    )
    print(f"ratio restore / first read: {rebuilt_s / first_s:.2f}")
    print(f"ratio time to ready / first read: {ready_s / first_s:.2f}")


if __name__ == "__main__":
    main()
