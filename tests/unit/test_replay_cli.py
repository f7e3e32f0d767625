"""``simulate --jsonl`` then ``replay --windows-out`` equals the offline evaluation of the file."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from service.cli import main
from service.monitor import MonitorConfig
from service.replay import replay
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


def test_bad_lines_are_reported_in_input_order_across_kinds_and_files(tmp_path: Path) -> None:
    """A line the timestamp guard refuses (found when its batch is taken) and lines that do
    not decode (found as read) are reported in input order, the limit counting in that
    order too, and the good lines between them are replayed."""

    def query(query_id: str, timestamp: int) -> bytes:
        event = {"query_id": query_id, "timestamp": timestamp, "retriever": "v", "results": ["a"]}
        return json.dumps({"topic": "queries", "event": event}).encode()

    now_s = 1_796_083_200
    first = [
        query("ok-1", now_s),
        query("future", now_s + 86_400),
        b"not json",
        query("ok-2", now_s),
    ]
    second = [b"{}", query("future-2", now_s + 86_400), query("ok-3", now_s)]
    paths = [tmp_path / "b.jsonl", tmp_path / "a.jsonl"]  # (not in name order)
    for path, lines in zip(paths, (first, second), strict=True):
        path.write_bytes(b"\n".join(lines) + b"\n")
    errors = io.StringIO()
    monitor, report = replay(
        [str(p) for p in paths],
        MonitorConfig(),
        lambda _: None,
        now_ms=lambda: now_s * 1000,
        errors_to=errors,
        max_errors_shown=3,
    )
    shown = [line.split(": skipped (") for line in errors.getvalue().splitlines()]
    assert [(where.rsplit("/", 1)[-1], rest.split(")")[0]) for where, rest in shown[:3]] == [
        ("b.jsonl:2", "future_timestamp"),
        ("b.jsonl:3", "invalid_json"),
        ("a.jsonl:1", "invalid_topic"),
    ]
    assert shown[3] == ["... 1 more bad lines skipped"]
    assert (report.lines, report.invalid) == (7, 4)
    assert monitor.pipeline.counts.queries["v", "default"] == 3
