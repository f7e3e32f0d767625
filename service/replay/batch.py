"""What a replay holds between two flushes: the lines read since the batch was last flushed,
as records of partition 0 with their :class:`~service.stream.prepared.Prepared` columns
and their places in the input; taken through the record step
(:func:`~service.stream.records.take_records`), its bad lines reported in input order
with file and line."""

from __future__ import annotations

import sys
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TextIO

from service.errors import EventError
from service.stream.events import FeedbackEvent, QueryEvent
from service.stream.pipeline import Pipeline
from service.stream.prepared import Prepared
from service.stream.records import take_records
from service.stream.topics import Topic


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
Value = QueryEvent | FeedbackEvent | EventError | Topic
Line = tuple[Topic, int, Value]
"""A line as a record: its topic, its offset (its position among the lines of its
topic) and its event; or, for a line read on its own that is none, what it is instead:
its error, or its topic (a record that the input mapping skips)."""


@dataclass(slots=True)
class Batch:
    """The lines read since the batch was last flushed (taken by the pipeline as one batch,
    in file order, the ``columns`` of their events already made), each with its place in
    the input.

    Places are kept as runs of consecutive lines: ``runs[i]`` is (position in
    ``events``, place) of the first line of a run, so that a chunk of lines that all
    decoded costs one entry."""

    pipeline: Pipeline
    report: ReplayReport
    errors_to: TextIO
    max_errors_shown: int
    events: list[Line] = field(default_factory=list)
    columns: Prepared = field(default_factory=Prepared.empty)
    runs: list[tuple[int, Place]] = field(default_factory=list)
    only_events: bool = True
    """No bad or skipped line among ``events`` (they are taken as they are)."""

    def place(self, at: int) -> Place:
        """The place of the line at position ``at`` of the batch."""
        start, (line, path, number) = self.runs[bisect_right(self.runs, (at, _LAST)) - 1]
        return line + at - start, path, number + at - start

    def add_chunk(self, lines: list[Line], columns: Prepared, place: Place) -> None:
        """Add a chunk's lines that all decoded (``lines`` from ``place`` on), with their
        events' columns."""
        self.runs.append((len(self.events), place))
        self.events += lines
        self.columns.extend(columns)

    def add_line(self, line: Line, place: Place, columns: Prepared | None) -> None:
        """Add a line read on its own: an event with its columns, or (``columns`` None)
        a bad or skipped line."""
        self.runs.append((len(self.events), place))
        self.events.append(line)
        if columns is None:
            self.only_events = False
        else:
            self.columns.extend(columns)

    def flush(self) -> None:
        """Hand the lines to the pipeline (the record step); report every bad line, in
        input order."""
        decode = None if self.only_events else _as_read
        failures = take_records(self.pipeline, 0, self.events, decode, self.columns)
        self._report([(self.place(at), failure) for at, failure in failures])
        self.events.clear()
        self.columns.clear()
        self.runs.clear()
        self.only_events = True

    def abandon(self) -> None:
        """The replay stops on an error: report the bad lines read since the last flush
        (without flushing them)."""
        if not self.only_events:
            lines = enumerate(self.events)
            self._report(
                [(self.place(at), v) for at, (_, _, v) in lines if isinstance(v, EventError)]
            )

    def _report(self, bad: Iterable[tuple[Place, EventError]]) -> None:
        """Count and show bad lines, in input order."""
        for (_, path, number), error in bad:
            self.report.invalid += 1
            if self.report.invalid <= self.max_errors_shown:
                print(f"{path}:{number}: skipped ({error.reason}): {error}", file=self.errors_to)


def _as_read(value: Value) -> QueryEvent | FeedbackEvent | None:
    """A line's value to the record step: it was decoded as the line was read (its topic,
    and so its offset, is known only then): its event; None for a record that the input
    mapping skips; its error raised."""
    if isinstance(value, EventError):
        raise value
    return None if isinstance(value, Topic) else value


_LAST = (sys.maxsize, "", 0)
"""After every place (to find a run by its position alone)."""
