"""Benchmark: the pipeline's per-record cost with many partitions, against decoding alone.

Simulated traffic (queries with 20 results, about 1.5 feedback events each) is
encoded as the Kafka records would be, decoded once, and fed to a ``Pipeline`` with
``--partitions`` partitions (query ids spread by CRC-32, as producers key them), best of
``--repeat``. The baseline, measured in the same run, decodes the same records and does
nothing else. Figures: microseconds per record for both, and their ratio. No windows
are advanced: this is the per-record join and bookkeeping only. Not a test.

    python tests/benchmarks/bench_pipeline.py [--events 100000] [--partitions 64] [--repeat 3]
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
import zlib

from service.sim.simulator import HYBRID_V7, HYBRID_V8, SimulationConfig, generate
from service.stream.events import decode_feedback, decode_query
from service.stream.pipeline import Pipeline, PipelineConfig
from service.times import HOUR_MS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    hours = args.events / (3600 * 2.5) + 1
    config = SimulationConfig(
        duration_ms=int(hours * HOUR_MS), queries_per_hour=3600.0, before=HYBRID_V7, after=HYBRID_V8
    )
    records = [
        (e.topic == "queries", zlib.crc32(e.key.encode()) % args.partitions, json.dumps(e.event))
        for e in itertools.islice(generate(config), args.events)
    ]
    now = config.end_ms + HOUR_MS

    def decode_only() -> float:
        start = time.perf_counter()
        for is_query, _, raw in records:
            (decode_query if is_query else decode_feedback)(raw)
        return time.perf_counter() - start

    def pipeline() -> float:
        events = [(q, p, (decode_query if q else decode_feedback)(raw)) for q, p, raw in records]
        pipe = Pipeline(PipelineConfig(), lambda: now)
        for p in range(args.partitions):
            pipe.assign(p)
        offsets = [[0, 0] for _ in range(args.partitions)]
        start = time.perf_counter()
        for is_query, p, event in events:
            topic = 0 if is_query else 1
            take = pipe.query if is_query else pipe.feedback
            take(p, offsets[p][topic], event)  # type: ignore[arg-type]
            offsets[p][topic] += 1
        return time.perf_counter() - start

    base = min(decode_only() for _ in range(args.repeat))
    took = min(pipeline() for _ in range(args.repeat))
    n = len(records)
    print(f"data: {n} records, {args.partitions} partitions")
    print(f"decode only      {base / n * 1e6:6.2f} us per record")
    print(f"pipeline records {took / n * 1e6:6.2f} us per record (decoding not included)")
    print(f"ratio pipeline / decode: {took / base:.2f}")


if __name__ == "__main__":
    main()
