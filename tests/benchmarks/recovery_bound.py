"""How long a version fixed in place stays open: the stated bound next to measured runs.

A regression closes as ``recovered`` once its recovery test (``service/detect/recovery.py``)
has gathered ``log c`` of evidence (``c``: the boundaries in 100 years) against "still
worse than the baseline by half the opening drop", and held it for
``REGRESSION_CLOSE_AFTER``. The stated bound is ``expected_values`` (values a fixed
version needs) over the slice's labelled values per hour, plus ``close_after``.

Each run: a day and 2 hours of the previous version (p = 0.85, 0/1 values), a version
whose mean is lower by the drop for 3 hours, then the same version fixed (back to 0.85)
for 30 hours, through the real detector; the time from the fix to ``closed_at`` (less the
attribution window) is measured.

Run: ``python tests/benchmarks/recovery_bound.py [--runs 5]`` (about a minute). Prints a
table; nothing is asserted.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import numpy as np

from service.detect.detector import Detector
from service.detect.model import CloseReason, DetectorConfig
from service.detect.recovery import expected_values
from service.metrics.aggregates import aggregate
from service.stream.windows import ClosedWindow
from service.times import HOUR_MS

W = 300_000
T0 = 1_796_083_200_000
BASE = 0.85
CONFIG = DetectorConfig(metrics=("recall@5",), window_ms=W, labelled_share=False)


def _traffic(
    retriever: str, start: int, hours: float, p: float, per_window: int, rng: np.random.Generator
) -> list[ClosedWindow]:
    out = []
    for i in range(round(hours * HOUR_MS / W)):
        values = (rng.random(per_window) < p).astype(np.float64)
        s = start + i * W
        out.append(
            ClosedWindow(
                retriever,
                "kb",
                0,
                s,
                s + W,
                per_window,
                per_window,
                aggregate({"recall@5": values}),
            )
        )
    return out


def run_one(drop: float, per_window: int, seed: int) -> tuple[float | None, float] | None:
    """Hours from the fix to the close (None: still open after 30 h) and the stated bound;
    None when the drop opened no regression."""
    rng = np.random.default_rng(seed)
    deploy, fix = T0 + 26 * HOUR_MS, T0 + 29 * HOUR_MS
    windows = _traffic("v7", T0, 26, BASE, per_window, rng)
    windows += _traffic("v8", deploy, 3, BASE - drop, per_window, rng)
    windows += _traffic("v8", fix, 30, BASE, per_window, rng)
    detector = Detector(CONFIG)
    detector.add(windows)
    detector.advance(fix + 30 * HOUR_MS)
    opened = [r for r in detector.opened if r.key[0] == "v8"]
    if not opened or opened[0].recovery is None:
        return None
    r = opened[0]
    assert r.recovery is not None
    per_hour = per_window * HOUR_MS / W
    bound = expected_values(r.recovery, BASE * (1 - BASE), W) / per_hour
    bound += CONFIG.close_after_ms / HOUR_MS
    if r.closed_reason != CloseReason.RECOVERED or r.closed_ms is None:
        return None, bound
    return (r.closed_ms - CONFIG.attribution_ms - fix) / HOUR_MS, bound


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    print(
        "| drop | labelled / h | opened | stated (h) | measured median (h) | max (h) "
        "| closed as recovered within 30 h |"
    )
    print("|---|---|---|---|---|---|---|")
    for drop in (0.05, 0.10, 0.20):
        for per_window in (25, 80, 250):
            runs = [run_one(drop, per_window, seed) for seed in range(args.runs)]
            results = [r for r in runs if r is not None]
            times = [t for t, _ in results if t is not None]
            bound = f"{statistics.median(b for _, b in results):.1f}" if results else "-"
            median = f"{statistics.median(times):.1f}" if times else "-"
            worst = f"{max(times):.1f}" if times else "-"
            print(
                f"| {drop:.2f} | {per_window * 12} | {len(results)}/{len(runs)} | {bound} | "
                f"{median} | {worst} | {len(times)}/{len(results)} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
