"""Benchmark: resident memory per pending query (20 results) with 1,000,000 queries pending.

Each variant runs in its own fresh subprocess: it builds what it needs first (a corpus
of 200,000 shared chunk-id strings such as ``doc-12345#3``, the imports, an empty
state), collects garbage and reads its resident set size (``/proc/self/statm``); then
it takes ``--queries`` queries and reads the RSS again. The figure is the growth
divided by the number of queries:

* ``pipeline``: a :class:`~service.pipeline.Pipeline` with 4 partitions (query ids
  spread by CRC-32 as producers key them), ``max_pending_queries`` above N and a
  one-day attribution window, fed N ``QueryEvent`` objects (built directly; one
  lives at a time) with 20 results each, 2 retrievers x 3 segments, timestamps 2 ms
  apart, and no feedback, so nothing is finalised and nothing is evicted;
* ``naive``: the same query ids in a ``dict[str, tuple[str, ...]]`` of their 20 chunk
  ids, the strings fresh per query as a JSON decoder makes them (the naive design);
* ``naive-shared``: the same, with the chunk-id strings shared with the corpus (a
  naive design that interns ids), for information.

Query ids are uuid4-like hex (32 characters, ``--ids uuid``) or the simulator's
``s7t1796083200-123456`` form (``--ids sim``). With ``--traced N`` (default 100,000)
each variant also runs once under ``tracemalloc`` at N queries: bytes that Python
allocated, without allocator rounding and fragmentation. The pipeline variant also
breaks its state down per object with ``sys.getsizeof``.

The figure of merit is the pipeline's bytes per pending query (target < 350 since issue
16, < 500 before), and its ratio to the naive design's. Not a test: figures, not
assertions.

    python tests/benchmarks/bench_memory.py [--queries 1000000] [--repeat 3] [--ids uuid|sim]
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import time
import zlib
from datetime import UTC, datetime
from typing import Any

START_MS = 1_796_083_200_000
"""2026-12-01T00:00:00Z: the first query's timestamp."""
SPACING_MS = 2
CORPUS = 200_000
RESULTS = 20
PARTITIONS = 4
TARGET_BYTES = 350
VARIANTS = ("pipeline", "naive", "naive-shared")
LABELS = "pipeline-labels"
"""With ``--labels``: the pipeline with the labels output on (it keeps each pending
query's chunk-id strings beside the join's hashes)."""
RETRIEVERS = ("hybrid-v7", "hybrid-v8")
SEGMENTS = ("support-kb", "docs", "billing")


def rss_bytes() -> int:
    """Current resident set size of this process."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def query_ids(n: int, kind: str) -> Any:
    """``n`` distinct query ids, made one at a time."""
    if kind == "sim":
        return (f"s7t{START_MS // 1000}-{i}" for i in range(n))
    rng = random.Random(1)
    return (f"{rng.getrandbits(128):032x}" for _ in range(n))


def chunk_id(index: int) -> str:
    """``doc-12345#3``: document number and chunk within it (8 per document)."""
    return f"doc-{10_000 + index // 8}#{index % 8}"


def result_indexes(rng: random.Random) -> range:
    """20 distinct corpus positions (a stride through the corpus from a random start)."""
    start = rng.randrange(CORPUS)
    return range(start, start + RESULTS * 7919, 7919)


def feed_pipeline(n: int, ids: str, corpus: list[str], labels: bool = False) -> tuple[Any, float]:
    """A pipeline holding ``n`` pending queries; return it and the measured RSS growth."""
    from service.stream.events import QueryEvent
    from service.stream.join_state import JoinConfig
    from service.stream.mined import LabelRecorder
    from service.stream.pipeline import Pipeline, PipelineConfig

    now_ms = START_MS + 86_400_000
    config = PipelineConfig(
        join=JoinConfig(attribution_ms=86_400_000, idle_timeout_ms=None),
        max_pending_queries=2 * n + PARTITIONS,
    )
    pipeline = Pipeline(config, lambda: now_ms, recorder=LabelRecorder() if labels else None)
    for partition in range(PARTITIONS):
        pipeline.assign(partition)
    offsets = [0] * PARTITIONS
    rng = random.Random(2)
    gc.collect()
    before = rss_bytes()
    for i, query_id in enumerate(query_ids(n, ids)):
        ts_ms = START_MS + i * SPACING_MS
        event = QueryEvent(
            query_id=query_id,
            timestamp=datetime.fromtimestamp(ts_ms / 1000, UTC),
            retriever=RETRIEVERS[i * 2 // n] if n > 1 else RETRIEVERS[0],
            results=[corpus[j % CORPUS] for j in result_indexes(rng)],
            context_k=5,
            segment=SEGMENTS[i % 3],
        )
        partition = zlib.crc32(query_id.encode()) % PARTITIONS
        error = pipeline.query(partition, offsets[partition], event)
        if error is not None:
            raise RuntimeError(f"query {i} was rejected: {error}")
        offsets[partition] += 1
    del event
    gc.collect()
    return pipeline, rss_bytes() - before


def feed_naive(n: int, ids: str, corpus: list[str], shared: bool) -> tuple[Any, float]:
    """``dict[query id, tuple of 20 chunk ids]``; return it and the measured RSS growth."""
    state: dict[str, tuple[str, ...]] = {}
    rng = random.Random(2)
    gc.collect()
    before = rss_bytes()
    for query_id in query_ids(n, ids):
        indexes = result_indexes(rng)
        if shared:
            state[query_id] = tuple([corpus[j % CORPUS] for j in indexes])
        else:
            state[query_id] = tuple([chunk_id(j % CORPUS) for j in indexes])
    gc.collect()
    return state, rss_bytes() - before


def block(size: int) -> int:
    """Bytes pymalloc hands out for an object of ``size`` (16-byte classes up to 512)."""
    return -(-size // 16) * 16 if size <= 512 else size


def breakdown(pipeline: Any, n: int) -> list[tuple[str, float, float]]:
    """Per pending query: (part, sys.getsizeof, bytes allocated with pymalloc rounding)."""
    parts: dict[str, list[float]] = {
        name: [0.0, 0.0]
        for name in (
            "pending value: 12-byte header + 20 int64 hashes",
            "query id (UTF-8 bytes, the dict key)",
            "pending dict (per entry)",
            "window query_ids list (per entry)",
            "window offsets (per entry)",
            "labels dict (no feedback: none)",
        )
    }

    def add(name: str, size: int, allocated: int | None = None) -> None:
        parts[name][0] += size
        parts[name][1] += block(size) if allocated is None else allocated

    for stream in pipeline.streams.values():
        size = sys.getsizeof(stream.pending)
        add("pending dict (per entry)", size, size)
        for query_id, packed in stream.pending.items():
            add("pending value: 12-byte header + 20 int64 hashes", sys.getsizeof(packed))
            add("query id (UTF-8 bytes, the dict key)", sys.getsizeof(query_id))
        size = sys.getsizeof(stream.labels)
        add("labels dict (no feedback: none)", size, size)
        for window in stream.windows.values():
            size = sys.getsizeof(window.query_ids)
            add("window query_ids list (per entry)", size, size)
            size = sys.getsizeof(window.offsets)
            add("window offsets (per entry)", size, size)
    return [(name, size / n, allocated / n) for name, (size, allocated) in parts.items()]


def run_variant(variant: str, n: int, ids: str, traced: bool) -> dict[str, Any]:
    """Build one variant's state of ``n`` queries in this process and measure it."""
    import tracemalloc

    corpus = [chunk_id(i) for i in range(CORPUS)]
    import service.stream.pipeline  # noqa: F401 - imported before the first RSS reading

    if traced:
        tracemalloc.start()
    start = time.perf_counter()
    traced_before = tracemalloc.get_traced_memory()[0] if traced else 0
    if variant in ("pipeline", LABELS):
        state, grown = feed_pipeline(n, ids, corpus, labels=variant == LABELS)
    else:
        state, grown = feed_naive(n, ids, corpus, shared=variant == "naive-shared")
    seconds = time.perf_counter() - start
    out: dict[str, Any] = {"rss_per_query": grown / n, "seconds": seconds}
    if traced:
        out["traced_per_query"] = (tracemalloc.get_traced_memory()[0] - traced_before) / n
        tracemalloc.stop()
    if variant in ("pipeline", LABELS):
        counts = state.counts
        out["pending"] = state.pending_queries
        out["evicted"] = sum(counts.evicted.values())
        out["finalised"] = sum(counts.finalized.values())
        if not traced:
            out["breakdown"] = breakdown(state, n)
    else:
        out["pending"] = len(state)
    return out


def child(variant: str, n: int, ids: str, traced: bool) -> dict[str, Any]:
    command = [sys.executable, __file__, "--variant", variant, "--queries", str(n), "--ids", ids]
    if traced:
        command.append("--in-tracemalloc")
    out = subprocess.run(command, capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--queries", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--ids", choices=("uuid", "sim"), default="uuid")
    parser.add_argument(
        "--traced", type=int, default=100_000, help="queries under tracemalloc (0: skip)"
    )
    parser.add_argument(
        "--labels", action="store_true", help="also the pipeline with the labels output on"
    )
    parser.add_argument("--variant", choices=(*VARIANTS, LABELS), help=argparse.SUPPRESS)
    parser.add_argument("--in-tracemalloc", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.queries < 1 or args.repeat < 1 or args.traced < 0:
        parser.error("--queries and --repeat must be positive, --traced >= 0")
    if args.variant:
        print(json.dumps(run_variant(args.variant, args.queries, args.ids, args.in_tracemalloc)))
        return
    n = args.queries
    example = next(itertools.islice(query_ids(n, args.ids), min(n - 1, 123_456), None))
    print(
        f"data: {n:,} pending queries x {RESULTS} results, query ids like {example!r} "
        f"({len(example)} chars), chunk ids like {chunk_id(2_345 * 8 + 3)!r}"
    )
    variants = (*VARIANTS, LABELS) if args.labels else VARIANTS
    figures: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    for _ in range(args.repeat):
        for variant in variants:  # interleaved, so drift hits every variant
            figures[variant].append(child(variant, n, args.ids, traced=False))
    traced = {v: child(v, args.traced, args.ids, traced=True) for v in VARIANTS if args.traced}
    per_query = {}
    for variant, rows in figures.items():
        values = [r["rss_per_query"] for r in rows]
        per_query[variant] = statistics.median(values)
        extra = ""
        if variant in traced:
            bytes_traced = traced[variant]["traced_per_query"]
            extra = f"   tracemalloc at {args.traced:,}: {bytes_traced:6.0f} B"
        print(
            f"{variant:<13} RSS growth median {per_query[variant]:7.0f} B per query   "
            f"(runs: {', '.join(f'{v:.0f}' for v in values)}; "
            f"{statistics.median(r['seconds'] for r in rows):.1f} s to build){extra}"
        )
    last = figures["pipeline"][-1]
    ok = last["pending"] == n and last["evicted"] == 0 and last["finalised"] == 0
    print(f"pipeline holds all {n:,} queries pending, none evicted or finalised: {ok}")
    print("pipeline state per pending query (sys.getsizeof; allocated with pymalloc rounding):")
    for name, size, allocated in last["breakdown"]:
        print(f"  {name:<36} {size:7.1f} B   {allocated:7.1f} B")
    accounted = sum(a for _, _, a in last["breakdown"])
    print(
        f"  {'total accounted':<36} {sum(s for _, s, _ in last['breakdown']):7.1f} B   "
        f"{accounted:7.1f} B"
    )
    ours = per_query["pipeline"]
    for baseline, what in (
        ("naive", "dict[str, tuple of 20 str], strings as decoded"),
        ("naive-shared", "the same with shared chunk-id strings"),
    ):
        theirs = per_query[baseline]
        ratio = f"{ours / theirs:.2f}" if theirs > 0 else "n/a (no RSS growth measured)"
        print(f"ratio pipeline / {baseline} bytes per pending query: {ratio} ({what})")
    print(f"pipeline bytes per pending query: {ours:.0f} (target < {TARGET_BYTES})")
    if LABELS in per_query:
        print(
            f"with the labels output on: {per_query[LABELS]:.0f} B per pending query "
            f"({per_query[LABELS] / ours:.2f} x; the chunk-id strings of each query are kept)"
        )


if __name__ == "__main__":
    main()
