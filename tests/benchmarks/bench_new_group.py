"""Benchmark: a monitor started in a new consumer group builds its history from the topics.

Needs the real broker (``make kafka-up``; ``RETRIEVAL_MONITOR_TEST_KAFKA`` overrides
127.0.0.1:9092). Fresh topics are created and ``--hours`` of simulated traffic ending
now is produced (``--queries-per-hour``, three segments), with a new version deployed
``--deploy-before`` hours before the end: the previous version served for more than a
day before it. Then ``python -m service run`` starts in a group that has never
committed: its consumer starts from the earliest retained offsets, replays everything
through the same pipeline, and the detector compares the deploy with the previous
version's same hours one day earlier (a day of history), not with the hours just before
the switch (a line).

Prints the events produced, the time from the process start until the detector has
evaluated past the end of the data (the catch-up), the rate, and the deploy comparison
``/api/v1/tests`` shows: its baseline's size against the previous version's labelled
values over the same hours a day earlier (equal when it is the day-before comparison).
Not a test: figures, not assertions.

    python tests/benchmarks/bench_new_group.py [--hours 27] [--deploy-before 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: make the tests package importable
    sys.path.insert(0, str(ROOT))

from kafka.admin import KafkaAdminClient  # noqa: E402

from service.sim.simulator import HYBRID_V7, HYBRID_V8, SimulationConfig, generate  # noqa: E402
from service.stream.windows import ClosedWindow  # noqa: E402
from service.times import DAY_MS, HOUR_MS, parse_aware_ms  # noqa: E402
from tests.integration.conftest import create_topics  # noqa: E402
from tests.integration.kafka_helpers import (  # noqa: E402
    BOOTSTRAP,
    FAST,
    ServiceProcess,
    expected_windows,
    produce,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=27.0)
    parser.add_argument("--deploy-before", type=float, default=2.0)
    parser.add_argument("--queries-per-hour", type=float, default=1500.0)
    args = parser.parse_args()
    now = int(time.time() * 1000)
    end = now - 40 * 60_000  # every window final by idleness once the data is read
    start = end - int(args.hours * HOUR_MS)
    switch = end - int(args.deploy_before * HOUR_MS)
    sim = SimulationConfig(
        seed=41,
        start_ms=start,
        duration_ms=end - start,
        queries_per_hour=args.queries_per_hour,
        before=HYBRID_V7,
        after=HYBRID_V8,
        switch_at_ms=switch,
        id_prefix=f"ng{uuid.uuid4().hex[:6]}-",
    )
    admin = KafkaAdminClient(bootstrap_servers=BOOTSTRAP, request_timeout_ms=10_000)
    topics = create_topics(admin)  # (the regressions topic compacted, as in the tests)
    events = list(generate(sim))
    started = time.perf_counter()
    produce(topics, events)
    produced_s = time.perf_counter() - started
    expected: dict[object, ClosedWindow] = expected_windows(events)
    folder = Path(tempfile.mkdtemp(prefix="bench-new-group-"))
    service = ServiceProcess(topics, folder / "run.log", **FAST)
    started = time.monotonic()
    try:

        def caught_up() -> bool:
            status, body = service.get("/api/v1/regressions")
            through = json.loads(body)["evaluated_through"] if status == 200 else None
            return through is not None and (parse_aware_ms(through) or 0) >= end

        service.wait_progressing(caught_up, "the new group to catch up")
        catch_up_s = time.monotonic() - started
        body = json.loads(service.get("/api/v1/tests?retriever=hybrid-v8")[1])
    finally:
        service.stop()
        admin.delete_topics(
            [topics.queries, topics.feedback, topics.windows, topics.deadletter, topics.regressions]
        )
        admin.close()
    print(
        f"{len(events)} events ({args.hours:g} h at {args.queries_per_hour:.0f} queries/h, "
        f"deploy {args.deploy_before:g} h before the end) produced in {produced_s:.1f} s"
    )
    print(
        f"new group: caught up (detector past the end of the data) in {catch_up_s:.1f} s "
        f"from the process start: {len(events) / catch_up_s:,.0f} events/s"
    )
    print("| segment | kind | baseline | n_baseline | v7 the same hours a day earlier | why_not |")
    print("|---|---|---|---|---|---|")
    # a segment's deploy starts at the new version's first window in it and its evidence
    # ends with its last one (at 600 queries/h a segment's queries may miss the switch's
    # window, or the last, partial one): the same hours a day earlier are those, per segment
    spans: dict[str, tuple[int, int]] = {}
    for w in expected.values():
        if w.retriever == "hybrid-v8":
            first, last = spans.get(w.segment, (w.start_ms, w.end_ms))
            spans[w.segment] = (min(first, w.start_ms), max(last, w.end_ms))
    for row in body["tests"]:
        if row["kind"] != "deploy" or row["metric"] != "recall@5":
            continue
        segment = row["segment"]
        same_hours = sum(
            w.metrics["recall@5"].count
            for w in expected.values()
            if w.retriever == "hybrid-v7"
            and w.segment in spans
            and segment in ("*", w.segment)
            and spans[w.segment][0] - DAY_MS <= w.start_ms < spans[w.segment][1] - DAY_MS
            and "recall@5" in w.metrics
        )
        print(
            f"| {segment} | {row['kind']} | {row['baseline']} | "
            f"{row['n_baseline']} | {same_hours} | {row['why_not']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
