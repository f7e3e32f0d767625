"""The event models as they were before msgspec (pydantic v2): the oracle of
``test_events_decoder.py``, which holds the decoder to the same accepted events, the same
values and the same reason codes. Not used by the service.

Input events (pydantic v2): what the retriever returned, and the signals that follow.

Raw bytes are decoded and validated in one pass by pydantic-core (``model_validate_json``),
so a record costs no intermediate Python dict. Every failure becomes an
:class:`~service.errors.EventError` with a short ``reason`` code (a Prometheus label and
dead-letter header) and a message that names the field and says how to fix it.
"""

from __future__ import annotations

from typing import Annotated, Literal, TypeVar

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from service.errors import EventError
from service.offline.files import field_path, primary_error
from service.stream.events import check_size
from service.times import to_epoch_ms

MAX_EVENT_BYTES = 1 << 20
"""Largest accepted encoded event (1 MiB: 1,000 results of 500-character ids fit)."""

MAX_RESULTS = 1000

QueryId = Annotated[str, StringConstraints(min_length=1, max_length=200, strict=True)]
ChunkId = Annotated[str, StringConstraints(min_length=1, max_length=500, strict=True)]
Label = Annotated[str, StringConstraints(min_length=1, max_length=100, strict=True)]
NonNegativeInt = Annotated[int, Field(ge=0, strict=True)]
Grade = Annotated[int, Field(ge=0, le=3, strict=True)]
Signal = Literal["click", "citation", "judgment"]

_MODEL_CONFIG = ConfigDict(frozen=True, extra="ignore", val_temporal_unit="seconds")


class ScoredResult(BaseModel):
    """A result given as an object; the score is informational, the rank is the position."""

    model_config = _MODEL_CONFIG

    chunk_id: ChunkId
    score: float | None = None


class _Timestamped(BaseModel):
    model_config = _MODEL_CONFIG

    query_id: QueryId
    timestamp: AwareDatetime
    """RFC 3339 with a UTC offset, or Unix epoch seconds; naive datetimes are rejected."""

    @property
    def timestamp_ms(self) -> int:
        """Event time in integer milliseconds since the epoch."""
        return to_epoch_ms(self.timestamp)


class QueryEvent(_Timestamped):
    """What the retriever returned for one query, rank 1 first."""

    retriever: Label
    # left to right: a plain string (the common case) is tried first, without smart-mode
    # scoring of both members (about 15% of a query's validation time)
    results: Annotated[
        list[Annotated[ChunkId | ScoredResult, Field(union_mode="left_to_right")]],
        Field(max_length=MAX_RESULTS),
    ]
    context_k: NonNegativeInt | None = None
    segment: Label = "default"

    @field_validator("segment", mode="before")
    @classmethod
    def _null_segment_is_default(cls, value: object) -> object:
        return "default" if value is None else value

    def chunk_ids(self) -> list[str]:
        """The ranked chunk ids, in logged order."""
        return [r if isinstance(r, str) else r.chunk_id for r in self.results]


class FeedbackEvent(_Timestamped):
    """A relevance signal for one chunk of a query: click, citation or judgment."""

    chunk_id: ChunkId
    signal: Signal
    grade: Grade | None = None
    dwell_ms: NonNegativeInt | None = None

    @model_validator(mode="after")
    def _judgment_needs_grade(self) -> FeedbackEvent:
        if self.signal == "judgment" and self.grade is None:
            raise PydanticCustomError(
                "judgment_without_grade", "a 'judgment' needs an integer 'grade' from 0 to 3"
            )
        return self


_M = TypeVar("_M", bound=_Timestamped)


def _reason(error: ValidationError) -> str:
    first = primary_error(error)
    kind = first["type"]
    top = str(first["loc"][0]) if first["loc"] else ""
    if kind == "json_invalid":
        return "invalid_json"
    if kind == "model_type" or (kind == "model_attributes_type" and not top):
        return "not_an_object"
    if top == "signal" and kind == "literal_error":
        return "unknown_signal"
    if top == "timestamp" and kind == "timezone_aware":
        return "naive_timestamp"
    if kind == "judgment_without_grade":
        return kind
    if not top:
        return "invalid_event"
    return f"missing_{top}" if kind == "missing" and len(first["loc"]) == 1 else f"invalid_{top}"


def describe(error: ValidationError, limit: int = 3) -> str:
    """A readable summary of a validation error: each field with what was wrong."""
    parts = []
    for item in error.errors()[:limit]:
        field = field_path(item["loc"]) or "(event)"
        value = item.get("input")
        shown = repr(value)
        if len(shown) > 60:
            shown = shown[:57] + "..."
        suffix = "" if item["type"] == "missing" or not item["loc"] else f" (got {shown})"
        parts.append(f"field {field!r}: {item['msg']}{suffix}")
    more = len(error.errors()) - limit
    if more > 0:
        parts.append(f"and {more} more")
    return "; ".join(parts)


def _decode(model: type[_M], raw: bytes | str) -> _M:
    check_size(raw)
    try:
        return model.model_validate_json(raw)
    except ValidationError as error:
        raise EventError(_reason(error), describe(error)) from None


def decode_query(raw: bytes | str) -> QueryEvent:
    """Decode and validate one query event from JSON bytes; raise EventError if bad."""
    return _decode(QueryEvent, raw)


def decode_feedback(raw: bytes | str) -> FeedbackEvent:
    """Decode and validate one feedback event from JSON bytes; raise EventError if bad."""
    return _decode(FeedbackEvent, raw)
