"""Event models: every contract limit, reason codes, readable messages."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from service.errors import EventError
from service.stream.events import MAX_EVENT_BYTES, decode_feedback, decode_query
from service.stream.labels import LabelPolicy

QUERY = {
    "query_id": "7f3c9a",
    "timestamp": "2026-12-02T08:00:00.123Z",
    "retriever": "hybrid-v7",
    "results": ["doc-1#3", {"chunk_id": "doc-9#0", "score": 0.83}, "doc-4#2"],
    "context_k": 5,
    "segment": "support-kb",
}
FEEDBACK = {
    "query_id": "7f3c9a",
    "timestamp": "2026-12-02T08:00:09Z",
    "chunk_id": "doc-9#0",
    "signal": "click",
    "dwell_ms": 42000,
}


def raw(base: dict[str, object], **changes: object) -> bytes:
    event = dict(base)
    for key, value in changes.items():
        if value is ...:
            event.pop(key)
        else:
            event[key] = value
    return json.dumps(event).encode()


def test_contract_example_query() -> None:
    event = decode_query(raw(QUERY, extra_field="ignored"))
    assert event.chunk_ids() == ["doc-1#3", "doc-9#0", "doc-4#2"]
    assert event.timestamp_ms == int(datetime(2026, 12, 2, 8, tzinfo=UTC).timestamp() * 1000) + 123
    assert (event.retriever, event.segment, event.context_k) == ("hybrid-v7", "support-kb", 5)


@pytest.mark.parametrize(
    ("value", "expected_ms"),
    [
        (1796198400, 1796198400000),
        (1796198400.5, 1796198400500),
        ("2026-12-02T09:00:00+01:00", 1796198400000),
    ],
)
def test_timestamps_epoch_seconds_and_offsets(value: object, expected_ms: int) -> None:
    assert decode_query(raw(QUERY, timestamp=value)).timestamp_ms == expected_ms


def test_defaults_segment_and_accepts_empty_results() -> None:
    event = decode_query(raw(QUERY, segment=..., context_k=..., results=[]))
    assert (event.segment, event.context_k, event.chunk_ids()) == ("default", None, [])
    assert decode_query(raw(QUERY, segment=None)).segment == "default"


@pytest.mark.parametrize(
    ("payload", "reason", "fragment"),
    [
        (b"\x00\xffgarbage", "invalid_json", "not valid JSON"),
        (b'{"query_id": "a", "timest', "invalid_json", "truncated"),
        (b"[1, 2, 3]", "not_an_object", "object"),
        (raw(QUERY, query_id=...), "missing_query_id", "query_id"),
        (raw(QUERY, query_id=""), "invalid_query_id", "at least 1"),
        (raw(QUERY, query_id="x" * 201), "invalid_query_id", "at most 200"),
        (raw(QUERY, query_id=17), "invalid_query_id", "string"),
        (raw(QUERY, timestamp="2026-12-02T08:00:00"), "naive_timestamp", "UTC offset"),
        (raw(QUERY, timestamp="yesterday"), "invalid_timestamp", "timestamp"),
        (raw(QUERY, timestamp=1796198400123), "invalid_timestamp", "timestamp"),
        (raw(QUERY, retriever="r" * 101), "invalid_retriever", "at most 100"),
        (raw(QUERY, results="doc-1"), "invalid_results", "array"),
        (raw(QUERY, results=["ok"] * 1001), "invalid_results", "at most 1000"),
        (raw(QUERY, results=["c" * 501]), "invalid_results", "results.0"),
        (raw(QUERY, results=[{"score": 1.0}]), "invalid_results", "chunk_id"),
        (raw(QUERY, context_k=-1), "invalid_context_k", "integer >= 0"),
        (raw(QUERY, context_k=True), "invalid_context_k", "integer"),
        (raw(QUERY, context_k="5"), "invalid_context_k", "integer"),
    ],
)
def test_bad_query_events(payload: bytes, reason: str, fragment: str) -> None:
    with pytest.raises(EventError) as caught:
        decode_query(payload)
    assert caught.value.reason == reason
    assert fragment in str(caught.value)


def test_oversized_event_is_rejected_before_parsing() -> None:
    with pytest.raises(EventError) as caught:
        decode_query(b" " * (MAX_EVENT_BYTES + 1))
    assert caught.value.reason == "oversized"


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"signal": "like"}, "unknown_signal"),
        ({"signal": "judgment"}, "judgment_without_grade"),
        ({"signal": "judgment", "grade": 4}, "invalid_grade"),
        ({"signal": "judgment", "grade": 2.5}, "invalid_grade"),
        ({"chunk_id": ""}, "invalid_chunk_id"),
        ({"chunk_id": "c" * 501}, "invalid_chunk_id"),
        ({"dwell_ms": -5}, "invalid_dwell_ms"),
        ({"timestamp": ...}, "missing_timestamp"),
    ],
)
def test_bad_feedback_events(changes: dict[str, object], reason: str) -> None:
    with pytest.raises(EventError) as caught:
        decode_feedback(raw(FEEDBACK, **changes))
    assert caught.value.reason == reason


@pytest.mark.parametrize(
    ("changes", "grade"),
    [
        ({"dwell_ms": 29999}, 1),
        ({"dwell_ms": 30000}, 2),
        ({"dwell_ms": ...}, 1),
        ({"signal": "citation", "dwell_ms": ...}, 2),
        ({"signal": "judgment", "grade": 0}, 0),
        ({"signal": "judgment", "grade": 3}, 3),
    ],
)
def test_default_label_policy(changes: dict[str, object], grade: int) -> None:
    assert LabelPolicy().grade(decode_feedback(raw(FEEDBACK, **changes))) == grade


def test_label_policy_is_configurable() -> None:
    policy = LabelPolicy(click=0, long_click=3, long_click_dwell_ms=10_000, citation=1)
    assert policy.grade(decode_feedback(raw(FEEDBACK, dwell_ms=9_999))) == 0
    assert policy.grade(decode_feedback(raw(FEEDBACK, dwell_ms=10_000))) == 3
    assert policy.grade(decode_feedback(raw(FEEDBACK, signal="citation"))) == 1
