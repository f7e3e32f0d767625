"""Applying an input mapping: a user's record in, a contract event (or nothing) out.

Each field is read from its path (or constant), passed through its value map, and
converted where the contract's type differs from what users log (ids given as numbers
become their decimal text; epoch milliseconds become seconds); the event is then
validated exactly as an event in the contract's shape is. A record the mapping skips
(a feedback action it ignores) gives None. A required field absent at its path, or a
path that runs into a value it cannot go into, is a bad record: EventError with the
contract's reason code (``missing_<field>``, ``invalid_<field>``) and a message naming
the field and the path.
"""

from __future__ import annotations

import contextlib
import json
from datetime import UTC, datetime
from typing import Any

from service.errors import EventError
from service.mapping.json_records import loads
from service.mapping.paths import AbsentError, Path, WrongTypeError, kind_of
from service.mapping.spec import REQUIRED, FieldSpec, InputMapping, load_mapping
from service.stream.events import (
    AuditEvent,
    FeedbackEvent,
    QueryEvent,
    check_size,
    feedback_from,
    mapped_query_from,
)
from service.stream.topics import FEEDBACK, QUERIES, Topic

_ABSENT = object()
_SKIP = object()

_IDS = frozenset({"query_id", "chunk_id", "retriever", "segment", "results"})
"""Fields whose values may be logged as numbers (a UBI ``object_id`` may be an integer)."""
_FIELD_OF = {"naive_timestamp": "timestamp", "unknown_signal": "signal"}


def _as_id(value: Any) -> Any:
    if type(value) is int:
        return str(value)
    if type(value) is list:
        return [str(v) if type(v) is int else v for v in value]
    return value


class _Field:
    """One field of an event, compiled from its spec: the common case (every key present,
    no conversion) is a few dict lookups; anything else takes the general path."""

    __slots__ = ("convert", "keys", "mapped", "name", "path", "required", "spec")

    def __init__(self, name: str, spec: FieldSpec, required: bool) -> None:
        self.name = name
        self.spec = spec
        self.path = Path(spec.path) if spec.path is not None else None
        self.required = required
        steps = self.path.steps if self.path is not None else ()
        plain = all(type(step) is str and not step.isdigit() for step in steps)
        self.keys: tuple[str, ...] | None = steps if plain and steps else None  # type: ignore[assignment]
        """The keys to look up in turn, when the path is only object keys."""
        self.mapped = spec.values is not None or bool(spec.ignore) or spec.others == "ignore"
        self.convert = name in ("timestamp", "query") or name in _IDS

    @property
    def source(self) -> str:
        return f"path {self.spec.path!r}" if self.path is not None else "the constant"

    def read(self, record: dict[str, Any]) -> Any:
        keys = self.keys
        if keys is not None:
            value: Any = record
            try:
                for key in keys:
                    value = value[key]
            except KeyError:  # absent: fine for an optional field, else said where
                optional = not self.required or self.spec.default is not None
                value = _ABSENT if optional else self._look_up(record)
            except TypeError:  # a step into a value that is not an object
                value = self._look_up(record)
        else:
            value = self._look_up(record)
        if value is None or value is _ABSENT:
            default = self.spec.default
            return value if default is None else default
        if self.mapped:
            value = self._map(value)
        return self._convert(value) if self.convert and value is not _SKIP else value

    def _look_up(self, record: dict[str, Any]) -> Any:
        """The general path: a constant, list steps, and absent or unreadable values."""
        spec, name = self.spec, self.name
        if self.path is None:
            return spec.const
        try:
            return self.path.read(record)
        except AbsentError as missing:
            if spec.default is not None or not self.required:
                return _ABSENT
            raise EventError(
                f"missing_{name}",
                f"field {name!r}: required, but the record has nothing at {missing.at!r} "
                f"(mapped from {spec.path!r})",
            ) from None
        except WrongTypeError as wrong:
            raise EventError(
                f"invalid_{name}",
                f"field {name!r}: {spec.path!r} cannot be read, {wrong.at!r} is "
                f"{wrong.got} where the path needs an object or array",
            ) from None

    def _map(self, value: Any) -> Any:
        spec = self.spec
        key = value if isinstance(value, str) else json.dumps(value)
        if spec.values is not None and key in spec.values:
            return spec.values[key]
        if key in spec.ignore or spec.others == "ignore":
            return _SKIP
        return value

    def _convert(self, value: Any) -> Any:
        name = self.name
        if name == "timestamp":
            return self._time(value)
        if name == "query":  # the text is kept only as text; anything else is left out
            return value if isinstance(value, str) else _ABSENT
        return _as_id(value)

    def _time(self, value: Any) -> Any:
        form = self.spec.format
        if form in ("epoch_seconds", "epoch_millis"):
            number = value
            if isinstance(value, str):
                try:
                    number = float(value) if "." in value else int(value)
                except ValueError:
                    number = None
            if isinstance(number, bool) or not isinstance(number, int | float):
                unit = "seconds" if form == "epoch_seconds" else "milliseconds"
                raise EventError(
                    "invalid_timestamp",
                    f"field 'timestamp': expected epoch {unit} (a number) at "
                    f"{self.spec.path!r}, got {kind_of(value)} ({str(value)[:40]!r})",
                )
            return number / 1000 if form == "epoch_millis" else number
        if self.spec.naive == "utc" and isinstance(value, str):
            try:
                moment = datetime.fromisoformat(value)
            except ValueError:
                return value  # the validator says what is wrong with it
            if moment.tzinfo is None:
                return moment.replace(tzinfo=UTC).isoformat()
        return value


class RoleMapper:
    """The mapping of one topic's records (queries or feedback)."""

    def __init__(self, role: str, fields: Any) -> None:
        self.role = role
        self.fields = [
            _Field(name, spec, name in REQUIRED[role]) for name, spec in fields if spec is not None
        ]
        self.by_name = {f.name: f for f in self.fields}

    def apply(self, record: Any) -> dict[str, Any] | None:
        """The event in the contract's shape, or None for a record the mapping skips."""
        if not isinstance(record, dict):
            raise EventError(
                "not_an_object", f"expected a JSON object {{...}}, got {kind_of(record)}"
            )
        out: dict[str, Any] = {}
        for f in self.fields:
            value = f.read(record)
            if value is _SKIP:
                return None
            if value is not _ABSENT:
                out[f.name] = value
        return out

    def present(self, record: Any) -> int:
        """How many of the required fields ``record`` has (a constant always counts)."""
        n = 0
        for f in self.fields:
            if f.required:
                with contextlib.suppress(AbsentError, WrongTypeError):
                    n += f.path is None or f.path.read(record) is not None
        return n

    def field_of(self, reason: str) -> _Field | None:
        """The mapped field that an error's reason code concerns, if any."""
        return self.by_name.get(_FIELD_OF.get(reason) or reason.partition("_")[2])

    def explain(self, error: EventError) -> EventError:
        """``error`` of the mapped event, with where its field came from."""
        f = self.field_of(error.reason)
        if f is None:
            return error
        message = str(error) if f.spec.path == f.name else f"{error} (mapped from {f.source})"
        if error.reason == "naive_timestamp":
            message += (
                "; times logged in UTC without an offset: naive: utc on the mapping's timestamp"
            )
        return EventError(error.reason, message)


class Mapper:
    """Decodes a topic's records through an input mapping."""

    def __init__(self, mapping: InputMapping) -> None:
        self.queries = RoleMapper("queries", mapping.queries)
        self.feedback_role = RoleMapper("feedback", mapping.feedback)

    def query(self, record: Any) -> QueryEvent | None:
        """A decoded record of the queries topic as a query event (None: skipped)."""
        obj = self.queries.apply(record)
        if obj is None:
            return None
        try:
            return mapped_query_from(obj)
        except EventError as error:
            raise self.queries.explain(error) from None

    def feedback(self, record: Any) -> FeedbackEvent | AuditEvent | None:
        """A decoded record of the feedback topic as a feedback event (None: skipped)."""
        obj = self.feedback_role.apply(record)
        if obj is None:
            return None
        try:
            return feedback_from(obj)
        except EventError as error:
            raise self.feedback_role.explain(error) from None

    def topic_of(self, record: Any) -> Topic:
        """The topic a record of unknown origin most likely comes from: the one whose
        mapping finds more of its required fields in it (queries on a tie)."""
        if not isinstance(record, dict):
            return QUERIES
        return (
            FEEDBACK
            if self.feedback_role.present(record) > self.queries.present(record)
            else QUERIES
        )

    def decode_query(self, raw: bytes | str) -> QueryEvent | None:
        check_size(raw)
        return self.query(loads(raw))

    def decode_feedback(self, raw: bytes | str) -> FeedbackEvent | AuditEvent | None:
        check_size(raw)
        return self.feedback(loads(raw))


def load_mapper(spec: str | None) -> Mapper | None:
    """The mapper of ``--input-mapping`` (None without one: the contract's decoder)."""
    mapping = load_mapping(spec)
    return Mapper(mapping) if mapping is not None else None
