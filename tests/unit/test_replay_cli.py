"""``simulate --jsonl`` then ``replay --windows-out`` equals the offline evaluation of the file."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.commands.cli import main
from service.core.monitor import MonitorConfig
from service.errors import InputFileError
from service.replay import feed, replay
from service.replay import reader as replay_reader
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


def _query_line(query_id: str, timestamp: int) -> bytes:
    event = {"query_id": query_id, "timestamp": timestamp, "retriever": "v", "results": ["a"]}
    return json.dumps({"topic": "queries", "event": event}).encode()


NOW_S, DAY_S = 1_796_083_200, 86_400


@pytest.mark.parametrize(
    ("advance_every", "batch_bytes"), [(8192, 16 << 20), (2, 16 << 20), (8192, 1)]
)
def test_bad_lines_are_reported_in_input_order_across_kinds_and_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, advance_every: int, batch_bytes: int
) -> None:
    """A line the timestamp guard refuses (found when its batch is taken) and lines that do
    not decode (found as read) are reported in input order, the limit counting in that
    order too, and the good lines between them are replayed; so too when the batches
    are cut every two lines, or after every event (a byte budget of one)."""
    monkeypatch.setattr("service.replay.feed.ADVANCE_EVERY", advance_every)
    monkeypatch.setattr("service.replay.feed.BATCH_BYTES", batch_bytes)
    first = [
        _query_line("ok-1", NOW_S),
        _query_line("future", NOW_S + DAY_S),
        b"not json",
        _query_line("ok-2", NOW_S),
    ]
    second = [b"{}", _query_line("future-2", NOW_S + DAY_S), _query_line("ok-3", NOW_S)]
    paths = [tmp_path / "b.jsonl", tmp_path / "a.jsonl"]  # (not in name order)
    for path, lines in zip(paths, (first, second), strict=True):
        path.write_bytes(b"\n".join(lines) + b"\n")
    errors = io.StringIO()
    monitor, report = replay(
        [str(p) for p in paths],
        MonitorConfig(),
        lambda _: None,
        now_ms=lambda: NOW_S * 1000,
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


def test_bad_lines_read_before_a_replay_stops_are_still_reported(tmp_path: Path) -> None:
    """A file that cannot be opened stops the replay; the bad lines of the files before it
    are reported first (they are otherwise shown when their batch is taken)."""
    good = tmp_path / "good.jsonl"
    good.write_bytes(_query_line("ok", NOW_S) + b"\nnot json\n" + _query_line("ok-2", NOW_S))
    errors = io.StringIO()
    with pytest.raises(InputFileError, match=r"absent\.jsonl"):
        replay(
            [str(good), str(tmp_path / "absent.jsonl")],
            MonitorConfig(),
            lambda _: None,
            now_ms=lambda: NOW_S * 1000,
            errors_to=errors,
        )
    assert "good.jsonl:2: skipped (invalid_json)" in errors.getvalue()


def _replayed(
    paths: list[Path], errors: io.StringIO, *, reader: bool
) -> tuple[list[ClosedWindow], object]:
    windows: list[ClosedWindow] = []
    monitor, report = replay(
        [str(p) for p in paths],
        MonitorConfig(),
        windows.extend,
        now_ms=lambda: (NOW_S + 7200) * 1000,  # (the simulated hour is past)
        errors_to=errors,
        max_errors_shown=1000,
        reader=reader,
    )
    counts = monitor.pipeline.counts
    seen = (counts.events, counts.invalid, counts.queries, counts.unmatched, counts.late)
    return windows, (report, *seen, counts.duplicates, counts.duplicate_results)


@pytest.mark.parametrize(("advance_every", "read_bytes"), [(64, 2000), (50, 1 << 20), (8192, 300)])
def test_chunks_that_decode_whole_replay_as_line_by_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, advance_every: int, read_bytes: int
) -> None:
    """Chunks of lines that all decode are taken in a few calls; the replay (windows,
    counters, and the place of every bad line, those the timestamp guard refuses inside
    such a chunk included) equals the line-by-line reading of the same files, with blank
    lines, bad lines, a NaN score (refused by the decoder, accepted line by line) and an
    oversized line among them, and chunks cut at every advance and read size."""
    events = tmp_path / "events.jsonl"
    assert main(
        ["simulate", "--jsonl", str(events), "--start", "2026-12-01T00:00:00Z", "--hours", "1h",
         "--queries-per-hour", "400", "--seed", "3"]
    ) == 0  # fmt: skip
    lines = events.read_bytes().splitlines(keepends=True)
    nan = json.loads(next(raw for raw in lines if b'"queries"' in raw))
    nan["event"]["results"] = [{"chunk_id": "c-1", "score": float("nan")}]
    repeated = json.loads(next(raw for raw in lines if b'"queries"' in raw))
    repeated["event"]["query_id"] += "-again"
    repeated["event"]["results"] = ["c-1", "c-2", "c-1"]
    oversized = b'{"topic": "queries", "event": {"pad": "' + b"x" * ((1 << 20) + 64) + b'"}}'
    specials = {  # where each goes, the line, and the reason it is refused (or None)
        7: (b"\n", None),
        90: (b"   \n", None),
        150: (json.dumps(nan).encode() + b"\n", "invalid_json"),  # (json.dumps writes NaN)
        300: (json.dumps(repeated).encode() + b"\n", None),  # (a chunk id twice)
        400: (b"not json\n", "invalid_json"),
        500: (_query_line("future", NOW_S + DAY_S) + b"\n", "future_timestamp"),
        700: (oversized + b"\n", "oversized"),
        820: (_query_line("future-2", NOW_S + DAY_S) + b"\n", "future_timestamp"),
    }
    for at, (line, _) in sorted(specials.items()):
        lines.insert(at, line)
    lines.append(_query_line("future-3", NOW_S + DAY_S))  # (no newline at the end)
    half = len(lines) // 2
    paths = [tmp_path / "one.jsonl", tmp_path / "two.jsonl"]
    paths[0].write_bytes(b"".join(lines[:half]))
    paths[1].write_bytes(b"".join(lines[half:]))
    expected = [
        (f"one.jsonl:{at + 1}" if at < half else f"two.jsonl:{at - half + 1}", reason)
        for at, (_, reason) in [*specials.items(), (len(lines) - 1, (b"", "future_timestamp"))]
        if reason is not None
    ]
    monkeypatch.setattr("service.replay.feed.ADVANCE_EVERY", advance_every)
    monkeypatch.setattr("service.replay.feed.READ_BYTES", read_bytes)

    whole = feed.decode_whole
    taken_whole: list[int] = []

    def counted(chunk: list[bytes]) -> object:
        events = whole(chunk)
        taken_whole.append(0 if events is None else len(chunk))
        return events

    monkeypatch.setattr(feed, "decode_whole", counted)
    chunked_errors = io.StringIO()
    chunked = _replayed(paths, chunked_errors, reader=False)
    iterate = replay_reader.Reader.__iter__
    items: list[str] = []

    def noted(self: replay_reader.Reader) -> Iterator[object]:
        for item in iterate(self):
            items.append(type(item[1]).__name__)
            yield item

    monkeypatch.setattr(replay_reader.Reader, "__iter__", noted)
    from_reader_errors = io.StringIO()
    from_reader = _replayed(paths, from_reader_errors, reader=True)
    monkeypatch.setattr(feed, "decode_whole", lambda _: None)
    by_line_errors = io.StringIO()
    by_line = _replayed(paths, by_line_errors, reader=False)

    assert chunked == by_line
    assert from_reader == by_line
    assert chunked_errors.getvalue() == by_line_errors.getvalue()
    assert from_reader_errors.getvalue() == by_line_errors.getvalue()
    # most lines went through whole chunks, in this process and from the reader
    assert sum(taken_whole) > len(lines) // 2
    assert items.count("Decoded") > items.count("Raw") > 0
    assert by_line[1][-1] == 1  # (the query with a chunk id twice)
    assert chunked_errors.getvalue() == by_line_errors.getvalue()
    shown = [line.split(": skipped (") for line in chunked_errors.getvalue().splitlines()]
    assert [(where.rsplit("/", 1)[-1], rest.split(")")[0]) for where, rest in shown] == expected
    assert len(chunked[0]) > 10


@pytest.mark.parametrize(
    ("flag", "source"), [("--halve-citations-at", "citation"), ("--halve-clicks-at", "click")]
)
def test_a_halved_source_replays_as_a_label_shift_not_a_retrieval_regression(
    tmp_path: Path, flag: str, source: str
) -> None:
    """Retrieval unchanged, every citation half as likely from hour 26: the replayed
    detector opens label shifts of that source (one per segment at most) and nothing
    else; before the label_shift test, this opened drift regressions of the labelled
    share (docs/detection.md, "Label shifts")."""
    events = tmp_path / "events.jsonl"
    code = main(
        [
            "simulate", "--jsonl", str(events), "--start", "2026-11-30T00:00:00Z",
            "--hours", "30h", flag, "26h", "--seed", "31", "--queries-per-hour", "1500",
        ]
    )  # fmt: skip
    assert code == 0
    out = tmp_path / "regressions.jsonl"
    assert main(["replay", str(events), "--regressions-out", str(out)]) == 0
    opened = [json.loads(line) for line in out.read_text().splitlines()]
    assert opened
    assert {(r["kind"], r["metric"], r["baseline"]) for r in opened} == {
        ("label_shift", f"source_labelled_share:{source}", "previous_day")
    }
    assert all(r["opened_at"] > "2026-12-01T02:00:00Z" for r in opened)
    assert all(r["delta"] < 0 for r in opened)
