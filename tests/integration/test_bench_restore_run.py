"""The restore benchmark script still runs against the real broker (tiny size, no timing)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.figures import figure

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_restore.py"


@pytest.mark.usefixtures("admin")  # fails with a clear message when the broker is missing
def test_bench_restore_runs_and_the_restart_rebuilds_the_state() -> None:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--queries", "3000", "--results", "5"],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    assert "data: 3,000 query events x 5 results" in out
    figure(out, "state rebuilt (3,000 pending, lag 0) after median")
    assert "records counted again 0, evictions on the restore 0" in out
    figure(out, "ratio restore / first read")
