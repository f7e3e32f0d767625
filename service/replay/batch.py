"""What a replay holds between two takes: the valid events read since the batch was last
taken, their :class:`~service.stream.prepared.Prepared` columns and their places in the
input, and the bad lines among them, reported in input order with file and line."""

from __future__ import annotations

import sys
from bisect import bisect_right
from dataclasses import dataclass, field
from operator import itemgetter
from typing import TextIO

from service.errors import EventError
from service.stream.pipeline import Pipeline
from service.stream.prepared import Prepared, Record


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
class Batch:
    """The valid events read since the batch was last taken (taken by the pipeline as one
    batch, in file order, with their ``columns`` already made) and the bad lines among
    them, each with its place in the input.

    Places are kept as runs of consecutive lines: ``runs[i]`` is (position in
    ``events``, place) of the first event of a run, so that a chunk of lines that all
    decoded costs one entry."""

    pipeline: Pipeline
    report: ReplayReport
    errors_to: TextIO
    max_errors_shown: int
    events: list[Record] = field(default_factory=list)
    columns: Prepared = field(default_factory=Prepared.empty)
    runs: list[tuple[int, Place]] = field(default_factory=list)
    problems: list[tuple[Place, EventError]] = field(default_factory=list)

    def place(self, at: int) -> Place:
        """The place of the event at position ``at`` of the batch."""
        start, (line, path, number) = self.runs[bisect_right(self.runs, (at, _LAST)) - 1]
        return line + at - start, path, number + at - start

    def take(self) -> None:
        """Hand the events to the pipeline; report every bad line, in input order."""
        failures = self.pipeline.take(0, self.events, self.columns)
        for at, failure in failures:
            self.problems.append((self.place(at), failure))
        self.events.clear()
        self.columns.clear()
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
