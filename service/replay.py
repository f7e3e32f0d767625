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
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from functools import partial
from itertools import count
from operator import itemgetter
from typing import Any, TextIO

import msgspec
from msgspec import Struct

from service.errors import EventError
from service.mapping.mapper import Mapper, loads
from service.monitor import Monitor, MonitorConfig
from service.offline.files import open_input
from service.stream.events import (
    MAX_EVENT_BYTES,
    FeedbackEvent,
    QueryEvent,
    feedback_from,
    query_from,
)
from service.stream.mined import LabelRecorder
from service.stream.pipeline import Pipeline
from service.stream.take import Record
from service.stream.topics import FEEDBACK, QUERIES, Topic
from service.stream.windows import ClosedWindow
from service.times import wall_ms

ADVANCE_EVERY = 8192
"""Records between watermark advances (finalisation is batched over this many); the
events between two are taken by the pipeline as one batch, or several when large."""
BATCH_BYTES = 16 << 20
"""A batch is taken early once its lines reach this many bytes (the watermark does not
move within a batch, so where it is cut changes nothing)."""
READ_BYTES = 1 << 20
"""Lines are read about this many bytes at a time (and at most up to the next advance)."""
MAX_LINE_BYTES = MAX_EVENT_BYTES + 64
"""The longest line accepted: an event at the limit and the line's own fields."""


class _QueryLine(Struct, tag_field="topic", tag="queries", gc=False):
    event: QueryEvent


class _FeedbackLine(Struct, tag_field="topic", tag="feedback", gc=False):
    event: FeedbackEvent


_LINE = msgspec.json.Decoder(_QueryLine | _FeedbackLine)


class LineError(EventError):
    """A bad replay line; ``topic`` is QUERIES or FEEDBACK when the line names one."""

    def __init__(self, reason: str, message: str, topic: Topic | None = None) -> None:
        super().__init__(reason, message)
        self.topic = topic


def _check_line_size(raw: bytes) -> None:
    if len(raw) > MAX_LINE_BYTES:
        raise LineError("oversized", f"line of {len(raw)} bytes exceeds {MAX_EVENT_BYTES} bytes")


def decode_line(raw: bytes) -> _QueryLine | _FeedbackLine:
    """Decode one replay line; raise LineError with the event's reason code if bad."""
    _check_line_size(raw)
    try:
        return _LINE.decode(raw)
    except (msgspec.ValidationError, EventError):  # (EventError: an event's own checks)
        pass
    except msgspec.DecodeError:
        raise LineError("invalid_json", "the line is not valid JSON") from None
    # Slow path, only for bad lines (and NaN or Infinity, which Python's json.dumps
    # writes and pydantic accepted): find which part is wrong and why.
    topic, event = split_line(raw)
    try:
        if topic == QUERIES:
            return _QueryLine(query_from(event))
        return _FeedbackLine(feedback_from(event))
    except EventError as error:
        raise LineError(error.reason, str(error), topic) from None


def split_line(raw: bytes) -> tuple[Topic, Any]:
    """A line's topic and its ``event`` (any JSON value); LineError if the line is not
    ``{"topic": "queries" | "feedback", "event": ...}``."""
    try:
        outer = loads(raw)
    except EventError:
        raise LineError("invalid_json", "the line is not valid JSON") from None
    if not isinstance(outer, dict) or outer.get("topic") not in ("queries", "feedback"):
        raise LineError(
            "invalid_topic", 'a line needs "topic": "queries" or "feedback" and an "event" object'
        )
    topic = QUERIES if outer["topic"] == "queries" else FEEDBACK
    if "event" not in outer:
        raise LineError("missing_event", 'a line needs an "event" object', topic)
    return topic, outer["event"]


def decode_mapped_line(raw: bytes, mapper: Mapper) -> _QueryLine | _FeedbackLine | Topic:
    """Decode one replay line whose ``event`` is a user's record, through ``mapper``
    (only its topic for a record the mapping skips); LineError if bad."""
    _check_line_size(raw)
    topic, event = split_line(raw)
    try:
        if topic == QUERIES:
            query = mapper.query(event)
            return topic if query is None else _QueryLine(query)
        feedback = mapper.feedback(event)
        return topic if feedback is None else _FeedbackLine(feedback)
    except EventError as error:
        raise LineError(error.reason, str(error), topic) from None


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
    batch, in file order) and the bad lines among them, each with its place in the input.

    Places are kept as runs of consecutive lines: ``runs[i]`` is (position in
    ``events``, place) of the first event of a run, so that a chunk of lines that all
    decoded costs one entry."""

    pipeline: Pipeline
    report: ReplayReport
    errors_to: TextIO
    max_errors_shown: int
    events: list[Record] = field(default_factory=list)
    runs: list[tuple[int, Place]] = field(default_factory=list)
    problems: list[tuple[Place, EventError]] = field(default_factory=list)

    def place(self, at: int) -> Place:
        """The place of the event at position ``at`` of the batch."""
        start, (line, path, number) = self.runs[bisect_right(self.runs, (at, _LAST)) - 1]
        return line + at - start, path, number + at - start

    def take(self) -> None:
        """Hand the events to the pipeline; report every bad line, in input order."""
        for at, failure in self.pipeline.take(0, self.events):
            self.problems.append((self.place(at), failure))
        self.events.clear()
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
) -> tuple[Monitor, ReplayReport]:
    """Run the pipeline over the files; ``on_windows`` receives each batch of closed windows.

    Bad lines are reported to ``errors_to`` (default: stderr) with file and line number.
    With ``mapper``, each line's ``event`` is a user's record read through it. With
    ``labels``, each window carries the labels output of its queries.
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
            pipeline.published(windows)
            report.windows += len(windows)

    decode: Callable[[bytes], _QueryLine | _FeedbackLine | Topic] = decode_line
    if mapper is not None:
        decode = partial(decode_mapped_line, mapper=mapper)
    pending = _Batch(pipeline, report, errors_to, max_errors_shown)
    reader = _Reader(pending, decode, emit, whole_chunks=mapper is None)
    try:
        for path in paths:
            reader.read(path)
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
    line by line, which finds and reports what is wrong."""

    pending: _Batch
    decode: Callable[[bytes], _QueryLine | _FeedbackLine | Topic]
    emit: Callable[[list[ClosedWindow]], None]
    whole_chunks: bool
    offsets: list[int] = field(default_factory=lambda: [0, 0])
    """The next offset of each topic (a line's position among the lines of its topic)."""
    size: int = 0
    """Bytes of the lines of the events in ``pending``."""

    def read(self, path: str) -> None:
        """Read one file; InputFileError if it cannot be opened."""
        report = self.pending.report
        with open_input(path) as handle:
            number = 0  # the file's lines read so far
            lines: list[bytes] = []
            while lines or (lines := handle.readlines(READ_BYTES)):
                room = ADVANCE_EVERY - report.lines % ADVANCE_EVERY
                chunk, lines = lines[:room], lines[room:]
                if not (self.whole_chunks and self._whole(chunk, path, number + 1)):
                    for at, raw in enumerate(chunk, start=number + 1):
                        if not raw.isspace():  # (never empty; strip() would copy every line)
                            self._line(path, at, raw)
                number += len(chunk)

    def _whole(self, chunk: list[bytes], path: str, first: int) -> bool:
        """Take a chunk of lines that all decode, at once; False (nothing taken) if any
        line is blank, oversized or bad."""
        try:
            if max(map(len, chunk)) > MAX_LINE_BYTES:
                return False
            decoded = list(map(_LINE.decode, chunk))
        except (msgspec.DecodeError, EventError):  # (ValidationError is a DecodeError)
            return False
        pending, offsets = self.pending, self.offsets
        report = pending.report
        pending.runs.append((len(pending.events), (report.lines + 1, path, first)))
        queries, feedback = count(offsets[QUERIES]), count(offsets[FEEDBACK])
        pending.events += [
            (QUERIES, next(queries), line.event)
            if type(line) is _QueryLine
            else (FEEDBACK, next(feedback), line.event)
            for line in decoded
        ]
        offsets[QUERIES], offsets[FEEDBACK] = next(queries), next(feedback)
        report.lines += len(chunk)
        self.size += sum(map(len, chunk))
        self._filled()
        return True

    def _line(self, path: str, number: int, raw: bytes) -> None:
        """Take one line, valid or not."""
        pending, offsets = self.pending, self.offsets
        report, pipeline = pending.report, pending.pipeline
        report.lines += 1
        try:
            line = self.decode(raw)
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
                topic = QUERIES if isinstance(line, _QueryLine) else FEEDBACK
                pending.runs.append((len(pending.events), (report.lines, path, number)))
                pending.events.append((topic, offsets[topic], line.event))
                offsets[topic] += 1
                self.size += len(raw)
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
