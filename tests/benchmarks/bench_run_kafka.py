"""Benchmark: `retrieval-monitor run` against a bare kafka-python consume-and-decode loop.

Needs the real broker (``make kafka-up``; ``RETRIEVAL_MONITOR_TEST_KAFKA`` overrides
127.0.0.1:9092). Fresh topics with unique names are created (queries and feedback with 4
partitions each), ``--events`` simulated events (20 results per query, about 1.5
feedback events per query, ending an hour before now) are produced co-partitioned by
query id, and the two variants read them, interleaved, ``--repeat`` times, each with a
fresh consumer group so that each reads from the beginning:

* ``bare``: a subprocess with a ``KafkaConsumer`` (auto commit off, ``max_poll_records``
  2000) subscribed to both topics that polls until it has read every record and
  decodes each value with ``orjson.loads``;
* ``run``: ``python -m service run`` as a subprocess, configured by environment
  variables (``idle_timeout`` 2 s, otherwise the defaults; ``--setting`` changes
  them), watched through ``/metrics``.

Both rates are measured the same way, so that start-up (process start, imports, group
join) is left out: from the first moment some records have been consumed (t0, c0
records) to the moment all N have been (t1), rate = (N - c0) / (t1 - t0). For ``bare``
the moments are taken in the loop after each poll; for ``run`` they are the first
scrapes at which ``retrieval_events_total`` (summed over both topics) is nonzero and
reaches N, so each end is known to within one scrape interval (0.2 s). A scrape costs
the service about 30 ms of CPU under its pipeline lock (some 40 KB of series), which
at 5 Hz slows it measurably, so between the two ends the watcher scrapes less often:
after half the predicted time left, at most every 2 s, and every 0.2 s near the end.
Also reported for the service: process start to ``/readyz``, and process start until
every window is published: all N events read, ``retrieval_pending_queries`` 0, and
``retrieval_queries_finalized_total`` (it moves when a commit confirms the windows)
equal to the number of queries, or settled 5 s short of it (the idle timeout and the
finalisation of the last windows included).

The figure of merit is run events/s / bare events/s (target >= 0.7). Not a test:
figures, not assertions. Topics and consumer groups are deleted at the end unless
``--keep-topics``.

With ``--profile``, one more service run is sampled by py-spy (``--gil``: the thread
holding the interpreter lock, which bounds a single process's throughput) and each
sample is put in a part of the service by its innermost frame in the ``service``
package (kafka-python below the consumer loop is its poll; the producer's sender
thread has no service frame): us of lock time per event, over the whole process life.

    python tests/benchmarks/bench_run_kafka.py [--events 200000] [--repeat 3] [--profile]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: make the tests package importable
    sys.path.insert(0, str(ROOT))

from service.sim.simulator import (  # noqa: E402
    HOUR_MS,
    HYBRID_V7,
    HYBRID_V8,
    SimEvent,
    SimulationConfig,
    generate,
)
from tests.integration.kafka_helpers import (  # noqa: E402
    BOOTSTRAP,
    PARTITIONS,
    ServiceProcess,
    Topics,
    produce,
)

QUERIES_PER_HOUR = 3600.0
ABANDON_RATE = 0.285
"""About 1.5 feedback events per query (the simulator's default 0.25 gives 1.6)."""
FEEDBACK_PER_QUERY = 1.5
MAX_POLL_RECORDS = 2000
SCRAPE_S = 0.2
SETTLE_S = 5.0
"""The finalised count is final when unchanged this long (if short of all queries)."""
TARGET = 0.7


class BenchError(Exception):
    """A variant failed (not a missed target)."""


def simulation(n_events: int) -> SimulationConfig:
    """Enough simulated hours for ``n_events``, ending at least an hour before now."""
    hours = 1.1 * n_events / (QUERIES_PER_HOUR * (1 + FEEDBACK_PER_QUERY)) + 0.5
    duration_ms = int(hours * HOUR_MS)
    start_ms = time.time_ns() // 1_000_000 - duration_ms - HOUR_MS
    return SimulationConfig(
        start_ms=start_ms,
        duration_ms=duration_ms,
        queries_per_hour=QUERIES_PER_HOUR,
        abandon_rate=ABANDON_RATE,
        before=HYBRID_V7,
        after=HYBRID_V8,
    )


def counted(events: Iterator[SimEvent], counts: dict[str, int]) -> Iterator[SimEvent]:
    for event in events:
        counts[event.topic] += 1
        yield event


# -- the bare loop (its own subprocess) ----------------------------------------------------


def run_bare(queries: str, feedback: str, group: str, n: int, timeout_s: float) -> dict[str, Any]:
    """Consume both topics from the beginning until ``n`` records are read and decoded."""
    import orjson
    from kafka import KafkaConsumer

    spawned = time.perf_counter()
    consumer = KafkaConsumer(
        bootstrap_servers=BOOTSTRAP,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_records=MAX_POLL_RECORDS,
        client_id="bench-bare",
    )
    consumer.subscribe([queries, feedback])
    read = 0
    first: tuple[float, int] | None = None
    deadline = time.monotonic() + timeout_s
    while read < n:
        if time.monotonic() > deadline:
            raise BenchError(f"bare consumer read {read} of {n} records in {timeout_s:.0f} s")
        batch = consumer.poll(timeout_ms=200, max_records=MAX_POLL_RECORDS)
        for records in batch.values():
            for record in records:
                orjson.loads(record.value)
            read += len(records)
        if read and first is None:
            first = (time.perf_counter(), read)
    done = time.perf_counter()
    consumer.close(autocommit=False)
    if first is None:
        raise BenchError("no records were read")
    return {
        "events": read,
        "first_records_s": first[0] - spawned,
        "c0": first[1],
        "seconds": done - first[0],
    }


# -- the service (watched from this process) -----------------------------------------------


def series(text: str, names: tuple[str, ...]) -> dict[str, float]:
    """Sum of each named series over its label sets, from the Prometheus text format."""
    out = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in out:
            out[name] += float(line.rsplit(" ", 1)[1])
    return out


WATCHED = (
    "retrieval_events_total",
    "retrieval_pending_queries",
    "retrieval_queries_finalized_total",
    "retrieval_late_events_total",
    "retrieval_evicted_total",
)


def run_service(
    topics: Topics,
    log_path: Path,
    n: int,
    n_queries: int,
    timeout_s: float,
    settings: dict[str, str],
    profile_to: Path | None = None,
) -> dict[str, Any]:
    """Start ``retrieval-monitor run``, watch /metrics until all n are read and published
    (with ``profile_to``, under py-spy, whose raw output goes there)."""
    spawned = time.perf_counter()
    service = ServiceProcess(topics, log_path, **{"idle_timeout": "2s", **settings})
    spy = None
    if profile_to is not None:
        spy_command = [str(Path(sys.executable).with_name("py-spy")), "record"]
        spy_command += ["--pid", str(service.process.pid), "--rate", str(PROFILE_RATE)]
        spy_command += ["--gil", "--nonblocking", "--format", "raw", "--output", str(profile_to)]
        spy = subprocess.Popen(
            spy_command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    ready_s: float | None = None
    first: tuple[float, int] | None = None
    all_read: float | None = None
    last_finalised = (-1.0, 0.0)
    scrapes: list[float] = []
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            if service.process.poll() is not None:
                raise BenchError(
                    f"the service exited ({service.process.returncode}): {service.tail()}"
                )
            if time.monotonic() > deadline:
                raise BenchError(f"timed out after {timeout_s:.0f} s: {service.tail()}")
            now = time.perf_counter()
            if ready_s is None and service.get("/readyz")[0] == 200:
                ready_s = now - spawned
            status, body = service.get("/metrics")
            scrapes.append(time.perf_counter() - now)
            values = series(body.decode() if status == 200 else "", WATCHED)
            events = int(values["retrieval_events_total"])
            if events and first is None:
                first = (now, events)
            if events >= n and all_read is None:
                all_read = now
            finalised = values["retrieval_queries_finalized_total"]
            if all_read is not None and values["retrieval_pending_queries"] == 0:
                # Closed is not yet published: finalised counts move when the commit is
                # confirmed. Done when all are, or when the count has settled short of it.
                if finalised != last_finalised[0]:
                    last_finalised = (finalised, now)
                if finalised >= n_queries or now - last_finalised[1] >= SETTLE_S:
                    published = last_finalised[1]
                    break
            wait = SCRAPE_S
            if first is not None and all_read is None and events > first[1]:
                # A scrape costs the service CPU under its lock: between the first records
                # and the end, halve the predicted time left instead of scraping at 5 Hz.
                left_s = (n - events) * (now - first[0]) / (events - first[1])
                wait = min(2.0, max(SCRAPE_S, left_s / 2))
            time.sleep(max(0.0, wait - (time.perf_counter() - now)))
    finally:
        code = service.stop() if service.process.poll() is None else service.process.returncode
        if spy is not None and spy.wait(timeout=30) != 0:
            raise BenchError("py-spy failed (is it installed? pip install py-spy)")
    if code != 0:
        raise BenchError(f"the service exited with {code} on SIGTERM: {service.tail()}")
    if first is None or all_read is None:
        raise BenchError("the service stopped before reading every record")
    return {
        "events": events,
        "c0": first[1],
        "seconds": all_read - first[0],
        "ready_s": ready_s,
        "first_records_s": first[0] - spawned,
        "published_s": published - spawned,
        "drain_s": published - all_read,
        "finalised": finalised,
        "late": values["retrieval_late_events_total"],
        "evicted": values["retrieval_evicted_total"],
        "assignments": log_path.read_text(errors="replace").count("assigned partitions"),
        "scrape_ms": statistics.median(scrapes) * 1000,
    }


# -- where the service's time goes (py-spy) ------------------------------------------------

PROFILE_RATE = 250
"""py-spy samples a second (of the thread holding the interpreter lock)."""

SERVICE_PARTS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    # (module under service/, its functions (all if empty), part): the frames that say
    # which part a sample is in; others (the metric core, counters, the join's state)
    # belong to the part of the nearest such frame outside them
    ("stream/events.py", (), "decode"),
    ("mapping/", (), "decode"),
    ("stream/pipeline.py", ("query", "feedback", "take", "ignored", "invalid", "is_new"), "join"),
    ("broker/consumer.py", ("_process", "work"), "join"),
    ("stream/pipeline.py", ("advance", "_finalise", "finish", "end_of_input"), "finalise"),
    ("stream/pipeline.py", ("deliver", "confirm", "mark_sent"), "windows in"),
    ("broker/follower.py", (), "follower"),
    ("broker/publisher.py", (), "publish"),
    ("broker/commits.py", (), "publish"),
    ("broker/produce.py", (), "publish"),
    ("http/", (), "http"),
)
PART_NAMES = {
    "poll": "kafka-python poll (fetch, record parsing)",
    "decode": "decode and validate (msgspec)",
    "join": "join and bookkeeping (and the record loop)",
    "finalise": "finalisation (advance, metric core)",
    "windows in": "windows taken in (counters, rolling views, detector)",
    "follower": "window follower (global view)",
    "publish": "publish and commit (transactions, window records)",
    "http": "HTTP (/metrics scrapes, probes)",
    "sender": "kafka-python producer's sender thread",
    "network": "kafka-python's other threads (network, metadata)",
    "imports": "start-up (imports)",
    "other": "other (consumer loop, threads, runtime)",
}


def _frame(frame: str) -> tuple[str, str]:
    """(function, file) of a py-spy raw frame ``function (path/file.py:line)``."""
    function, _, where = frame.partition(" (")
    return function, where.rsplit(":", 1)[0]


def part_of(stack: list[str]) -> str:
    """The part of the service a sample (outermost frame first) belongs to: the innermost
    of its frames that says (SERVICE_PARTS); kafka-python below the consumer loop is its
    poll; a stack with no such frame is start-up or a library thread. py-spy writes paths
    relative to sys.path (``service/stream/join.py``, ``kafka/...``)."""
    if any(frame.startswith("_find_and_load ") for frame in stack):
        return "imports"
    for depth in range(len(stack) - 1, -1, -1):
        function, path = _frame(stack[depth])
        if not path.startswith("service/"):
            continue
        module, function = path.removeprefix("service/"), function.rsplit(".", 1)[-1]
        for prefix, functions, part in SERVICE_PARTS:
            if module.startswith(prefix) and (not functions or function in functions):
                return part
        if module == "broker/consumer.py" and any("(kafka/" in f for f in stack[depth + 1 :]):
            return "poll"
    if any("(kafka/producer/sender.py" in frame for frame in stack):
        return "sender"
    return "network" if any("(kafka/" in frame for frame in stack) else "other"


def profile_parts(raw: str) -> dict[str, int]:
    """Samples per part from py-spy's raw (collapsed stacks) output."""
    parts: dict[str, int] = {}
    for line in raw.splitlines():
        stack_text, _, count = line.rpartition(" ")
        if not stack_text or not count.isdigit():
            continue
        name = PART_NAMES[part_of(stack_text.split(";"))]
        parts[name] = parts.get(name, 0) + int(count)
    return parts


def print_profile(parts: dict[str, int], n: int, bare_rate: float | None) -> None:
    total = sum(parts.values())
    print(
        f"where run's time goes (py-spy --gil at {PROFILE_RATE} Hz over the whole process "
        f"life, {total} samples): us of interpreter-lock time per event"
    )
    for name, samples in sorted(parts.items(), key=lambda item: -item[1]):
        us = samples / PROFILE_RATE / n * 1e6
        print(f"  {name:<54} {us:6.2f}   {samples / total:4.0%}")
    print(f"  {'in all':<54} {total / PROFILE_RATE / n * 1e6:6.2f}")
    if bare_rate:
        print(f"  (the bare loop: {1e6 / bare_rate:.2f} us per record, wall clock)")


# -- the driver ----------------------------------------------------------------------------


def rate(row: dict[str, Any], n: int) -> float | None:
    """Records per second from the first consumed batch to the last (None if one batch)."""
    left = n - row["c0"]
    return left / row["seconds"] if left > 0 and row["seconds"] > 0 else None


def median_rate(rows: list[dict[str, Any]], n: int) -> float | None:
    rates = [r for r in (rate(row, n) for row in rows) if r is not None]
    return statistics.median(rates) if rates else None


def fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep-topics", action="store_true", help="do not delete them at the end")
    parser.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a service setting for the run variant, e.g. exactly_once=false (repeatable)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="one more run under py-spy: where its time goes, us per event (needs py-spy)",
    )
    parser.add_argument(
        "--profile-raw",
        type=Path,
        metavar="PATH",
        help="with --profile, also keep py-spy's collapsed stacks there (for a flame graph)",
    )
    parser.add_argument("--variant", choices=("bare",), help=argparse.SUPPRESS)
    parser.add_argument("--topics", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--group", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.events < 1 or args.repeat < 1:
        parser.error("--events and --repeat must be positive")
    n = args.events
    timeout_s = 120 + n / 1000
    settings = dict(item.split("=", 1) for item in args.setting if "=" in item)
    if len(settings) != len(args.setting):
        parser.error("--setting takes NAME=VALUE")
    if args.variant:
        print(json.dumps(run_bare(*args.topics, args.group, n, timeout_s)))
        return

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
        counts = {"queries": 0, "feedback": 0}
        start = time.perf_counter()
        produced = produce(topics, counted(itertools.islice(generate(simulation(n)), n), counts))
        shown = " ".join(f"{k}={v}" for k, v in {"idle_timeout": "2s", **settings}.items())
        print(f"service settings: {shown} (the others: defaults)")
        print(
            f"data: {produced} events ({counts['queries']} queries x 20 results, "
            f"{counts['feedback']} feedback: {counts['feedback'] / counts['queries']:.2f} per "
            f"query) produced to {topics.queries} and {topics.feedback} ({PARTITIONS} "
            f"partitions each) in {time.perf_counter() - start:.1f} s"
        )
        figures: dict[str, list[dict[str, Any]]] = {"bare": [], "run": []}
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(args.repeat):  # interleaved, so drift hits both variants
                group = f"{prefix}-bare-{r}"
                groups.append(group)
                command = [sys.executable, __file__, "--variant", "bare", "--events", str(n)]
                command += ["--topics", topics.queries, topics.feedback, "--group", group]
                out = subprocess.run(command, capture_output=True, text=True, check=False)
                if out.returncode != 0:
                    raise BenchError(f"the bare consumer failed: {out.stderr[-2000:]}")
                figures["bare"].append(json.loads(out.stdout))
                run_topics = dataclasses.replace(topics, group=f"{prefix}-run-{r}")
                groups.append(run_topics.group)
                log_path = Path(tmp) / f"run-{r}.log"
                figures["run"].append(
                    run_service(run_topics, log_path, n, counts["queries"], timeout_s, settings)
                )
            report(figures, n, counts)
            if args.profile:
                group = f"{prefix}-profile"
                groups.append(group)
                raw_path = Path(tmp) / "profile.txt"
                run_service(
                    dataclasses.replace(topics, group=group),
                    Path(tmp) / "profile.log",
                    n,
                    counts["queries"],
                    timeout_s,
                    settings,
                    profile_to=raw_path,
                )
                parts = profile_parts(raw_path.read_text())
                if args.profile_raw is not None:
                    shutil.copyfile(raw_path, args.profile_raw)
                print_profile(parts, n, median_rate(figures["bare"], n))
    except BenchError as error:
        sys.exit(f"error: {error}")
    finally:
        if not args.keep_topics:
            try:
                admin.delete_topics(names)
                admin.delete_groups(groups)
            except Exception as error:  # leftovers are harmless; say so and go on
                print(f"warning: cleanup of {prefix}.* failed: {error}", file=sys.stderr)
        admin.close()


def report(figures: dict[str, list[dict[str, Any]]], n: int, counts: dict[str, int]) -> None:
    """Print the table and the ratio lines."""
    rates = {}
    for variant, rows in figures.items():
        rates[variant] = median_rate(rows, n)
        runs = ", ".join(fmt(rate(row, n)) for row in rows)
        started = statistics.median(row["first_records_s"] for row in rows)
        print(
            f"{variant:<5} median {fmt(rates[variant]):>9} events/s   (runs: {runs})   "
            f"start to first records {started:.1f} s"
        )
    bare, run = rates["bare"], rates["run"]
    ratio = f"{run / bare:.2f}" if bare and run else "n/a (all read in one batch; use more events)"
    print(f"ratio run / bare events/s: {ratio} (target >= {TARGET})")
    ok = all(row["events"] == n for rows in figures.values() for row in rows)
    runs_ = figures["run"]
    ok = ok and all(row["finalised"] == counts["queries"] for row in runs_)
    print(
        f"every variant read {n} events; the service finalised all {counts['queries']} "
        f"queries: {ok}"
    )
    if not ok:
        for row in runs_:
            print(
                f"  run: read {row['events']}, finalised {row['finalised']:.0f}, late "
                f"{row['late']:.0f}, evicted {row['evicted']:.0f}, {row['assignments']} "
                "partition assignments"
            )

    def median(key: str) -> float:
        values = [row[key] for row in runs_ if row[key] is not None]
        return statistics.median(values) if values else float("nan")

    print(
        f"run, process start to all windows published and committed: median "
        f"{median('published_s'):.1f} s (ready after {median('ready_s'):.1f} s, first records "
        f"after {median('first_records_s'):.1f} s, all read to all published "
        f"{median('drain_s'):.1f} s; a /metrics scrape took {median('scrape_ms'):.0f} ms)"
    )


if __name__ == "__main__":
    main()
