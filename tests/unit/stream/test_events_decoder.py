"""The msgspec decoder against the pydantic models it replaced (``pydantic_events.py``).

Events drawn at random, each valid or with one fault (a field dropped, of another JSON
type, too long, out of range, a naive or malformed time, null, an extra field): both
decoders must accept the same events with the same values, and reject the others with
the same reason code. (With several faults in one event the two may name different
ones: the old one named the deepest, the new one names the first in the document.)
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from service.errors import EventError
from service.stream.events import decode_feedback, decode_query, feedback_from, query_from
from tests.unit.stream import pydantic_events as old

TEXT = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=8)
JSON_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**20), 10**20),
    st.floats(allow_nan=False, allow_infinity=False),
    TEXT,
    st.lists(st.integers(), max_size=2),
    st.dictionaries(TEXT, st.integers(), max_size=2),
)
VALID_TIMESTAMPS = st.one_of(
    st.integers(-62135596800, 253402300799),
    st.floats(-6.2e10, 2.5e11),
    st.sampled_from(
        [
            "2026-12-02T08:00:00Z",
            "2026-12-02T08:00:00.123456Z",
            "2026-12-02T08:00:00.987+00:00",
            "2026-12-02 08:00:00+01:00",
            "2026-12-02T08:00:00-05:30",
            "9999-12-31T23:59:59Z",
        ]
    ),
)
TIMESTAMPS = st.one_of(
    VALID_TIMESTAMPS,
    st.integers(-(10**12), 10**12),
    st.floats(-7e10, 3e11, allow_nan=False),
    st.sampled_from(
        [
            "2026-12-02T08:00:00.1234567Z",
            "2026-12-02T08:00:00,5Z",
            "2026-12-02_08:00:00Z",
            "2026-12-02T08Z",
            "2026-12-02t08:00:00z",
            "2026-12-02T08:00:00",
            "2026-12-02T08:00Z",
            "2026-12-02",
            "2026-02-30T08:00:00Z",
            "2026-12-02T24:00:00Z",
            "2026-12-02T08:00:60Z",
            "0001-01-01T00:00:00Z",
            "yesterday",
            "1796198400",
            "",
        ]
    ),
)
IDS = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=0, max_size=3)


def _long(n: int) -> st.SearchStrategy[str]:
    return st.sampled_from(["x" * n, "x" * (n + 1), "é" * n, "é" * (n + 1)])


@st.composite
def queries(draw: st.DrawFn) -> dict[str, Any]:
    results = draw(
        st.lists(
            st.one_of(
                TEXT,
                st.fixed_dictionaries(
                    {"chunk_id": TEXT},
                    optional={"score": st.one_of(st.none(), st.floats(allow_nan=False))},
                ),
            ),
            max_size=4,
        )
    )
    event: dict[str, Any] = {
        "query_id": draw(TEXT),
        "timestamp": draw(VALID_TIMESTAMPS),
        "retriever": draw(TEXT),
        "results": results,
    }
    if draw(st.booleans()):
        event["context_k"] = draw(st.one_of(st.none(), st.integers(0, 50)))
    if draw(st.booleans()):
        event["segment"] = draw(st.one_of(st.none(), TEXT))
    return _with_one_fault(draw, event, LIMITS_Q)


@st.composite
def feedbacks(draw: st.DrawFn) -> dict[str, Any]:
    signal = draw(st.sampled_from(["click", "citation", "judgment"]))
    event: dict[str, Any] = {
        "query_id": draw(TEXT),
        "timestamp": draw(VALID_TIMESTAMPS),
        "chunk_id": draw(TEXT),
        "signal": signal,
    }
    if signal == "judgment" or draw(st.booleans()):
        event["grade"] = draw(st.integers(0, 3))
    if draw(st.booleans()):
        event["dwell_ms"] = draw(st.one_of(st.none(), st.integers(0, 10**6)))
    return _with_one_fault(draw, event, LIMITS_F)


BAD_VALUES = {
    "timestamp": TIMESTAMPS,
    "signal": st.sampled_from(["like", "Click", "judgment", ""]),
    "grade": st.integers(-1, 4),
    "dwell_ms": st.integers(-(10**20), 10**20),
    "context_k": st.integers(-(10**20), 10**20),
    "results": st.sampled_from(
        [["r"] * 1000, ["r"] * 1001, [5], [{}], ["r", ""], [{"chunk_id": 1}]]
    ),
}
OPTIONAL = {"grade", "dwell_ms", "context_k", "segment"}
LIMITS_Q = {"query_id": 200, "retriever": 100, "segment": 100}
LIMITS_F = {"query_id": 200, "chunk_id": 500}


def _with_one_fault(draw: st.DrawFn, event: dict[str, Any], limits: dict[str, int]) -> Any:
    fault = draw(
        st.sampled_from(["none", "drop", "retype", "value", "long", "extra", "null", "whole"])
    )
    field = draw(st.sampled_from(sorted(event)))
    if fault == "value":  # a value of the right JSON type that breaks a rule
        name = draw(st.sampled_from([f for f in BAD_VALUES if f in event or f in OPTIONAL]))
        if name == "results" and "results" not in event:
            name = "timestamp"
        event[name] = draw(BAD_VALUES[name])
    elif fault == "drop":
        del event[field]
    elif fault == "retype":
        event[field] = draw(JSON_VALUES)
    elif fault == "long":
        name = draw(st.sampled_from(sorted(limits)))
        event[name] = draw(_long(limits[name]))
    elif fault == "extra":
        event[draw(TEXT)] = draw(JSON_VALUES)
    elif fault == "null":
        event[field] = None
    elif fault == "whole":  # not an object at all
        return draw(JSON_VALUES.filter(lambda v: not isinstance(v, dict)))
    return event


def _outcome(decode: Any, raw: bytes) -> tuple[str, Any]:
    try:
        event = decode(raw)
    except EventError as error:
        return "rejected", error.reason
    fields = {name: getattr(event, name) for name in FIELDS if hasattr(event, name)}
    if hasattr(event, "chunk_ids"):
        fields["results"] = event.chunk_ids()
    return "accepted", fields


FIELDS = (
    "query_id",
    "timestamp_ms",
    "retriever",
    "context_k",
    "segment",
    "chunk_id",
    "signal",
    "grade",
    "dwell_ms",
)


@settings(max_examples=3000, deadline=None)
@given(queries())
def test_query_events_decode_as_before(event: Any) -> None:
    raw = json.dumps(event).encode()
    assert _outcome(decode_query, raw) == _outcome(old.decode_query, raw)
    if isinstance(event, dict):  # the same event given as an object (demo, tests)
        assert _outcome(lambda _: query_from(event), raw) == _outcome(old.decode_query, raw)


@settings(max_examples=3000, deadline=None)
@given(feedbacks())
def test_feedback_events_decode_as_before(event: Any) -> None:
    raw = json.dumps(event).encode()
    assert _outcome(decode_feedback, raw) == _outcome(old.decode_feedback, raw)
    if isinstance(event, dict):
        assert _outcome(lambda _: feedback_from(event), raw) == _outcome(old.decode_feedback, raw)


@given(st.binary(max_size=40))
def test_bytes_that_are_not_json_are_rejected_alike(raw: bytes) -> None:
    assert _outcome(decode_query, raw) == _outcome(old.decode_query, raw)
