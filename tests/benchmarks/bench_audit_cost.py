"""What auditing costs: time per event with auditing off and on, and memory per held request.

Time: the same simulated file (``--hours`` at ``--queries-per-hour``, a careful judge
auditing a 5% sample, so the file holds audit events) is replayed in one process at
``AUDIT_RATE`` 0 (off: the audits are counted and ignored), 0.01 and 0.05, best of
``--repeat``; figures are ratios against the run with auditing off, measured in the same
run (machines here are noisy).

Memory: requests held by one partition's audit join (the 20-result queries of the
simulator, their live grades and the live value of every metric key), measured with
tracemalloc, per request; and the same requests after one audit each.

Run: ``python tests/benchmarks/bench_audit_cost.py [--hours 6] [--repeat 3]``. Prints a
table; nothing is asserted.
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
import time
import tracemalloc
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script
    sys.path.insert(0, str(ROOT))

from service.core.monitor import MonitorConfig  # noqa: E402
from service.metrics.ir import DEFAULT_KS, metric_keys  # noqa: E402
from service.replay import replay  # noqa: E402
from service.sim.audit import JudgeModel  # noqa: E402
from service.sim.simulator import (  # noqa: E402
    SimulationConfig,
    generate,
    simulate_queries,
    write_jsonl,
)
from service.stream.audit_join import AuditConfig, AuditJoin  # noqa: E402
from service.stream.events import AuditEvent  # noqa: E402
from service.stream.pipeline import PipelineConfig  # noqa: E402
from service.times import HOUR_MS  # noqa: E402

START_MS = 1_794_000_000_000


def _replay_s(path: str, rate: float) -> float:
    config = MonitorConfig(pipeline=replace(PipelineConfig(), audit=AuditConfig(rate=rate)))
    windows: list[object] = []
    started = time.perf_counter()
    replay([path], config, windows.extend, errors_to=io.StringIO(), reader=False)
    return time.perf_counter() - started


def _memory(n: int) -> tuple[float, float]:
    """Bytes per held request, before and after one audit each."""
    sim = SimulationConfig(seed=5, start_ms=START_MS, duration_ms=HOUR_MS, queries_per_hour=n)
    queries = list(simulate_queries(sim))
    keys = metric_keys(DEFAULT_KS)
    join = AuditJoin(AuditConfig(rate=1.0), DEFAULT_KS, 300_000)
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for q in queries:
        key = q.query_id.encode()
        join.query(key, list(q.results))
        f = dict.fromkeys(keys, 0.5)
        grades = {hash(c): 1 for c in q.results[:2]}
        join.finalised(key, (q.retriever, q.segment, 0), q.timestamp_ms, 5, grades, f)
    held = tracemalloc.get_traced_memory()[0] - base
    for offset, q in enumerate(queries):
        grades = {c: q.relevant.get(c, 0) for c in q.results}
        event = AuditEvent(q.query_id, 0.0, "audit", "human:careful", grades, q.timestamp_ms)
        join.held[q.query_id].apply(offset, event.judge, event.grades)
    audited = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    return held / len(queries), audited / len(queries)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=6.0)
    parser.add_argument("--queries-per-hour", type=float, default=3000.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--held", type=int, default=20_000, help="requests for the memory figure")
    args = parser.parse_args()
    sim = SimulationConfig(
        seed=17,
        start_ms=START_MS,
        duration_ms=int(args.hours * HOUR_MS),
        queries_per_hour=args.queries_per_hour,
        audit_rate=0.05,
        judges=(JudgeModel("human:careful", delay_ms=(10 * 60_000, 2 * HOUR_MS)),),
    )
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "events.jsonl")
        n = write_jsonl(generate(sim), path)
        runs: dict[float, float] = {}
        for _ in range(args.repeat):
            for rate in (0.0, 0.01, 0.05):
                elapsed = _replay_s(path, rate)
                runs[rate] = min(runs.get(rate, elapsed), elapsed)
    base = runs[0.0]
    print(f"{n} events ({args.hours:g} h at {args.queries_per_hour:.0f} queries/h, 5% audited)")
    print(f"| AUDIT_RATE | replay s (best of {args.repeat}) | us per event | vs auditing off |")
    print("|---|---|---|---|")
    for rate, seconds in runs.items():
        print(f"| {rate:g} | {seconds:.2f} | {seconds / n * 1e6:.2f} | {seconds / base:.3f} |")
    held, audited = _memory(args.held)
    print(
        f"memory per held request: {held:,.0f} bytes (20 results, {len(metric_keys(DEFAULT_KS))} "
        f"live values); after one audit: {audited:,.0f} bytes"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
