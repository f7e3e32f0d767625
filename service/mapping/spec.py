"""The input mapping file: per topic, where each field of the contract's events lives.

YAML or JSON (``--input-mapping FILE``), or the name of a preset (``--input-mapping
ubi``). Every field of an event is read from a path of the user's record (a string: the
path), or given as an object::

    queries:
      query_id: request.id                      # a dotted path (or a JSON pointer: /request/id)
      timestamp: {path: ts, format: epoch_millis}
      retriever: {const: bm25-v3}               # the same for every record
      results: hits[*].id                       # one id from each item of a list
      segment: {path: tenant, default: default}
    feedback:
      signal: {path: type, values: {select: click, cite: citation}, others: ignore}

A field not named keeps its identity path (its own name, as in the contract's events);
``null`` leaves an optional field unread. ``extends: ubi`` starts from a preset and
changes only the fields named. Docs: docs/configuration.md ("Input mapping").
"""

from __future__ import annotations

from pathlib import Path as FilePath
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError, model_validator

from service.errors import ConfigError
from service.mapping.paths import Path, PathError

TimeFormat = Literal["rfc3339", "epoch_seconds", "epoch_millis"]


def _shorthand(value: object) -> object:
    return {"path": value} if isinstance(value, str) else value


class FieldSpec(BaseModel):
    """Where one field of an event comes from, and how its value is read."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str | None = None
    """Dotted path (``a.b[0].c``, ``hits[*].id``) or JSON pointer (``/a/b``)."""
    const: str | int | None = None
    """A fixed value for every record (instead of a path)."""
    default: str | int | float | None = None
    """The value when the path is absent or null."""
    format: TimeFormat | None = None
    """``timestamp`` only: RFC 3339 text, or a number (or digits) of epoch seconds or ms."""
    naive: Literal["reject", "utc"] = "reject"
    """``timestamp`` only: read an RFC 3339 time without a UTC offset as UTC."""
    values: dict[str, str | int] | None = None
    """A value map, from the user's values (as text) to the event's."""
    ignore: tuple[str, ...] = ()
    """Values whose records are skipped (not events, not errors)."""
    others: Literal["keep", "ignore"] = "keep"
    """Values in neither ``values`` nor ``ignore``: kept as they are, or skipped."""

    @model_validator(mode="after")
    def _one_source(self) -> FieldSpec:
        if (self.path is None) == (self.const is None):
            raise ValueError("give exactly one of 'path' and 'const'")
        if self.path is not None:
            try:
                Path(self.path)
            except PathError as error:
                raise ValueError(str(error)) from None
        return self


Field = Annotated[FieldSpec | None, BeforeValidator(_shorthand)]


class QueryFields(BaseModel):
    """The query event's fields (``query``: the query text, read only when named)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    query_id: Field = FieldSpec(path="query_id")
    timestamp: Field = FieldSpec(path="timestamp")
    retriever: Field = FieldSpec(path="retriever")
    results: Field = FieldSpec(path="results")
    context_k: Field = FieldSpec(path="context_k")
    segment: Field = FieldSpec(path="segment")
    query: Field = None


class FeedbackFields(BaseModel):
    """The feedback event's fields."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    query_id: Field = FieldSpec(path="query_id")
    timestamp: Field = FieldSpec(path="timestamp")
    chunk_id: Field = FieldSpec(path="chunk_id")
    signal: Field = FieldSpec(path="signal")
    grade: Field = FieldSpec(path="grade")
    dwell_ms: Field = FieldSpec(path="dwell_ms")


REQUIRED = {
    "queries": ("query_id", "timestamp", "retriever", "results"),
    "feedback": ("query_id", "timestamp", "chunk_id", "signal"),
}


class InputMapping(BaseModel):
    """A whole mapping: the query topic's records and the feedback topic's."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "custom"
    queries: QueryFields = QueryFields()
    feedback: FeedbackFields = FeedbackFields()

    @model_validator(mode="after")
    def _required_are_read(self) -> InputMapping:
        for role, names in REQUIRED.items():
            fields = getattr(self, role)
            for name in names:
                if getattr(fields, name) is None:
                    raise ValueError(f"{role}.{name} is required: give a path or a const")
        return self


UBI: dict[str, Any] = {
    "name": "ubi",
    "queries": {
        "query_id": "query_id",
        "timestamp": {"path": "timestamp", "naive": "utc"},
        "results": "query_response_hit_ids",
        "retriever": "query_attributes.retriever",
        "segment": {"path": "application", "default": "default"},
        "context_k": None,
        "query": "user_query",
    },
    "feedback": {
        "query_id": "query_id",
        "timestamp": {"path": "timestamp", "naive": "utc"},
        "chunk_id": "event_attributes.object.object_id",
        "signal": {"path": "action_name", "values": {"click": "click"}, "others": "ignore"},
        "grade": None,
        "dwell_ms": None,
    },
}
"""OpenSearch User Behavior Insights 1.3: ``ubi_queries`` and ``ubi_events`` records
(a time without an offset is read as UTC, as OpenSearch stores it)."""

PRESETS: dict[str, dict[str, Any]] = {"ubi": UBI}


def _merge(base: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for role in ("queries", "feedback"):
        if role in change:
            given = change[role]
            out[role] = {**base.get(role, {}), **given} if isinstance(given, dict) else given
    for key, value in change.items():
        if key not in ("queries", "feedback", "extends"):
            out[key] = value
    return out


def parse_mapping(document: object, where: str) -> InputMapping:
    """Validate a decoded mapping document; ConfigError names each problem and ``where``."""
    if not isinstance(document, dict):
        raise ConfigError(
            f"input mapping {where}: expected an object with 'queries' and 'feedback'"
        )
    extends = document.get("extends")
    if extends is not None:
        if extends not in PRESETS:
            raise ConfigError(
                f"input mapping {where}: extends {extends!r}, but the presets are "
                + ", ".join(sorted(PRESETS))
            )
        document = _merge(PRESETS[extends], document)
    try:
        return InputMapping.model_validate(document)
    except ValidationError as error:
        problems = []
        for item in error.errors():
            at = ".".join(str(p) for p in item["loc"])
            message = str(item["msg"]).removeprefix("Value error, ")
            problems.append(f"{at or '(mapping)'}: {message}")
        raise ConfigError(f"input mapping {where}: " + "; ".join(problems)) from None


def load_mapping(spec: str | None) -> InputMapping | None:
    """The mapping named by ``--input-mapping``: None (the contract's shapes), a preset's
    name, or a YAML or JSON file. ConfigError says what is wrong and where."""
    if not spec:
        return None
    if spec in PRESETS:
        return parse_mapping(PRESETS[spec], f"preset {spec!r}")
    path = FilePath(spec)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(
            f"input mapping {spec}: cannot read it ({error.strerror}); give a YAML or JSON "
            f"file, or a preset: {', '.join(sorted(PRESETS))}"
        ) from None
    import yaml  # noqa: PLC0415 - only for a mapping file

    try:
        document = yaml.safe_load(text)  # JSON is YAML too
    except yaml.YAMLError as error:
        raise ConfigError(f"input mapping {spec}: not valid YAML or JSON ({error})") from None
    return parse_mapping(document, spec)
