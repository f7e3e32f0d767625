"""Benchmark: the pipeline's per-record cost with many partitions, against decoding alone.

Simulated traffic (queries with 20 results, about 1.5 feedback events each) is
encoded as the Kafka records would be, decoded once, and fed to a ``Pipeline`` with
``--partitions`` partitions (query ids spread by CRC-32, as producers key them), best of
``--repeat``. The baseline, measured in the same run, decodes the same records and does
nothing else. The records are fed one call each (``Pipeline.query``/``feedback``) and,
as ``run`` feeds them, in polls of ``--poll`` records cut into one batch per partition
and topic (``Pipeline.take``). Figures: microseconds per record for each, and their
ratio to decoding. No windows are advanced: this is the per-record join and bookkeeping
only. Not a test.

    python tests/benchmarks/bench_pipeline.py [--events 100000] [--partitions 64] [--repeat 3]
        [--poll 500]
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
import zlib

from service.sim.simulator import HYBRID_V7, HYBRID_V8, SimulationConfig, generate
from service.stream.events import FeedbackEvent, QueryEvent, decode_feedback, decode_query
from service.stream.pipeline import Pipeline, PipelineConfig, Record
from service.times import HOUR_MS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--poll", type=int, default=500, help="records per poll (batched)")
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

    def fresh() -> Pipeline:
        pipe = Pipeline(PipelineConfig(), lambda: now)
        for p in range(args.partitions):
            pipe.assign(p)
        return pipe

    def numbered() -> list[tuple[int, int, int, QueryEvent | FeedbackEvent]]:
        """(partition, topic, offset, event) of every record, decoded."""
        offsets = [[0, 0] for _ in range(args.partitions)]
        out = []
        for is_query, p, raw in records:
            topic = 0 if is_query else 1
            out.append(
                (p, topic, offsets[p][topic], (decode_query if is_query else decode_feedback)(raw))
            )
            offsets[p][topic] += 1
        return out

    def per_record() -> float:
        events, pipe = numbered(), fresh()
        start = time.perf_counter()
        for p, topic, offset, event in events:
            if topic == 0:
                pipe.query(p, offset, event)  # type: ignore[arg-type]
            else:
                pipe.feedback(p, offset, event)  # type: ignore[arg-type]
        return time.perf_counter() - start

    def batched() -> float:
        polls = []
        events = numbered()
        for at in range(0, len(events), args.poll):
            poll: dict[tuple[int, int], list[Record]] = {}
            for p, topic, offset, event in events[at : at + args.poll]:
                poll.setdefault((p, topic), []).append((topic, offset, event))  # type: ignore[arg-type]
            polls.append(poll)
        pipe = fresh()
        start = time.perf_counter()
        for poll in polls:
            for (p, _), batch in poll.items():
                pipe.take(p, batch)
        return time.perf_counter() - start

    base = min(decode_only() for _ in range(args.repeat))
    one, many = [], []
    for _ in range(args.repeat):  # alternated: the machine's speed drifts
        one.append(per_record())
        many.append(batched())
    n = len(records)
    print(f"data: {n} records, {args.partitions} partitions, polls of {args.poll}")
    print(f"decode only                     {base / n * 1e6:6.2f} us per record")
    print(f"pipeline, one call per record   {min(one) / n * 1e6:6.2f} us per record (no decoding)")
    print(f"pipeline, one call per batch    {min(many) / n * 1e6:6.2f} us per record (no decoding)")
    print(
        f"ratio pipeline / decode: per record {min(one) / base:.2f}, batched {min(many) / base:.2f}"
    )


if __name__ == "__main__":
    main()
