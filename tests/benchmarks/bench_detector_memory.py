"""Benchmark: the regression detector's memory per slice and day of history.

Since ``REGRESSION_BASELINE_DAYS`` (default 7) the detector keeps every slice's closed
windows for ``reach_ms`` (8 days at the defaults): what does a slice-day cost, and how
does it grow with the partitions of the queries topic?

For each partition count, a fresh subprocess builds a :class:`~service.detect.detector.Detector`
with the default configuration, feeds it ``--days`` days of 5-minute windows of
``--slices`` slices (every partition's window of every slice, metrics with realistic
fixed-point sums), lets it evaluate every boundary as ``run`` does, and reads the bytes
Python allocated (``tracemalloc``) before and after. The figure is that growth per
slice-day. Against it, in the same process and on the same windows:

* ``rows once``: each window's merged row (one per window start, not per partition) as
  the same Python ints, in a list per slice: what any exact design must hold at least.

Run: ``python tests/benchmarks/bench_detector_memory.py [--days 8] [--slices 6]
[--partitions 1,4,12]`` (about a minute). Prints a table; nothing is asserted.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from service.detect.detector import Detector  # noqa: E402
from service.detect.history import window_row  # noqa: E402
from service.detect.model import DetectorConfig  # noqa: E402
from service.metrics.aggregates import SCALE, Moments  # noqa: E402
from service.stream.windows import ClosedWindow  # noqa: E402
from service.times import DAY_MS  # noqa: E402

START_MS = 1_796_083_200_000
QUERIES_PER_WINDOW = 12
"""Per slice and partition (1,500 queries/h over 6 slices and 1 partition is about 20)."""


def _moments(rng: random.Random, n: int) -> Moments:
    """The exact sums of ``n`` metric values in [0, 1] (fixed point, as the pipeline's)."""
    values = [rng.random() for _ in range(n)]
    fx = [round(v * SCALE) for v in values]
    return Moments(n, sum(fx), sum(f * f for f in fx) // SCALE)


def windows(days: int, slices: int, partitions: int, seed: int = 7) -> Iterator[list[ClosedWindow]]:
    """Every closed window of the span, one batch per window start (oldest first), made
    as they are needed (as ``run`` decodes them: only what the detector keeps stays)."""
    rng = random.Random(seed)
    config = DetectorConfig()
    metrics, step = config.metrics, config.window_ms
    for start in range(START_MS, START_MS + days * DAY_MS, step):
        batch = []
        for s in range(slices):
            for p in range(partitions):
                n = QUERIES_PER_WINDOW
                labelled = rng.randint(n // 2, n)
                batch.append(
                    ClosedWindow(
                        retriever=f"v{s % 2}",
                        segment=f"seg{s // 2}",
                        partition=p,
                        start_ms=start,
                        end_ms=start + step,
                        queries=n,
                        labelled=labelled,
                        metrics={m: _moments(rng, labelled) for m in metrics},
                    )
                )
        yield batch


def measure(days: int, slices: int, partitions: int) -> dict[str, float]:
    """One subprocess's figures: bytes per slice-day for the detector and the baseline."""
    config = DetectorConfig()
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    detector = Detector(config)
    t0 = time.perf_counter()
    end = START_MS
    for batch in windows(days, slices, partitions):
        detector.add(batch)
        end = batch[0].end_ms
        detector.advance(end)
    seconds = time.perf_counter() - t0
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    kept_days = min(days, config.reach_ms / DAY_MS)

    # the baseline: each window's merged row once, per slice
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    merged: dict[tuple[str, str], dict[int, list[int]]] = {}
    for batch in windows(days, slices, partitions):
        for w in batch:
            row = window_row(w, config.metrics, config.labelled_share)
            rows = merged.setdefault((w.retriever, w.segment), {})
            current = rows.get(w.start_ms)
            # (fresh ints, as a decoded window's: 0 + a large int is a new object)
            rows[w.start_ms] = [a + b for a, b in zip(current or [0] * len(row), row, strict=True)]
    horizon = end - kept_days * DAY_MS
    for rows in merged.values():
        for start in [s for s in rows if s < horizon]:
            del rows[start]
    gc.collect()
    once = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    per = slices * kept_days
    return {
        "detector": held / per,
        "once": once / per,
        "seconds": seconds,
        "kept_days": kept_days,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--days", type=int, default=8)
    parser.add_argument("--slices", type=int, default=6)
    parser.add_argument("--partitions", default="1,4,12")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(measure(args.days, args.slices, args.one)))
        return
    print(
        f"detector history, {args.slices} slices, {args.days} days of 5-minute windows, "
        f"{QUERIES_PER_WINDOW} queries per slice, partition and window"
    )
    print("| partitions | kept days | detector per slice-day | rows once | ratio | evaluate s |")
    print("|---|---|---|---|---|---|")
    for partitions in (int(p) for p in args.partitions.split(",")):
        cmd = [sys.executable, __file__, "--one", str(partitions)]
        cmd += ["--days", str(args.days), "--slices", str(args.slices)]
        r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        print(
            f"| {partitions} | {r['kept_days']:.0f} | {r['detector'] / 1e6:.2f} MB "
            f"| {r['once'] / 1e6:.3f} MB | {r['detector'] / r['once']:.1f} | {r['seconds']:.1f} |"
        )


if __name__ == "__main__":
    main()
