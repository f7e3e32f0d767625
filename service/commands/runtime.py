"""Interpreter settings for the long-running commands (``run``, ``replay``, ``demo``)."""

from __future__ import annotations

import gc

GC_THRESHOLDS = (50_000, 20, 20)
"""Young-generation collections every 50,000 allocations instead of 700.

The pending state is millions of small tracked objects that live for minutes, so the
default thresholds collect the young generation every few hundred records and
traverse the same survivors again and again (``tests/benchmarks/bench_replay.py
--breakdown`` measures replay with these settings). Full collections are still paced
by CPython's own rule (only when the survivors grew by a quarter).
"""


def tune_gc() -> None:
    """Collect less often, and never re-examine what was allocated during start-up."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
