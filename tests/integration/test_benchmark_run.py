"""The Kafka benchmark script still runs against the real broker (tiny size, no timing)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.figures import figure

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_run_kafka.py"


@pytest.mark.usefixtures("admin")  # fails with a clear message when the broker is missing
def test_bench_run_kafka_runs_and_the_service_reads_everything() -> None:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--events", "3000", "--repeat", "1", "--profile"],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    assert "data: 3000 events" in out
    assert re.search(
        r"every variant read 3000 events; the service finalised all \d+ queries: True", out
    )
    figure(out, "ratio run / bare events/s")
    figure(out, "run, process start to all windows published and committed: median")
    # the py-spy run: its samples are put in parts, and the service's own parts are seen
    assert "where run's time goes (py-spy --gil" in out
    figure(out, "in all")
    figure(out, "kafka-python poll (fetch, record parsing)")
