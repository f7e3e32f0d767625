"""``replay``: the streaming core over JSONL event files, in file order, as partition 0.

A line is ``{"topic": "queries" | "feedback", "event": {...}}``. The line is validated
in one pass (a tagged union keyed by ``topic``); a bad line is reported with its file
and line number, counted, and skipped, and the lines around it are processed. There is
no wall-clock idleness in a replay: the watermark follows event time only, and at the
end of the input everything pending is finalised.
"""

from __future__ import annotations

import sys
from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from itertools import count
from operator import itemgetter
from typing import TYPE_CHECKING, TextIO

from service.core.monitor import Monitor, MonitorConfig
from service.errors import EventError
from service.offline.files import open_input
from service.replay_lines import (
    FeedbackLine,
    LineError,
    QueryLine,
    chunks,
    decode_line,
    decode_mapped_line,
    decode_whole,
    oversized,
)
from service.replay_reader import LeanQuery, Raw, Reader, reader_allowed
from service.stream.events import FeedbackEvent, QueryEvent
from service.stream.mined import LabelRecorder
from service.stream.pipeline import Pipeline
from service.stream.prepared import Prepared, Record, prepare
from service.stream.topics import FEEDBACK, QUERIES, Topic
from service.stream.windows import ClosedWindow
from service.times import wall_ms

if TYPE_CHECKING:  # (the mapping's models are built only when a mapping is used)
    from service.mapping.mapper import Mapper

ADVANCE_EVERY = 8192
"""Records between watermark advances (finalisation is batched over this many); the
events between two are taken by the pipeline as one batch, or several when large."""
BATCH_BYTES = 16 << 20
"""A batch is taken early once its lines reach this many bytes (the watermark does not
move within a batch, so where it is cut changes nothing)."""
READ_BYTES = 1 << 20
"""Lines are read about this many bytes at a time (and at most up to the next advance)."""


@dataclass(slots=True)
class ReplayReport:
    """What a replay read and wrote."""

    lines: int = 0
    invalid: int = 0
    windows: int = 0
    ignored: int = 0


Place = tuple[int, str, int]
"""Where a line is: its number in the whole input (for the order), its file, its number
in the file."""


@dataclass(slots=True)
class _Batch:
    """The valid events read since the batch was last taken (taken by the pipeline as one
    batch, in file order, with their ``take.prepare`` columns already made: ``bodies``
    to ``levels``) and the bad lines among them, each with its place in the input.

    Places are kept as runs of consecutive lines: ``runs[i]`` is (position in
    ``events``, place) of the first event of a run, so that a chunk of lines that all
    decoded costs one entry."""

    pipeline: Pipeline
    report: ReplayReport
    errors_to: TextIO
    max_errors_shown: int
    events: list[Record] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    repeats: set[int] = field(default_factory=set)
    keys: list[bytes] = field(default_factory=list)
    chunks: list[int] = field(default_factory=list)
    levels: list[int] = field(default_factory=list)
    runs: list[tuple[int, Place]] = field(default_factory=list)
    problems: list[tuple[Place, EventError]] = field(default_factory=list)

    def place(self, at: int) -> Place:
        """The place of the event at position ``at`` of the batch."""
        start, (line, path, number) = self.runs[bisect_right(self.runs, (at, _LAST)) - 1]
        return line + at - start, path, number + at - start

    def add_prepared(self, prepared: Prepared) -> None:
        """Note the ``take.prepare`` columns of the next events."""
        base = len(self.bodies)
        self.bodies += prepared.bodies
        self.repeats.update(base + position for position in prepared.repeats)
        self.keys += prepared.keys
        self.chunks += prepared.chunks
        self.levels += prepared.levels

    def take(self) -> None:
        """Hand the events to the pipeline; report every bad line, in input order."""
        columns = Prepared(self.bodies, self.repeats, self.keys, self.chunks, self.levels)
        failures = self.pipeline.take(0, self.events, columns)
        for at, failure in failures:
            self.problems.append((self.place(at), failure))
        self.events.clear()
        for column in columns:
            column.clear()
        self.runs.clear()
        self.report_problems()

    def report_problems(self) -> None:
        """Count and show the bad lines found so far, in input order."""
        for (_, path, number), error in sorted(self.problems, key=itemgetter(0)):
            self.report.invalid += 1
            if self.report.invalid <= self.max_errors_shown:
                print(f"{path}:{number}: skipped ({error.reason}): {error}", file=self.errors_to)
        self.problems.clear()


_LAST = (sys.maxsize, "", 0)
"""After every place (to find a run by its position alone)."""


def replay(
    paths: Iterable[str],
    config: MonitorConfig,
    on_windows: Callable[[list[ClosedWindow]], None],
    *,
    now_ms: Callable[[], int] | None = None,
    errors_to: TextIO | None = None,
    max_errors_shown: int = 20,
    mapper: Mapper | None = None,
    labels: LabelRecorder | None = None,
    reader: bool | None = None,
) -> tuple[Monitor, ReplayReport]:
    """Run the pipeline over the files; ``on_windows`` receives each batch of closed windows.

    Bad lines are reported to ``errors_to`` (default: stderr) with file and line number.
    With ``mapper``, each line's ``event`` is a user's record read through it. With
    ``labels``, each window carries the labels output of its queries. ``reader``: read
    and decode the files in a second process (``replay_reader``); by default when the
    machine lets this process use two cores, and without ``mapper`` and ``labels``
    (which read the whole events). The results are the same either way.
    """
    errors_to = errors_to if errors_to is not None else sys.stderr
    clock = now_ms or wall_ms
    core = config.pipeline
    no_idleness = replace(core, join=replace(core.join, idle_timeout_ms=None))
    monitor = Monitor(replace(config, pipeline=no_idleness), clock, keep_opened=None)
    pipeline = monitor.pipeline
    pipeline.recorder = labels
    pipeline.assign(0)
    report = ReplayReport()

    def emit(windows: list[ClosedWindow]) -> None:
        if windows:
            on_windows(windows)
            pipeline.deliver(windows)
            report.windows += len(windows)

    decode: Callable[[bytes], QueryLine | FeedbackLine | Topic] = decode_line
    if mapper is not None:
        decode = partial(decode_mapped_line, mapper=mapper)
    if reader is None:
        reader = reader_allowed()
    reader = reader and mapper is None and labels is None
    pending = _Batch(pipeline, report, errors_to, max_errors_shown)
    lines = _Reader(pending, decode, emit, pipeline.config.labels.grade)
    paths = list(paths)
    try:
        if reader:
            lines.from_reader(paths)
        else:
            for path in paths:
                lines.read(path, whole_chunks=mapper is None)
    except BaseException:
        pending.report_problems()  # what was found before the error that stops the replay
        raise
    pending.take()
    emit(pipeline.finish())
    if report.invalid > max_errors_shown:
        print(f"... {report.invalid - max_errors_shown} more bad lines skipped", file=errors_to)
    return monitor, report


@dataclass(slots=True)
class _Reader:
    """Reads the files' lines into ``pending``, taking it (and advancing) as it fills.

    Lines are read in chunks that end at the next advance at the latest. A chunk whose
    lines all decode (the usual case) is decoded and handed over in a few calls; a chunk
    with a blank, oversized or bad line, or any chunk read through an input mapping, goes
    line by line, which finds and reports what is wrong. With a reader process, the
    chunks come from it, those that decoded already decoded and hashed."""

    pending: _Batch
    decode: Callable[[bytes], QueryLine | FeedbackLine | Topic]
    emit: Callable[[list[ClosedWindow]], None]
    grade: Callable[[FeedbackEvent], int]
    """The label policy's grade of a feedback event."""
    offsets: list[int] = field(default_factory=lambda: [0, 0])
    """The next offset of each topic (a line's position among the lines of its topic)."""
    size: int = 0
    """Bytes of the lines of the events in ``pending``."""

    def read(self, path: str, *, whole_chunks: bool) -> None:
        """Read one file in this process; InputFileError if it cannot be opened."""
        report = self.pending.report
        with open_input(path) as handle:
            for first, chunk in chunks(handle, READ_BYTES, ADVANCE_EVERY, lambda: report.lines):
                events = decode_whole(chunk) if whole_chunks else None
                if events is None:
                    self._lines(path, first, chunk)
                    continue
                self.pending.add_prepared(prepare(events, self.grade))
                size = sum(map(len, chunk))
                self._whole(path, first, events, QueryEvent, lines=len(chunk), size=size)

    def from_reader(self, paths: list[str]) -> None:
        """Read the files through a reader process (``replay_reader``)."""
        reader = Reader(paths, READ_BYTES, ADVANCE_EVERY, self.grade)
        try:
            for path, item in reader:
                if isinstance(item, Raw):
                    self._lines(path, item.first, item.lines)
                    continue
                self.pending.add_prepared(
                    Prepared(item.bodies, set(item.repeats), item.keys, item.chunks, item.levels)
                )
                self._whole(
                    path, item.first, item.events, LeanQuery, lines=item.lines, size=item.size
                )
        finally:
            reader.close()

    def _whole(
        self,
        path: str,
        first: int,
        events: Sequence[object],
        query_type: type,
        *,
        lines: int,
        size: int,
    ) -> None:
        """Take the events of a chunk of ``lines`` lines of ``size`` bytes that all decoded
        (its queries' hashes noted; ``query_type``: the type of its query events)."""
        pending, offsets = self.pending, self.offsets
        report = pending.report
        pending.runs.append((len(pending.events), (report.lines + 1, path, first)))
        queries, feedback = count(offsets[QUERIES]), count(offsets[FEEDBACK])
        pending.events += [
            (QUERIES, next(queries), event)  # type: ignore[misc]
            if type(event) is query_type
            else (FEEDBACK, next(feedback), event)
            for event in events
        ]
        offsets[QUERIES], offsets[FEEDBACK] = next(queries), next(feedback)
        report.lines += lines
        self.size += size
        self._filled()

    def _lines(self, path: str, first: int, chunk: Sequence[bytes | int]) -> None:
        """Take a chunk's lines one by one (from the reader, an oversized line is its
        length; never a blank one)."""
        for number, raw in enumerate(chunk, start=first):
            if type(raw) is int or not raw.isspace():  # type: ignore[union-attr]
                self._line(path, number, raw)

    def _line(self, path: str, number: int, raw: bytes | int) -> None:
        """Take one line, valid or not (an int: the length of an oversized line)."""
        pending, offsets = self.pending, self.offsets
        report, pipeline = pending.report, pending.pipeline
        report.lines += 1
        try:
            line = self.decode(raw) if type(raw) is bytes else oversized(raw)  # type: ignore[arg-type]
        except LineError as error:
            topic = QUERIES if error.topic is None else error.topic
            pipeline.invalid(0, topic, offsets[topic], error.reason)
            offsets[topic] += 1
            pending.problems.append(((report.lines, path, number), error))
        else:
            if isinstance(line, Topic):  # a record the input mapping skips
                report.ignored += 1
                pipeline.ignored(0, line, offsets[line])
                offsets[line] += 1
            else:
                topic = QUERIES if isinstance(line, QueryLine) else FEEDBACK
                pending.add_prepared(prepare([line.event], self.grade))
                pending.runs.append((len(pending.events), (report.lines, path, number)))
                pending.events.append((topic, offsets[topic], line.event))
                offsets[topic] += 1
                self.size += len(raw)  # type: ignore[arg-type]
        self._filled()

    def _filled(self) -> None:
        """Take the batch and advance every ``ADVANCE_EVERY`` lines; take it early once its
        lines pass ``BATCH_BYTES``."""
        pending = self.pending
        if pending.report.lines % ADVANCE_EVERY == 0:
            pending.take()
            self.size = 0
            self.emit(pending.pipeline.advance())
        elif self.size > BATCH_BYTES:  # (large events: a batch's memory is bounded)
            pending.take()
            self.size = 0
