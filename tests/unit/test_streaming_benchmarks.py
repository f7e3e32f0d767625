"""The streaming benchmark scripts still run and print their figures (tiny sizes, no timing)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.figures import figure

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _run(script: str, *args: str) -> str:
    return subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout


def test_bench_replay_runs_and_every_query_is_finalised() -> None:
    out = _run("bench_replay.py", "--events", "3000", "--repeat", "1", "--breakdown")
    assert "data: 3000 events" in out
    assert "every variant read 3000 events, none invalid, all" in out
    assert re.search(r"queries finalised in \d+ windows: True", out)
    figure(out, "ratio replay / bare events/s, in process")
    figure(out, "ratio replay / bare events/s, whole processes")
    figure(out, "ratio validate-only / bare events/s")
    parts = [
        figure(out, part)
        for part in (
            "read and decode",
            "join and bookkeeping, the loop",
            "finalisation (advance)",
            "taking windows in (published)",
        )
    ]
    assert abs(sum(parts) - figure(out, "replay in all")) < 0.05  # (rounded to 0.01 each)


def test_bench_replay_cpu_runs_both_trees_in_alternated_pairs(tmp_path: Path) -> None:
    root = str(BENCHMARKS.parents[1])  # (this tree on both sides: its .venv runs the replays)
    out = _run("bench_replay_cpu.py", "--before", root, "--events", "3000", "--pairs", "2")
    assert "2 alternated pairs of replay of 3000 events" in out
    before, after = figure(out, "before  CPU s median"), figure(out, "after   CPU s median")
    ratio = figure(out, "ratio of medians after / before")
    assert abs(ratio - after / before) < 0.01
    missing = subprocess.run(
        [sys.executable, str(BENCHMARKS / "bench_replay_cpu.py"), "--before", str(tmp_path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 2
    assert "no .venv/bin/retrieval-monitor (run make venv there)" in missing.stderr


def test_bench_window_records_runs_and_reads_every_window_back() -> None:
    out = _run("bench_window_records.py", "--events", "3000", "--repeat", "1")
    assert re.search(r"data: \d+ window records", out)
    assert "every record read back as the window written: True" in out
    for label in ("orjson.loads", "decode_windows", "WindowView.add"):
        assert re.search(re.escape(label) + r"\s+median\s+\d[\d.]* us per record", out), out
    figure(out, "read back in all")


def test_bench_records_runs_and_unpacks_every_record_as_kafka_python() -> None:
    out = _run("bench_records.py", "--events", "2000", "--per-batch", "7", "--repeat", "1")
    assert re.search(r"data: 2000 records in 1 fetch responses of one partition", out)
    assert "every record unpacked as kafka-python unpacks it: True" in out
    for label in ("kafka-python", "lean", "orjson.loads"):
        assert re.search(re.escape(label) + r"\s+median\s+\d[\d.]* us per record", out), out
    figure(out, "ratio kafka-python / lean us per record")


@pytest.mark.slow
def test_bench_memory_runs_and_nothing_is_finalised_or_evicted() -> None:
    out = _run("bench_memory.py", "--queries", "2000", "--repeat", "1", "--traced", "500")
    assert "pipeline holds all 2,000 queries pending, none evicted or finalised: True" in out
    # RSS growth over 2,000 queries is within the allocator's noise (it may even be
    # negative): the tiny run checks the lines are there, and the deterministic figures
    assert "ratio pipeline / naive bytes per pending query:" in out
    assert re.search(r"pipeline bytes per pending query: -?\d+ \(target < 350\)", out)
    figure(out, "tracemalloc at 500")
    figure(out, "total accounted")
    # the per-object breakdown: a 12-byte header and 20 int64 hashes are 172 bytes plus
    # the bytes object's own 33; a 32-character query id is 65 bytes as bytes
    assert re.search(r"pending value: 12-byte header \+ 20 int64 hashes\s+205\.0 B", out)
    assert re.search(r"query id \(UTF-8 bytes, the dict key\)\s+65\.0 B", out)
