"""The files' lines fed to the pipeline: read in chunks (in this process, or decoded
already by the reader process), each line given its topic's next offset, into the
pending :class:`~service.replay.batch.Batch`, which is taken every ``ADVANCE_EVERY``
lines (and the watermark advanced), or early once its lines pass ``BATCH_BYTES``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import count

from service.offline.files import open_input
from service.replay.batch import Batch
from service.replay.lines import (
    FeedbackLine,
    LineError,
    QueryLine,
    chunks,
    decode_whole,
    oversized,
)
from service.replay.reader import LeanQuery, Raw, Reader
from service.stream.events import FeedbackEvent, QueryEvent
from service.stream.prepared import Prepared, prepare
from service.stream.topics import FEEDBACK, QUERIES, Topic
from service.stream.windows import ClosedWindow

ADVANCE_EVERY = 8192
"""Records between watermark advances (finalisation is batched over this many); the
events between two are taken by the pipeline as one batch, or several when large."""
BATCH_BYTES = 16 << 20
"""A batch is taken early once its lines reach this many bytes (the watermark does not
move within a batch, so where it is cut changes nothing)."""
READ_BYTES = 1 << 20
"""Lines are read about this many bytes at a time (and at most up to the next advance)."""


@dataclass(slots=True)
class Feed:
    """Reads the files' lines into ``pending``, taking it (and advancing) as it fills.

    Lines are read in chunks that end at the next advance at the latest. A chunk whose
    lines all decode (the usual case) is decoded and handed over in a few calls; a chunk
    with a blank, oversized or bad line, or any chunk read through an input mapping, goes
    line by line, which finds and reports what is wrong. With a reader process, the
    chunks come from it, those that decoded already decoded and hashed."""

    pending: Batch
    decode: Callable[[bytes], QueryLine | FeedbackLine | Topic]
    emit: Callable[[list[ClosedWindow]], None]
    grade: Callable[[FeedbackEvent], int]
    """The label policy's grade of a feedback event."""
    audit_threshold: int = 0
    """The audit sample's 64-bit threshold (0: off): the reader keeps its queries' ids."""
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
                columns, size = prepare(events, self.grade), sum(map(len, chunk))
                self._whole(path, first, events, columns, QueryEvent, size=size)

    def from_reader(self, paths: list[str]) -> None:
        """Read the files through a reader process (:mod:`service.replay.reader`)."""
        reader = Reader(paths, READ_BYTES, ADVANCE_EVERY, self.grade, self.audit_threshold)
        try:
            for path, item in reader:
                if isinstance(item, Raw):
                    self._lines(path, item.first, item.lines)
                    continue
                self._whole(path, item.first, item.events, item.prepared, LeanQuery, size=item.size)
        finally:
            reader.close()

    def _whole(
        self,
        path: str,
        first: int,
        events: Sequence[object],
        columns: Prepared,
        query_type: type,
        *,
        size: int,
    ) -> None:
        """Add the events of a chunk of lines that all decoded, ``size`` bytes, with their
        columns (``query_type``: the type of its query events)."""
        pending, offsets = self.pending, self.offsets
        report = pending.report
        queries, feedback = count(offsets[QUERIES]), count(offsets[FEEDBACK])
        lines = [
            (QUERIES, next(queries), event)
            if type(event) is query_type
            else (FEEDBACK, next(feedback), event)
            for event in events
        ]
        offsets[QUERIES], offsets[FEEDBACK] = next(queries), next(feedback)
        pending.add_chunk(lines, columns, (report.lines + 1, path, first))  # type: ignore[arg-type]
        report.lines += len(lines)
        self.size += size
        self._filled()

    def _lines(self, path: str, first: int, chunk: Sequence[bytes | int]) -> None:
        """Take a chunk's lines one by one (from the reader, an oversized line is its
        length; never a blank one)."""
        for number, raw in enumerate(chunk, start=first):
            if type(raw) is int or not raw.isspace():  # type: ignore[union-attr]
                self._line(path, number, raw)

    def _line(self, path: str, number: int, raw: bytes | int) -> None:
        """Add one line, valid or not (an int: the length of an oversized line), with its
        topic's next offset (its topic is known once it is decoded)."""
        pending, offsets = self.pending, self.offsets
        report = pending.report
        report.lines += 1
        value: QueryEvent | FeedbackEvent | LineError | Topic
        columns = None  # (for a bad or skipped line)
        try:
            line = self.decode(raw) if type(raw) is bytes else oversized(raw)  # type: ignore[arg-type]
        except LineError as error:
            topic = QUERIES if error.topic is None else error.topic
            value = error
        else:
            if isinstance(line, Topic):  # a record the input mapping skips
                report.ignored += 1
                topic = value = line
            else:
                topic = QUERIES if isinstance(line, QueryLine) else FEEDBACK
                value = line.event
                columns = prepare([value], self.grade)
                self.size += len(raw)  # type: ignore[arg-type]
        pending.add_line((topic, offsets[topic], value), (report.lines, path, number), columns)
        offsets[topic] += 1
        self._filled()

    def _filled(self) -> None:
        """Take the batch and advance every ``ADVANCE_EVERY`` lines; take it early once its
        lines pass ``BATCH_BYTES``."""
        pending = self.pending
        if pending.report.lines % ADVANCE_EVERY == 0:
            pending.flush()
            self.size = 0
            self.emit(pending.pipeline.advance())
        elif self.size > BATCH_BYTES:  # (large events: a batch's memory is bounded)
            pending.flush()
            self.size = 0
