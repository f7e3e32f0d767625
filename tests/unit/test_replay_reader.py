"""``replay``'s reader process: the same replay as in one process, whatever the file is
called, and no reader left behind when the replay is gone."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from service.commands.cli import main
from service.core.monitor import MonitorConfig
from service.metrics.ir import DEFAULT_KS, metric_keys
from service.replay import replay
from service.replay.reader import reader_allowed
from service.stream.mined import LabelRecorder
from service.stream.windows import ClosedWindow

NOW_MS = 1_796_083_200_000 + 7200_000  # (after the simulated hour)


@pytest.fixture(scope="module")
def events(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("reader") / "events.jsonl"
    assert main(
        ["simulate", "--jsonl", str(path), "--start", "2026-12-01T00:00:00Z", "--hours", "1h",
         "--queries-per-hour", "2000", "--seed", "11"]
    ) == 0  # fmt: skip
    return path


def _replayed(
    paths: list[str], *, reader: bool, labels: LabelRecorder | None = None
) -> tuple[list[ClosedWindow], str, tuple[object, ...]]:
    windows: list[ClosedWindow] = []
    errors = io.StringIO()
    monitor, report = replay(
        paths,
        MonitorConfig(),
        windows.extend,
        now_ms=lambda: NOW_MS,
        errors_to=errors,
        labels=labels,
        reader=reader,
    )
    counts = monitor.pipeline.counts
    return windows, errors.getvalue(), (report, counts.events, counts.queries, counts.unmatched)


def test_a_file_whose_name_is_not_text_is_read_through_the_reader(
    events: Path, tmp_path: Path
) -> None:
    """A path that is not valid UTF-8 (a str with surrogate escapes on Linux) cannot go
    through msgpack; the reader names files by their position, so the replay is the one
    made in a single process, its bad line reported under that name."""
    name = os.fsdecode(tmp_path.as_posix().encode() + b"/caf\xe9.jsonl")
    Path(name).write_bytes(events.read_bytes() + b"not json\n")
    in_one = _replayed([name], reader=False)
    assert _replayed([name], reader=True) == in_one
    assert len(in_one[0]) > 5
    assert in_one[1].startswith(f"{name}:")
    assert "(invalid_json)" in in_one[1]


def test_the_reader_sends_the_label_sources_the_join_counts(events: Path) -> None:
    """The sources column travels from the reader process (msgpack) to the join: the
    window records equal those of the replay in one process, sources included, and every
    source labels some queries (the simulation has clicks, citations and judgments)."""
    if not reader_allowed():
        pytest.skip("no reader process on this machine (one core, or not Linux)")
    keys = metric_keys(DEFAULT_KS)
    through, _, through_counts = _replayed([str(events)], reader=True)
    alone, _, alone_counts = _replayed([str(events)], reader=False)
    assert [w.to_record(keys) for w in through] == [w.to_record(keys) for w in alone]
    assert through_counts == alone_counts
    totals = {
        source: sum(w.sources[source] for w in alone)
        for source in ("click", "citation", "judgment")
    }
    labelled = sum(w.labelled for w in alone)
    assert all(0 < n < labelled for n in totals.values()), (totals, labelled)


def test_labels_are_recorded_in_one_process_even_when_a_reader_is_asked_for(
    events: Path,
) -> None:
    """The labels output needs the whole events: with a recorder, ``reader=True`` reads in
    this process (a lean event has no chunk ids) and gives the same labels."""
    asked = _replayed([str(events)], reader=True, labels=LabelRecorder())
    alone = _replayed([str(events)], reader=False, labels=LabelRecorder())
    assert asked == alone
    assert sum(len(w.labels) for w in asked[0]) > 10


def _ended(pid: int) -> bool:
    """Whether the process is gone (or a zombie nobody reaps: it ran to its end)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def test_the_reader_ends_once_the_replay_is_gone(events: Path, tmp_path: Path) -> None:
    """A replay killed before its end (here: it exits at once, without closing anything)
    leaves no reader behind: the reader does not hold a copy of the replay's end of the
    pipe, so its next write fails and it ends, instead of waiting on a full pipe for ever."""
    big = tmp_path / "big.jsonl"
    big.write_bytes(events.read_bytes() * 4)  # (more than the pipe holds)
    script = (
        "import os, sys\n"
        "from service.replay.reader import Reader\n"
        "from service.stream.labels import LabelPolicy\n"
        "reader = Reader([sys.argv[1]], 1 << 20, 8192, LabelPolicy().grade)\n"
        "print(reader._process.pid, flush=True)\n"
        "os._exit(0)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(big)], capture_output=True, text=True, check=True
    )
    pid = int(done.stdout)
    deadline = time.monotonic() + 30
    while not _ended(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    ended = _ended(pid)
    if not ended:
        os.kill(pid, signal.SIGKILL)
    assert ended
