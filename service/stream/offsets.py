"""What to commit for a partition: the lowest offsets still needed, plus restart markers.

Kafka stores a metadata string with each committed offset. Ours records, per topic
partition, ``published_through`` (the end of the last published window of that
partition, in ms), ``counted_through`` (the position up to which records were
already counted on ``/metrics``) and ``closed`` (the partition's progress: every window
of it ending at or before this has closed and is published with this commit, so an
absent window up to there means no traffic), and ``early`` (every early window of it
ending at or before this was made and published: the detector's progress). On restart
the re-read from the committed offset rebuilds every unpublished window; queries of
windows at or before the marker are skipped (and windows at or before ``early`` get no
early aggregate again), and re-read records below ``counted_through`` are not counted again.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from service.stream.join import PartitionStream
from service.stream.topics import FEEDBACK, QUERIES, Topic
from service.stream.watermark import NEVER

METADATA_VERSION = 1


MAX_WAITING_LISTED = 256
"""Waiting feedback listed in a commit (the metadata must stay below Kafka's 4 KB)."""


@dataclass(frozen=True, slots=True)
class Restart:
    """What a partition starts from after an assignment."""

    published_through_ms: int = NEVER
    counted_from: tuple[int, int] = (0, 0)
    waiting_offsets: frozenset[int] = frozenset()
    closed_through_ms: int = NEVER
    early_through_ms: int = NEVER


class Markers(NamedTuple):
    """The markers of one topic partition's commit."""

    published_through_ms: int
    counted_through: int
    waiting: frozenset[int]
    closed_through_ms: int
    early_through_ms: int = NEVER


NO_MARKERS = Markers(NEVER, 0, frozenset(), NEVER)


def encode_metadata(
    published_through_ms: int,
    counted_through: int,
    waiting: list[int] | None = None,
    closed_through_ms: int = NEVER,
    early_through_ms: int = NEVER,
) -> str:
    """The commit metadata string of one topic partition (compact JSON, under 4 KB).

    ``waiting`` lists the offsets of feedback still waiting for its query: counted as
    events, not yet as matched or unmatched. They are delta-encoded; beyond
    ``MAX_WAITING_LISTED`` the rest are not listed (then not counted as unmatched after
    a restart: an undercount, never a double count).
    """
    data: dict[str, object] = {
        "v": METADATA_VERSION,
        "published_through": published_through_ms,
        "counted": counted_through,
    }
    if closed_through_ms != NEVER:
        data["closed"] = closed_through_ms
    if early_through_ms != NEVER:
        data["early"] = early_through_ms
    if waiting:
        listed = waiting[:MAX_WAITING_LISTED]
        data["waiting"] = [listed[0]] + [b - a for a, b in itertools.pairwise(listed)]
    return json.dumps(data, separators=(",", ":"))


def decode_metadata(text: str | None) -> Markers:
    """The markers of a commit (none for metadata written by something else)."""
    if not text:
        return NO_MARKERS
    try:
        data = json.loads(text)
        offsets, total = [], 0
        for delta in data.get("waiting", []):
            total += int(delta)
            offsets.append(total)
        return Markers(
            int(data["published_through"]),
            int(data["counted"]),
            frozenset(offsets),
            int(data.get("closed", NEVER)),
            int(data.get("early", NEVER)),
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return NO_MARKERS  # written by something else: start conservatively


def restart_from(queries_metadata: str | None, feedback_metadata: str | None) -> Restart:
    """Combine the markers stored with the two topics' commits of one partition."""
    q = decode_metadata(queries_metadata)
    fb = decode_metadata(feedback_metadata)
    return Restart(
        max(q.published_through_ms, fb.published_through_ms),
        (q.counted_through, fb.counted_through),
        fb.waiting,
        max(q.closed_through_ms, fb.closed_through_ms),
        max(q.early_through_ms, fb.early_through_ms),
    )


def commit_plan(
    stream: PartitionStream, started: Mapping[Topic, int] | None = None
) -> dict[Topic, tuple[int, str]]:
    """Topic (QUERIES/FEEDBACK) -> (offset to commit, metadata) for one partition.

    A topic on which this process has read nothing commits the offset it started from
    (``started``), so that the markers, the progress above all, move on for a silent
    partition too; without one it is left out (its old commit stands).
    """
    needed = stream.commit_offsets()
    plan = {}
    for topic in (QUERIES, FEEDBACK):
        offset = needed[topic]
        if offset < 0:
            offset = (started or {}).get(topic, -1)
        if offset < 0:
            continue
        counted = stream.counted_through(topic)
        waiting = stream.unclassified_offsets() if topic == FEEDBACK else None
        metadata = encode_metadata(
            stream.published_through_ms,
            counted,
            waiting,
            stream.closed_through_ms,
            stream.early_through_ms,
        )
        plan[topic] = (offset, metadata)
    return plan
