"""The new-group benchmark still runs against the real broker, and a new group's detector
compares a deploy with the previous version's same hours a day earlier (small size)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.figures import figure

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_new_group.py"


@pytest.mark.usefixtures("admin")  # fails with a clear message when the broker is missing
def test_a_new_group_builds_a_day_of_history_from_the_topics() -> None:
    # 26.5 h: the deploy's day-before comparison needs the previous version's first window
    # of the segment to start a day before the deploy's; with 26 h (a day and the 2 h of
    # the deploy) that held only when a query of each segment fell in the first, partial
    # window, which depends on the minute the test starts at
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--hours", "26.5", "--queries-per-hour", "600"],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    ).stdout
    figure(out, "caught up (detector past the end of the data) in")
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| ")][1:]
    rows = [[cell.strip() for cell in row] for row in rows if not row[0].startswith("---")]
    assert {row[0] for row in rows} == {"*", "billing", "docs", "support-kb"}, out
    for segment, kind, baseline, n_baseline, same_hours, _ in rows:
        assert (kind, baseline) == ("deploy", "hybrid-v7"), out
        assert int(n_baseline) == int(same_hours) > 0, (segment, out)
