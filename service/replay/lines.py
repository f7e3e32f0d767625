"""Replay lines: ``{"topic": "queries" | "feedback", "event": {...}}``, decoded and
validated in one pass (a tagged union keyed by ``topic``), one by one or a chunk at a
time, and the chunks a file is read in (``replay`` and its reader process).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import IO, TYPE_CHECKING, Any, NoReturn

import msgspec
from msgspec import Struct

from service.errors import EventError
from service.mapping.json_records import loads
from service.stream.events import (
    MAX_EVENT_BYTES,
    FeedbackEvent,
    QueryEvent,
    feedback_from,
    query_from,
)
from service.stream.topics import FEEDBACK, QUERIES, Topic

if TYPE_CHECKING:  # (the mapping's models are built only when a mapping is used)
    from service.mapping.mapper import Mapper

MAX_LINE_BYTES = MAX_EVENT_BYTES + 64
"""The longest line accepted: an event at the limit and the line's own fields."""


class QueryLine(Struct, tag_field="topic", tag="queries", gc=False):
    event: QueryEvent


class FeedbackLine(Struct, tag_field="topic", tag="feedback", gc=False):
    event: FeedbackEvent
    """(Or an :class:`AuditEvent`, made by the slow path: the fast decoder reads feedback
    events only, and an audit line, which has no ``chunk_id``, takes the slow path.)"""


LINE = msgspec.json.Decoder(QueryLine | FeedbackLine)


class LineError(EventError):
    """A bad replay line; ``topic`` is QUERIES or FEEDBACK when the line names one."""

    def __init__(self, reason: str, message: str, topic: Topic | None = None) -> None:
        super().__init__(reason, message)
        self.topic = topic


def _check_line_size(raw: bytes) -> None:
    if len(raw) > MAX_LINE_BYTES:
        oversized(len(raw))


def oversized(size: int) -> NoReturn:
    """Raise the error of a line of ``size`` bytes, over ``MAX_LINE_BYTES``."""
    raise LineError("oversized", f"line of {size} bytes exceeds {MAX_EVENT_BYTES} bytes")


def decode_line(raw: bytes) -> QueryLine | FeedbackLine:
    """Decode one replay line; raise LineError with the event's reason code if bad."""
    _check_line_size(raw)
    try:
        return LINE.decode(raw)
    except (msgspec.ValidationError, EventError):  # (EventError: an event's own checks)
        pass
    except msgspec.DecodeError:
        raise LineError("invalid_json", "the line is not valid JSON") from None
    # Slow path, only for bad lines (and NaN or Infinity, which Python's json.dumps
    # writes and pydantic accepted): find which part is wrong and why.
    topic, event = split_line(raw)
    try:
        if topic == QUERIES:
            return QueryLine(query_from(event))
        return FeedbackLine(feedback_from(event))  # type: ignore[arg-type] # (see FeedbackLine)
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


def decode_mapped_line(raw: bytes, mapper: Mapper) -> QueryLine | FeedbackLine | Topic:
    """Decode one replay line whose ``event`` is a user's record, through ``mapper``
    (only its topic for a record the mapping skips); LineError if bad."""
    _check_line_size(raw)
    topic, event = split_line(raw)
    try:
        if topic == QUERIES:
            query = mapper.query(event)
            return topic if query is None else QueryLine(query)
        feedback = mapper.feedback(event)
        return topic if feedback is None else FeedbackLine(feedback)  # type: ignore[arg-type]
    except EventError as error:
        raise LineError(error.reason, str(error), topic) from None


def decode_whole(chunk: list[bytes]) -> list[QueryEvent | FeedbackEvent] | None:
    """The events of a chunk of lines that all decode (the usual case: a few calls for
    the chunk); None if any line is blank, oversized or bad (to be read line by line)."""
    try:
        if max(map(len, chunk)) > MAX_LINE_BYTES:
            return None
        return [line.event for line in map(LINE.decode, chunk)]
    except (msgspec.DecodeError, EventError):  # (ValidationError is a DecodeError)
        return None


def chunks(
    handle: IO[bytes], read_bytes: int, advance_every: int, lines_read: Callable[[], int]
) -> Iterator[tuple[int, list[bytes]]]:
    """A file's lines, about ``read_bytes`` at a time and never past the next advance
    (every ``advance_every`` non-blank lines: ``lines_read()`` says how many were read so
    far, over every file), each chunk with the file's number of its first line."""
    number = 0
    lines: list[bytes] = []
    while lines or (lines := handle.readlines(read_bytes)):
        room = advance_every - lines_read() % advance_every
        chunk, lines = lines[:room], lines[room:]
        yield number + 1, chunk
        number += len(chunk)
