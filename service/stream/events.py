"""Input events (msgspec): what the retriever returned, and the signals that follow.

Raw bytes are decoded and validated in one pass by msgspec's typed C decoder, every
contract limit included, into compact structs (about six times as fast as validating
the same line with pydantic). Every failure becomes an
:class:`~service.errors.EventError` with a short ``reason`` code (a Prometheus label and
dead-letter header) and a message that names the field, shows the value and says what
was expected. An event with several faults is reported by the first one the decoder
meets, in document order.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

import msgspec
from msgspec import Meta, Struct
from pydantic import AwareDatetime, ConfigDict, TypeAdapter, ValidationError

from service.errors import EventError
from service.times import to_epoch_ms

MAX_EVENT_BYTES = 1 << 20
"""Largest accepted encoded event (1 MiB: 1,000 results of 500-character ids fit)."""

MAX_RESULTS = 1000

QueryId = Annotated[str, Meta(min_length=1, max_length=200)]
ChunkId = Annotated[str, Meta(min_length=1, max_length=500)]
Label = Annotated[str, Meta(min_length=1, max_length=100)]
NonNegativeInt = Annotated[int, Meta(ge=0)]
Grade = Annotated[int, Meta(ge=0, le=3)]
Signal = Literal["click", "citation", "judgment"]
Timestamp = Annotated[datetime, Meta(tz=True)] | float
"""RFC 3339 with a UTC offset, or Unix epoch seconds (a number); naive times are rejected."""

_FIRST_SECOND = -62_135_596_800
"""0001-01-01T00:00:00Z in epoch seconds; with the last, the range of a datetime."""
_LAST_SECOND = 253_402_300_799

_NO_KEY = "\u00a7timestamp_ms"
"""The wire name of the derived ``timestamp_ms`` slot: no producer sends it, and if one
did, any value is accepted and overwritten."""


def _epoch_ms(timestamp: datetime | float) -> int:
    """Integer milliseconds since the epoch; seconds given as a number are taken to the
    microsecond (rounded), then floored to the millisecond, as for an RFC 3339 time.
    EventError for epoch seconds outside years 1 to 9999 (what a datetime holds)."""
    if isinstance(timestamp, datetime):
        return to_epoch_ms(timestamp)
    if not _FIRST_SECOND <= timestamp <= _LAST_SECOND:  # (also NaN)
        raise EventError(
            "invalid_timestamp",
            f"field 'timestamp': epoch seconds must lie in years 1 to 9999 "
            f"(got {timestamp!r}); send seconds, not milliseconds, or an RFC 3339 time",
        )
    seconds = math.floor(timestamp)
    return (seconds * 1_000_000 + round((timestamp - seconds) * 1e6)) // 1000


class ScoredResult(Struct, gc=False):
    """A result given as an object; the score is informational, the rank is the position.

    Not hashable (not frozen): the pipeline hashes a query's string chunk ids, or its
    objects' ``chunk_id`` (read by ``attrgetter``), in C calls, and falls back to
    telling the two apart item by item when a query mixes them (a TypeError or an
    AttributeError on the way; ``service.stream.hashes``)."""

    chunk_id: ChunkId
    score: float | None = None


class QueryEvent(Struct, gc=False):
    """What the retriever returned for one query, rank 1 first."""

    query_id: QueryId
    timestamp: Timestamp
    retriever: Label
    results: Annotated[list[ChunkId | ScoredResult], Meta(max_length=MAX_RESULTS)]
    context_k: NonNegativeInt | None = None
    if TYPE_CHECKING:
        segment: str = "default"
    else:  # null is the default too (made so after decoding)
        segment: Label | None = "default"
    timestamp_ms: Any = msgspec.field(default=0, name=_NO_KEY)
    """Event time in integer milliseconds since the epoch (derived from ``timestamp``)."""

    def __post_init__(self) -> None:
        # the checks the decoder's types cannot express: an EventError raised here comes
        # out of the decoder as it is
        self.timestamp_ms = _epoch_ms(self.timestamp)
        if self.segment is None:
            self.segment = "default"

    def chunk_ids(self) -> list[str]:
        """The ranked chunk ids, in logged order."""
        return [r if type(r) is str else r.chunk_id for r in self.results]  # type: ignore[union-attr]


class MappedQueryEvent(QueryEvent, gc=False):
    """A query event read through an input mapping: with the query text, when it names one
    (for the labels output; never a field of the contract's query event)."""

    query_text: str | None = msgspec.field(default=None, name="query")


class FeedbackEvent(Struct, gc=False):
    """A relevance signal for one chunk of a query: click, citation or judgment."""

    query_id: QueryId
    timestamp: Timestamp
    chunk_id: ChunkId
    signal: Signal
    grade: Grade | None = None
    dwell_ms: NonNegativeInt | None = None
    timestamp_ms: Any = msgspec.field(default=0, name=_NO_KEY)
    """Event time in integer milliseconds since the epoch (derived from ``timestamp``)."""

    def __post_init__(self) -> None:
        self.timestamp_ms = _epoch_ms(self.timestamp)  # (checks as QueryEvent's)
        if self.grade is None and self.signal == "judgment":
            raise EventError(
                "judgment_without_grade",
                "field '(event)': a 'judgment' needs an integer 'grade' from 0 to 3",
            )


class AuditEvent(Struct, gc=False):
    """A thorough judgment of one query's chunks by a judge (``signal`` ``audit``): grades
    of every chunk it assessed, relevant chunks that were never retrieved included (the
    contract's "Audit sample and audited estimates"). Never a live label."""

    query_id: QueryId
    timestamp: Timestamp
    signal: Literal["audit"]
    judge: Label
    grades: dict[ChunkId, Grade]
    timestamp_ms: Any = msgspec.field(default=0, name=_NO_KEY)
    """Event time in integer milliseconds since the epoch (derived from ``timestamp``)."""

    def __post_init__(self) -> None:
        self.timestamp_ms = _epoch_ms(self.timestamp)  # (checks as QueryEvent's)


_E = TypeVar("_E", QueryEvent, MappedQueryEvent, FeedbackEvent, AuditEvent)

_DECODERS: dict[type[Any], msgspec.json.Decoder[Any]] = {
    QueryEvent: msgspec.json.Decoder(QueryEvent),
    FeedbackEvent: msgspec.json.Decoder(FeedbackEvent),
}

AUDIT_REASONS = {
    "missing_judge": "an audit needs 'judge', the name of who graded it (1..100 characters)",
    "missing_grades": "an audit needs 'grades', {chunk_id: grade 0..3} of every chunk it assessed",
}
"""What an audit event without one of its fields is told."""


def check_size(raw: bytes | str) -> None:
    """EventError if the encoded event is over the limit (checked before decoding)."""
    if len(raw) > MAX_EVENT_BYTES:
        raise EventError(
            "oversized",
            f"event of {len(raw)} bytes exceeds the limit of {MAX_EVENT_BYTES} bytes; "
            f"send at most {MAX_RESULTS} results with ids of at most 500 characters",
        )


def _event_decoder(kind: type[_E], what: str) -> Callable[[bytes | str], _E]:
    """The decode function of one kind of event: one call per event, its limits and
    checks inside (the size written out; the rest in the event's ``__post_init__``)."""
    decoder = _DECODERS[kind]

    def decode(raw: bytes | str) -> _E:
        if len(raw) > MAX_EVENT_BYTES:
            check_size(raw)
        try:
            event: _E = decoder.decode(raw)
        except msgspec.DecodeError as error:
            return _decode_refused(kind, raw, error)
        return event

    decode.__doc__ = f"Decode and validate one {what} event from JSON bytes; EventError if bad."
    return decode


decode_query = _event_decoder(QueryEvent, "query")
decode_feedback = _event_decoder(FeedbackEvent, "feedback")


def _decode_refused(kind: type[_E], raw: bytes | str, error: msgspec.DecodeError) -> _E:
    """An event the decoder refused (a ValidationError too): the slow path, see _convert
    (an audit on the feedback topic comes this way: it has no ``chunk_id``)."""
    try:
        obj = json.loads(raw)
    except ValueError:  # (UnicodeDecodeError too)
        raise EventError("invalid_json", f"not valid JSON: {_plain(str(error))}") from None
    if kind is FeedbackEvent:
        return feedback_from(obj)  # type: ignore[return-value]
    return _convert(kind, obj)


def query_from(obj: Mapping[str, Any]) -> QueryEvent:
    """Validate one query event given as a decoded JSON object; raise EventError if bad."""
    return _convert(QueryEvent, obj)


def mapped_query_from(obj: Mapping[str, Any]) -> MappedQueryEvent:
    """:func:`query_from` for a mapped record, whose ``query`` is the query text."""
    return _convert(MappedQueryEvent, obj)


def feedback_from(obj: Mapping[str, Any]) -> FeedbackEvent | AuditEvent:
    """Validate one feedback event given as a decoded JSON object (an :class:`AuditEvent`
    when its ``signal`` is ``audit``); raise EventError if bad."""
    if isinstance(obj, dict) and obj.get("signal") == "audit":
        return audit_from(obj)
    return _convert(FeedbackEvent, obj)


def audit_from(obj: Mapping[str, Any]) -> AuditEvent:
    """Validate one audit event (decoded JSON); EventError with ``missing_judge``,
    ``missing_grades``, ``invalid_grades`` (not an object of chunk ids to integers 0..3)
    or the reasons of any event."""
    for name in ("judge", "grades"):
        if obj.get(name) is None:
            reason = f"missing_{name}"
            raise EventError(
                reason, f"field {name!r}: required, but missing; {AUDIT_REASONS[reason]}"
            )
    try:
        return _convert(AuditEvent, obj)
    except EventError as error:
        if error.reason != "invalid_grades":
            raise
        grades = obj["grades"]
        if not isinstance(grades, dict):
            shown = f"got {_plain(type(grades).__name__)}"
        else:
            chunk, grade = next(
                (c, g)
                for c, g in grades.items()
                if not (type(g) is int and 0 <= g <= 3 and 1 <= len(c) <= 500)
            )
            shown = f"got {chunk[:60]!r}: {grade!r}"
        raise EventError(
            "invalid_grades", f"field 'grades': {AUDIT_REASONS['missing_grades']} ({shown})"
        ) from None


def _convert(kind: type[_E], obj: object) -> _E:
    """Validate a decoded JSON value; for a bad event from :func:`_decode_refused` also the slow
    path, which accepts what the decoder refuses and pydantic accepted before it: NaN and
    Infinity (not JSON, but Python's ``json.dumps`` writes them, a score of ``nan``) and
    ISO 8601 times beyond RFC 3339 (``2026-12-02T08:00Z``, as Java's ``OffsetDateTime``
    prints a time on the minute)."""
    try:
        event: _E = msgspec.convert(obj, kind, strict=True)
    except msgspec.ValidationError as error:
        moment = _iso_timestamp(obj, str(error))
        if moment is None:
            raise explain(error, lambda: obj) from None
        return _convert(kind, {**obj, "timestamp": moment})  # type: ignore[dict-item]
    return event


_ISO_TIME: TypeAdapter[datetime] = TypeAdapter(
    AwareDatetime, config=ConfigDict(val_temporal_unit="seconds")
)


def _iso_timestamp(obj: object, error: str) -> datetime | None:
    """The event's ``timestamp`` string read as ISO 8601 when the decoder refused it;
    None when the error was elsewhere; EventError when pydantic refuses it too."""
    if not error.endswith("- at `$.timestamp`") or not isinstance(obj, dict):
        return None
    text = obj.get("timestamp")
    if not isinstance(text, str):
        return None
    try:
        return _ISO_TIME.validate_python(text)
    except ValidationError as refused:
        item = refused.errors()[0]
        reason = "naive_timestamp" if item["type"] == "timezone_aware" else "invalid_timestamp"
        shown = repr(text) if len(text) <= 60 else repr(text[:57]) + "..."
        raise EventError(
            reason,
            f"field 'timestamp': {item['msg']} (got {shown}); send an RFC 3339 time with a "
            "UTC offset (2026-12-02T08:00:00Z) or epoch seconds",
        ) from None


# -- errors: a reason code, and a message that names the field --------------------------

_AT = re.compile(r"^(?P<msg>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)
_MISSING = re.compile(r"^Object missing required field `(?P<field>[^`]+)`$")
_PATH_PART = re.compile(r"\.([^.\[]+)|\[(\d+)\]")
_WORDS = {
    "str": "a string",
    "int": "an integer",
    "float": "a number",
    "bool": "a boolean",
    "null": "null",
    "array": "an array",
    "object": "an object",
    "datetime": "an RFC 3339 time",
    "float | datetime": "an RFC 3339 time with a UTC offset, or epoch seconds",
    "str | object": 'a chunk id string or an object {"chunk_id": ...}',
    "int | null": "an integer or null",
    "str | null": "a string or null",
    "float | null": "a number or null",
}
_EXPECTED = re.compile(r"^Expected `(?P<want>[^`]+)`, got `(?P<got>[^`]+)`$")
_BOUND = re.compile(r"^Expected `(?P<type>str|array|int)`(?: of length)? (?P<op>[<>]=) (?P<n>\d+)$")


def explain(error: msgspec.ValidationError, document: Callable[[], Any]) -> EventError:
    """The reason code and a readable message of a decoder's validation error;
    ``document()`` gives the decoded input, to show the offending value."""
    match = _AT.match(str(error))
    assert match is not None  # the pattern matches any text
    text, path = match["msg"], _path(match["path"] or "")
    missing = _MISSING.match(text)
    if missing is not None:
        path = (*path, missing["field"])
        if len(path) == 1:
            return EventError(f"missing_{path[0]}", f"field {path[0]!r}: required, but missing")
        return EventError(f"invalid_{path[0]}", f"field {_dotted(path)!r}: required, but missing")
    if not path:
        if text.startswith("Expected `object`"):
            return EventError("not_an_object", "expected a JSON object {...}, " + _plain(text))
        return EventError("invalid_event", f"field '(event)': {_plain(text)}")
    top = str(path[0])
    reason = f"invalid_{top}"
    if top == "signal":
        reason = "unknown_signal"
        text = "must be one of 'click', 'citation', 'judgment'"
    elif top == "timestamp" and "timezone" in text:
        reason = "naive_timestamp"
        text = "needs a UTC offset (such as Z or +01:00): a time without one is ambiguous"
    return EventError(reason, f"field {_dotted(path)!r}: {_readable(text)}{_got(document, path)}")


def _path(text: str) -> tuple[str | int, ...]:
    return tuple(name if name else int(index) for name, index in _PATH_PART.findall(text))


def _dotted(path: tuple[str | int, ...]) -> str:
    return ".".join(map(str, path))


def _plain(text: str) -> str:
    return text.replace("`", "'")


def _readable(text: str) -> str:
    bound = _BOUND.match(text)
    if bound is not None:
        kind, op, n = bound["type"], bound["op"], int(bound["n"])
        if kind == "int":
            return f"must be an integer {op} {n}"
        unit = "character" if kind == "str" else "item"
        what = "a string" if kind == "str" else "an array"
        least = "at least" if op == ">=" else "at most"
        return f"must be {what} of {least} {n} {unit}{'s' if n != 1 else ''}"
    expected = _EXPECTED.match(text)
    if expected is not None:
        want, got = expected["want"], expected["got"]
        return f"expected {_WORDS.get(want, want)}, got {_WORDS.get(got, got)}"
    return _plain(text)


def _got(document: Callable[[], Any], path: tuple[str | int, ...]) -> str:
    """`` (got <value>)`` for the value at ``path``, cut to 60 characters; empty if absent."""
    try:
        value = document()
        for part in path:
            value = value[part]
    except (LookupError, TypeError, ValueError):
        return ""
    shown = repr(value)
    return f" (got {shown[:57] + '...' if len(shown) > 60 else shown})"
