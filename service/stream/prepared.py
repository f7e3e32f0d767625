"""What the join takes of a batch that does not depend on its state, made before the
per-record loop: the :class:`Prepared` columns (one declaration, used by the join, by
``replay``, which gathers a batch's columns as it reads, and by its reader process,
which makes them while the main process joins and sends them as they are, and by the
Kafka consumer through :meth:`Pipeline.take`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from service.stream.events import AuditEvent, FeedbackEvent, QueryEvent
from service.stream.hashes import hashed_queries
from service.stream.labels import SOURCE_BITS
from service.stream.topics import Topic

Record = tuple[Topic, int, QueryEvent | FeedbackEvent | AuditEvent]
"""A valid event of one partition as :meth:`Pipeline.take` takes it: topic, offset, event."""


class Prepared(NamedTuple):
    """What the join takes of a batch's events that does not depend on its state, in
    columns: per query (in batch order) its chunk ids' hashes packed, and the positions
    (among the queries) of those with a repeated id (``hashes.hashed_queries``); per
    event its query id as bytes, and for feedback the hash of its chunk id, its grade and
    the bit of its source when that grade is relevant (>= 1; see
    :data:`~service.stream.labels.SOURCE_BITS`; both 0 for a query)."""

    bodies: list[bytes]
    repeats: set[int]
    keys: list[bytes]
    chunks: list[int]
    levels: list[int]
    sources: list[int]

    @classmethod
    def empty(cls) -> Prepared:
        """Columns of no event (to be extended)."""
        return cls([], set(), [], [], [], [])

    def extend(self, more: Prepared) -> None:
        """Append the columns of the events that follow these (``replay`` gathers a
        batch's columns a chunk at a time)."""
        base = len(self.bodies)
        self.bodies.extend(more.bodies)
        self.repeats.update(base + position for position in more.repeats)
        self.keys.extend(more.keys)
        self.chunks.extend(more.chunks)
        self.levels.extend(more.levels)
        self.sources.extend(more.sources)

    def clear(self) -> None:
        """Empty every column (once the batch was taken)."""
        for column in self:
            column.clear()


def prepare(
    events: Sequence[QueryEvent | FeedbackEvent | AuditEvent], grade: Callable[[FeedbackEvent], int]
) -> Prepared:
    """The :class:`Prepared` columns of a batch's events (``grade``: the label policy's)."""
    # (an audit has columns of no use, as a feedback event's: the pipeline takes a batch
    # with audits apart and makes the columns of the rest anew)
    bodies, repeats = hashed_queries(
        [e.results for e in events if type(e) is not FeedbackEvent and type(e) is not AuditEvent]  # type: ignore[union-attr]
    )
    feedback = [type(e) is FeedbackEvent for e in events]
    levels = [grade(e) if f else 0 for e, f in zip(events, feedback, strict=True)]  # type: ignore[arg-type]
    bits = SOURCE_BITS
    return Prepared(
        bodies,
        repeats,
        [e.query_id.encode() for e in events],
        [hash(e.chunk_id) if f else 0 for e, f in zip(events, feedback, strict=True)],  # type: ignore[union-attr]
        levels,
        # (a query's level is 0, so only relevant feedback has a source bit)
        [bits[e.signal] if g >= 1 else 0 for e, g in zip(events, levels, strict=True)],  # type: ignore[union-attr]
    )
