"""The record step (``take_records``), as the Kafka consumer and ``replay`` both use it:
decode errors, tombstones and skipped records are counted as met, the valid records are
taken as one batch, and every failure comes back in input order, whatever its kind."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from service.errors import EventError
from service.stream.events import FeedbackEvent, QueryEvent
from service.stream.pipeline import Pipeline, PipelineConfig
from service.stream.prepared import prepare
from service.stream.records import take_records
from service.stream.topics import FEEDBACK, QUERIES, Topic
from tests.unit.stream.test_join import JOIN, KS, NOW, T0, feedback_event, query_event

FUTURE = NOW + 86_400_000


def _decode(value: Any) -> QueryEvent | FeedbackEvent | None:
    """A test decoder: an event is itself, "skip" is skipped, anything else is bad."""
    if value == "skip":
        return None
    if isinstance(value, QueryEvent | FeedbackEvent):
        return value
    raise EventError("invalid_json", f"not an event: {value!r}")


def _pipeline() -> Pipeline:
    pipeline = Pipeline(PipelineConfig(join=JOIN, ks=KS), now_ms=lambda: NOW)
    pipeline.assign(0)
    return pipeline


def test_failures_of_every_kind_come_back_in_input_order() -> None:
    pipeline = _pipeline()
    records: list[tuple[Topic, int, Any]] = [
        (QUERIES, 0, query_event("q1", T0)),
        (QUERIES, 1, query_event("late-guard", FUTURE)),  # refused when taken
        (FEEDBACK, 0, b"not json"),
        (QUERIES, 2, None),  # a tombstone
        (FEEDBACK, 1, "skip"),
        (FEEDBACK, 2, feedback_event("q1", T0 + 1_000, "a")),
        (FEEDBACK, 3, feedback_event("q1", FUTURE, "b")),  # refused when taken
        (QUERIES, 3, query_event("q2", T0)),
    ]
    failures = take_records(pipeline, 0, records, _decode)
    assert [(at, error.reason) for at, error in failures] == [
        (1, "future_timestamp"),
        (2, "invalid_json"),
        (3, "empty"),
        (6, "future_timestamp"),
    ]
    counts = pipeline.counts
    assert counts.invalid[QUERIES, "empty"] == 1
    assert counts.invalid[FEEDBACK, "invalid_json"] == 1
    assert counts.invalid[QUERIES, "future_timestamp"] == 1
    assert counts.invalid[FEEDBACK, "future_timestamp"] == 1
    assert counts.ignored[FEEDBACK] == 1
    assert counts.events[QUERIES] == 4
    assert counts.events[FEEDBACK] == 3  # (the skipped record is not an event)
    stream = pipeline.streams[0]
    assert sorted(stream.pending) == [b"q1", b"q2"]
    assert stream.next_offset[QUERIES] == 4
    assert stream.next_offset[FEEDBACK] == 4


def test_events_decoded_already_are_taken_as_they_are_with_their_columns() -> None:
    """A chunk decoded at once enters with no decode and its columns made: the same as
    the same records decoded one by one."""
    events = [
        query_event("q1", T0),
        feedback_event("q1", T0 + 1_000, "a"),
        query_event("q2", FUTURE),
        query_event("q3", T0, results=("a", "b", "a")),
    ]
    topics = [QUERIES, FEEDBACK, QUERIES, QUERIES]
    records = [(t, i, e) for i, (t, e) in enumerate(zip(topics, events, strict=True))]
    decoded, by_one = _pipeline(), _pipeline()
    columns = prepare(events, decoded.config.labels.grade)
    first = take_records(decoded, 0, records, None, columns)
    second = take_records(by_one, 0, records, _decode)
    assert [(at, e.reason) for at, e in first] == [(at, e.reason) for at, e in second]
    assert [at for at, _ in first] == [2]
    assert asdict(decoded.counts) == asdict(by_one.counts)
    assert decoded.streams[0].pending == by_one.streams[0].pending
    assert decoded.streams[0].labels == by_one.streams[0].labels
