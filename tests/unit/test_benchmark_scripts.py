"""The benchmark scripts still run and their variants still agree (tiny sizes, no timing claims)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.figures import figure

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def test_bench_evaluate_runs_and_all_variants_agree() -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / "bench_evaluate.py"),
            "--queries",
            "300",
            "--results",
            "30",
            "--repeat",
            "1",
            "--breakdown",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    assert "mean ndcg@10 equal in all variants (1e-9): True" in out
    assert "where our time goes (us per run line, 9000 lines):" in out
    figure(out, "read run")
    assert out.count("ratio pytrec_eval time / our time") == 2
    figure(out, "ratio pytrec_eval time / our time, end to end, files to metrics")
    figure(out, "ratio pytrec_eval time / our time, evaluation of in-memory data")


@pytest.mark.slow
def test_bench_detector_runs_and_detects_the_drops() -> None:
    """One no-change run and one run of two kinds: the table has every rule, and the
    sequential detector finds the 5-point drop and the find-rate-only drop (fixed seeds)."""
    out = subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / "bench_detector.py"),
            "--runs",
            "1",
            "--null-runs",
            "1",
            "--kinds",
            "drop,find rate only",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    ).stdout
    rows = [line for line in out.splitlines() if line.startswith("| ")]
    detector = [line for line in rows if "**sequential detector**" in line]
    assert len(detector) == 3, out  # false alarms, then one row per kind
    assert all("100% (1/1)" in line for line in detector[1:]), out
    assert any(line.startswith("| per-look Welch detector") for line in rows), out
    assert "(tuned on the no-change runs)" in out
