"""The record step: one partition's records through the pipeline, as the Kafka consumer
and ``replay`` both take them.

Each record is decoded; one that does not decode is counted invalid
(:meth:`Pipeline.invalid <service.stream.pipeline.Pipeline.invalid>`), one that the input
mapping skips is counted ignored (:meth:`~service.stream.pipeline.Pipeline.ignored`), and
the valid ones are taken as one batch (:meth:`~service.stream.pipeline.Pipeline.take`,
where the timestamp guard may refuse some). Every failure, a decode error or a refusal,
comes back in input order: the consumer dead-letters them, ``replay`` reports them with
their file and line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from operator import itemgetter
from typing import Any

from service.errors import EventError
from service.stream.events import AuditEvent, FeedbackEvent, QueryEvent
from service.stream.pipeline import Pipeline
from service.stream.prepared import Prepared, Record
from service.stream.topics import Topic

Decode = Callable[[Any], QueryEvent | FeedbackEvent | AuditEvent | None]
"""A record's value to its event, or None for a record that the input mapping skips;
raises EventError (with its reason code) for a value that is no valid event."""


def take_records(
    pipeline: Pipeline,
    partition: int,
    records: Iterable[tuple[Topic, int, Any]],
    decode: Decode | None,
    prepared: Prepared | None = None,
) -> list[tuple[int, EventError]]:
    """Decode, count and take ``records``, ``(topic, offset, value)`` of one partition in
    order (a value None: a record with no value, a tombstone, invalid as ``empty``);
    return ``(position in records, error)`` for each that failed, in input order.

    ``decode`` None: the values are events already, none invalid or skipped (a chunk
    of lines decoded at once), and ``records``, a sequence then, are taken as they are.
    ``prepared``: the valid events' :class:`Prepared` columns, in order, when the caller
    has them. (``records`` may be a generator: the consumer's are made as they are read,
    so that they are not all held at once, which would cost the garbage collector.)"""
    if decode is None:
        return pipeline.take(partition, records, prepared)  # type: ignore[arg-type]
    valid: list[Record] = []
    positions: list[int] = []  # of the valid records in ``records``
    failures: list[tuple[int, EventError]] = []
    for position, (topic, offset, value) in enumerate(records):
        try:
            if value is None:
                raise EventError("empty", "the record has no value (a tombstone?)")
            event = decode(value)
        except EventError as error:
            pipeline.invalid(partition, topic, offset, error.reason)
            failures.append((position, error))
            continue
        if event is None:  # the input mapping skips it
            pipeline.ignored(partition, topic, offset)
            continue
        valid.append((topic, offset, event))
        positions.append(position)
    if valid:
        refused = pipeline.take(partition, valid, prepared)
        if refused:
            failures += [(positions[at], refusal) for at, refusal in refused]
            failures.sort(key=itemgetter(0))
    return failures
