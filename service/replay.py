"""``replay``: the streaming core over JSONL event files, in file order, as partition 0.

A line is ``{"topic": "queries" | "feedback", "event": {...}}``. The line is validated
in one pass (a tagged union keyed by ``topic``); a bad line is reported with its file
and line number, counted, and skipped, and the lines around it are processed. There is
no wall-clock idleness in a replay: the watermark follows event time only, and at the
end of the input everything pending is finalised.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from functools import partial
from operator import itemgetter
from typing import Any, TextIO

import msgspec
from msgspec import Struct

from service.errors import EventError
from service.mapping.mapper import Mapper, loads
from service.monitor import Monitor, MonitorConfig
from service.offline.files import jsonl_lines
from service.stream.events import (
    MAX_EVENT_BYTES,
    FeedbackEvent,
    QueryEvent,
    feedback_from,
    query_from,
)
from service.stream.mined import LabelRecorder
from service.stream.pipeline import Pipeline, Record
from service.stream.topics import FEEDBACK, QUERIES, Topic
from service.stream.windows import ClosedWindow
from service.times import wall_ms

ADVANCE_EVERY = 8192
"""Records between watermark advances (finalisation is batched over this many); the
events between two are taken by the pipeline as one batch, or several when large."""
BATCH_BYTES = 16 << 20
"""A batch is taken early once its lines reach this many bytes (the watermark does not
move within a batch, so where it is cut changes nothing)."""


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
    if len(raw) > MAX_EVENT_BYTES + 64:
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
    batch, in file order) and the bad lines among them, each with its place in the input."""

    pipeline: Pipeline
    report: ReplayReport
    errors_to: TextIO
    max_errors_shown: int
    events: list[Record] = field(default_factory=list)
    places: list[Place] = field(default_factory=list)
    problems: list[tuple[Place, EventError]] = field(default_factory=list)

    def take(self) -> None:
        """Hand the events to the pipeline; report every bad line, in input order."""
        for at, failure in self.pipeline.take(0, self.events):
            self.problems.append((self.places[at], failure))
        self.events.clear()
        self.places.clear()
        self.report_problems()

    def report_problems(self) -> None:
        """Count and show the bad lines found so far, in input order."""
        for (_, path, number), error in sorted(self.problems, key=itemgetter(0)):
            self.report.invalid += 1
            if self.report.invalid <= self.max_errors_shown:
                print(f"{path}:{number}: skipped ({error.reason}): {error}", file=self.errors_to)
        self.problems.clear()


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
    offsets = [0, 0]

    def emit(windows: list[ClosedWindow]) -> None:
        if windows:
            on_windows(windows)
            pipeline.published(windows)
            report.windows += len(windows)

    decode: Callable[[bytes], _QueryLine | _FeedbackLine | Topic] = decode_line
    if mapper is not None:
        decode = partial(decode_mapped_line, mapper=mapper)
    pending = _Batch(pipeline, report, errors_to, max_errors_shown)
    try:
        _read(paths, decode, pending, offsets, emit)
    except BaseException:
        pending.report_problems()  # what was found before the error that stops the replay
        raise
    pending.take()
    emit(pipeline.finish())
    if report.invalid > max_errors_shown:
        print(f"... {report.invalid - max_errors_shown} more bad lines skipped", file=errors_to)
    return monitor, report


def _read(
    paths: Iterable[str],
    decode: Callable[[bytes], _QueryLine | _FeedbackLine | Topic],
    pending: _Batch,
    offsets: list[int],
    emit: Callable[[list[ClosedWindow]], None],
) -> None:
    """Read every line into ``pending``, taking it (and advancing) as it fills."""
    pipeline, report = pending.pipeline, pending.report
    batch, places, problems = pending.events, pending.places, pending.problems
    batched_bytes = 0
    for path, number, raw in jsonl_lines(paths):
        report.lines += 1
        try:
            line = decode(raw)
        except LineError as error:
            topic = QUERIES if error.topic is None else error.topic
            pipeline.invalid(0, topic, offsets[topic], error.reason)
            offsets[topic] += 1
            problems.append(((report.lines, path, number), error))
        else:
            if isinstance(line, Topic):  # a record the input mapping skips
                report.ignored += 1
                pipeline.ignored(0, line, offsets[line])
                offsets[line] += 1
            else:
                topic = QUERIES if isinstance(line, _QueryLine) else FEEDBACK
                batch.append((topic, offsets[topic], line.event))
                places.append((report.lines, path, number))
                offsets[topic] += 1
                batched_bytes += len(raw)
        if report.lines % ADVANCE_EVERY == 0:
            pending.take()
            batched_bytes = 0
            emit(pipeline.advance())
        elif batched_bytes > BATCH_BYTES:  # (large events: a batch's memory is bounded)
            pending.take()
            batched_bytes = 0
