"""The simulator's output: events as they would be produced to Kafka, queries with their
hidden truth, and the replay format (JSON lines) they are written in."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

Topic = Literal["queries", "feedback"]


@dataclass(frozen=True, slots=True)
class SimEvent:
    """One event as it would be produced to Kafka: topic, key, JSON-ready body, times."""

    topic: Topic
    key: str
    """The query id (both topics are keyed by it)."""
    event: dict[str, object]
    timestamp_ms: int
    """Event time."""
    arrival_ms: int
    """Event time plus ingestion lag; the stream is ordered by it."""


@dataclass(frozen=True, slots=True)
class SimQuery:
    """One query with its hidden ground truth and all of its events (the query event first)."""

    query_id: str
    timestamp_ms: int
    retriever: str
    segment: str
    results: tuple[str, ...]
    relevant: Mapping[str, int]
    """Ground truth: relevant chunk id -> grade 1..3 (never emitted)."""
    context_k: int
    """The ``context_k`` its query event logs (the first results the answer was built from)."""
    events: tuple[SimEvent, ...]


def encode(event: SimEvent) -> bytes:
    """The event body as compact UTF-8 JSON (the Kafka message value)."""
    return json.dumps(event.event, separators=(",", ":")).encode()


class _TextSink(Protocol):
    def write(self, text: str, /) -> object: ...


def write_jsonl(
    events: Iterable[SimEvent], path_or_file: str | os.PathLike[str] | _TextSink
) -> int:
    """Write the replay format, ``{"topic": ..., "event": {...}}`` per line; return the count."""
    if isinstance(path_or_file, str | os.PathLike):
        with open(path_or_file, "w", encoding="utf-8") as sink:
            return write_jsonl(events, sink)
    count = 0
    for event in events:
        line = json.dumps({"topic": event.topic, "event": event.event}, separators=(",", ":"))
        path_or_file.write(line + "\n")
        count += 1
    return count
