"""Benchmark: freshness and catch-up of the global view (issue 13), against the commit interval.

Needs the real broker (``make kafka-up``; ``RETRIEVAL_MONITOR_TEST_KAFKA`` overrides
127.0.0.1:9092). Fresh topics (4 input partitions), two replicas A and B of
``python -m service run`` with default settings (``COMMIT_INTERVAL`` 5 s), and a live
stream produced at ``--per-second`` records a second for ``--minutes``: the last two hours
of traffic before now, so that event time runs ahead fast enough for windows to close
(and be published) all along the stream. Measured:

* **freshness**: every 0.5 s, replica B's ``retrieval_global_view_delay_seconds`` (wall
  time from a window record's publication to its arrival in B's view; the record is sent
  before its transaction commits, so this bounds commit-to-visible from above), for the
  windows of *both* replicas' partitions, as a ratio to the commit interval (target: under
  two commit intervals);
* **catch-up**: a third replica C started once the stream is over and the windows are in:
  the time from its process start until its ``/api/v1/windows`` equals A's, over the
  windows of the whole stream plus ``--history-hours`` of older traffic produced first
  (default 24: a day of windows, the detector's reach), against the time A took to
  consume and publish that history from scratch (the baseline).

Figures, not assertions (machines here are noisy):

    python tests/benchmarks/bench_global_view.py [--minutes 4] [--history-hours 24]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: make the tests package importable
    sys.path.insert(0, str(ROOT))

from kafka.admin import KafkaAdminClient, NewTopic  # noqa: E402

from service.sim.simulator import HYBRID_V7, SimulationConfig, generate  # noqa: E402
from service.times import HOUR_MS, wall_ms  # noqa: E402
from tests.integration.kafka_helpers import (  # noqa: E402
    BOOTSTRAP,
    PARTITIONS,
    ServiceProcess,
    Topics,
    produce,
)
from tests.integration.paced_producer import PacedProducer  # noqa: E402

COMMIT_INTERVAL_S = 5.0
LIVE_HOURS = 2


def fresh_topics() -> Topics:
    suffix = uuid.uuid4().hex[:8]
    topics = Topics(
        queries=f"bench-{suffix}.queries",
        feedback=f"bench-{suffix}.feedback",
        windows=f"bench-{suffix}.windows",
        deadletter=f"bench-{suffix}.deadletter",
        group=f"bench-{suffix}",
    )
    admin = KafkaAdminClient(bootstrap_servers=BOOTSTRAP)
    admin.create_topics(
        [
            NewTopic(topics.queries, num_partitions=PARTITIONS, replication_factor=1),
            NewTopic(topics.feedback, num_partitions=PARTITIONS, replication_factor=1),
            NewTopic(topics.windows, num_partitions=1, replication_factor=1),
            NewTopic(topics.deadletter, num_partitions=1, replication_factor=1),
        ]
    )
    admin.close()
    return topics


def windows_of(service: ServiceProcess) -> list[object] | None:
    status, body = service.get("/api/v1/windows")
    return json.loads(body)["windows"] if status == 200 else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=4.0)
    parser.add_argument("--per-second", type=int, default=200)
    parser.add_argument("--history-hours", type=float, default=24.0)
    args = parser.parse_args()
    topics = fresh_topics()
    tmp = Path(tempfile.mkdtemp(prefix="bench-global-"))
    now = wall_ms()
    history = SimulationConfig(
        seed=3,
        start_ms=now - int(args.history_hours * HOUR_MS) - LIVE_HOURS * HOUR_MS,
        duration_ms=int(args.history_hours * HOUR_MS),
        queries_per_hour=1200,
        before=HYBRID_V7,
        id_prefix="hist-",
    )
    produced = produce(topics, generate(history))
    a = ServiceProcess(topics, tmp / "a.log", transactional_id="bench-a")
    started = time.monotonic()
    a.wait_ready(120)
    # A's first read of the history: until its windows stop growing for 2 commit intervals
    last, stable_since = None, time.monotonic()
    while time.monotonic() - stable_since < 2 * COMMIT_INTERVAL_S + 1:
        current = windows_of(a)
        if current != last:
            last, stable_since = current, time.monotonic()
        time.sleep(0.5)
    first_read_s = stable_since - started
    history_windows = len(last or [])
    b = ServiceProcess(topics, tmp / "b.log", transactional_id="bench-b")
    b.wait_ready(120)
    records = args.per_second * args.minutes * 60
    live = SimulationConfig(
        seed=4,
        start_ms=now - LIVE_HOURS * HOUR_MS,
        duration_ms=LIVE_HOURS * HOUR_MS,
        queries_per_hour=records / 3 / LIVE_HOURS,  # about 3 records a query
        before=HYBRID_V7,
        id_prefix="live-",
    )
    events = list(generate(live))
    producer = PacedProducer(topics, events, per_second=args.per_second)
    delays = []
    while producer.produced < len(events):
        value = b.samples().get(("retrieval_global_view_delay_seconds", ()))
        if value is not None:
            delays.append(value)
        time.sleep(0.5)
    producer.join()
    c = ServiceProcess(topics, tmp / "c.log", transactional_id="bench-c")
    c_started = time.monotonic()
    target = windows_of(a)
    while windows_of(c) != target:
        if time.monotonic() - c_started > 600:
            raise SystemExit(f"the new replica did not catch up in 600 s: {c.tail()}")
        time.sleep(0.25)
        target = windows_of(a)
    catch_up_s = time.monotonic() - c_started
    for service in (a, b, c):
        service.stop()
    print(
        f"data: {produced:,} history events ({args.history_hours:g} h, {history_windows} "
        f"windows merged) + {len(events):,} live events over {args.minutes:g} min at "
        f"{args.per_second}/s; 4 input partitions; 2 replicas, then a third"
    )
    if delays:
        median, p95 = statistics.median(delays), sorted(delays)[int(0.95 * (len(delays) - 1))]
        print(
            f"freshness on replica B (publication to its view, {len(delays)} samples): "
            f"median {median:.2f} s, p95 {p95:.2f} s, max {max(delays):.2f} s"
        )
        print(
            f"ratio freshness p95 / commit interval: {p95 / COMMIT_INTERVAL_S:.2f} (target < 2.0)"
        )
    print(f"catch-up of a new replica: {catch_up_s:.1f} s from its start to the same windows as A")
    print(f"ratio catch-up / first read of the history: {catch_up_s / first_read_s:.3f}")


if __name__ == "__main__":
    main()
