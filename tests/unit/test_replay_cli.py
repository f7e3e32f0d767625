"""``simulate --jsonl`` then ``replay --windows-out`` equals the offline evaluation of the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from service.cli import main
from service.stream.events import FeedbackEvent, QueryEvent, feedback_from, query_from
from service.stream.reference import evaluate_event_log
from service.stream.windows import ClosedWindow

BAD_LINES = [
    b"not json at all",
    b'{"topic": "queries", "event": {"query_id": "x", "timestamp": "2026-12-01T00:00:00"}}',
    b'{"topic": "feedback", "event": {"query_id": "x", "timestamp": 1796083200, '
    b'"chunk_id": "c", "signal": "like"}}',
    b'{"topic": "clicks", "event": {}}',
    b'{"topic": "queries", "event": {"query_id": "y", "timestamp": 1796083200, '
    b'"retriever": "v", "results": "doc-1"}}',
]


def _events(path: Path) -> tuple[list[QueryEvent], list[FeedbackEvent]]:
    queries, feedback = [], []
    for raw in path.read_bytes().splitlines():
        line = json.loads(raw)
        if line["topic"] == "queries":
            queries.append(query_from(line["event"]))
        else:
            feedback.append(feedback_from(line["event"]))
    return queries, feedback


def test_simulate_then_replay_equals_offline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = tmp_path / "events.jsonl"
    code = main(
        [
            "simulate", "--jsonl", str(events), "--start", "2026-11-30T00:00:00Z",
            "--hours", "2h", "--deploy-at", "75m", "--quality-drop", "0.1", "--seed", "5",
            "--queries-per-hour", "1200",
        ]
    )  # fmt: skip
    assert code == 0
    queries, feedback = _events(events)
    assert {q.retriever for q in queries} == {"hybrid-v7", "hybrid-v8"}
    expected = evaluate_event_log(queries, feedback)

    # bad lines spread through the file: each is reported and skipped, nothing else changes
    lines = events.read_bytes().splitlines()
    step = len(lines) // (len(BAD_LINES) + 1)
    for i, bad in enumerate(BAD_LINES, start=1):
        lines.insert(i * step + i - 1, bad)
    dirty = tmp_path / "dirty.jsonl"
    dirty.write_bytes(b"\n".join(lines) + b"\n")

    out = tmp_path / "windows.jsonl"
    capsys.readouterr()
    assert main(["replay", str(dirty), "--windows-out", str(out)]) == 0
    err = capsys.readouterr().err
    got = {}
    for raw in out.read_text().splitlines():
        window = ClosedWindow.from_record(json.loads(raw))
        assert window.key not in got
        got[window.key] = window
    assert got == expected
    assert "5 invalid" in err
    for reason in ("invalid_json", "naive_timestamp", "unknown_signal", "invalid_topic"):
        assert f"({reason})" in err
    first_bad = step + 1  # 1-based line number of the first inserted bad line
    assert f"dirty.jsonl:{first_bad}: skipped (invalid_json)" in err


def test_replay_reports_a_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(tmp_path / "absent.jsonl")]) == 2
    assert "absent.jsonl" in capsys.readouterr().err
