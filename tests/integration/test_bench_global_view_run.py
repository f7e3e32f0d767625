"""The global-view benchmark script still runs against the real broker (tiny size, no timing)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.figures import figure

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_global_view.py"


@pytest.mark.usefixtures("admin")  # fails with a clear message when the broker is missing
def test_bench_global_view_runs_and_prints_its_figures() -> None:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--minutes", "0.5", "--history-hours", "1"],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    ).stdout
    assert "4 input partitions; 2 replicas, then a third" in out
    figure(out, "ratio freshness p95 / commit interval")
    figure(out, "catch-up of a new replica")
    figure(out, "ratio catch-up / first read of the history")
