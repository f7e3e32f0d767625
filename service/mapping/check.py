"""``check-input``: how well a sample of a user's records maps onto the contract's events.

Per topic: how many records map cleanly, how many the mapping skips, and every problem
(its reason code, the path it concerns, how often) with one example; and the share of
the sample's feedback whose query is in the sample too (a low share means the join will
find few labels: different ids, or a sample too short to hold both).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from service.errors import EventError
from service.mapping.json_records import loads
from service.mapping.mapper import Mapper
from service.mapping.spec import InputMapping
from service.stream.events import AuditEvent, FeedbackEvent, QueryEvent
from service.stream.topics import FEEDBACK, QUERIES, Topic

ROLE = {QUERIES: "queries", FEEDBACK: "feedback"}


@dataclass
class Problem:
    """One kind of problem: a reason code and the path it concerns."""

    reason: str
    path: str
    count: int = 0
    example_at: str = ""
    example: str = ""


@dataclass
class TopicCheck:
    """What the sample of one topic gave."""

    read: int = 0
    mapped: int = 0
    skipped: int = 0
    problems: dict[tuple[str, str], Problem] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "read": self.read,
            "mapped": self.mapped,
            "skipped": self.skipped,
            "problems": [
                {
                    "reason": p.reason,
                    "path": p.path,
                    "count": p.count,
                    "example": {"at": p.example_at, "error": p.example},
                }
                for p in sorted(self.problems.values(), key=lambda p: (-p.count, p.reason))
            ],
        }


@dataclass
class InputCheck:
    """The whole report."""

    mapping: str
    topics: dict[Topic, TopicCheck] = field(
        default_factory=lambda: {QUERIES: TopicCheck(), FEEDBACK: TopicCheck()}
    )
    feedback_joined: int = 0

    @property
    def mapped(self) -> int:
        return sum(t.mapped for t in self.topics.values())

    @property
    def join_share(self) -> float | None:
        feedback = self.topics[FEEDBACK].mapped
        return self.feedback_joined / feedback if feedback else None

    def to_json(self, names: tuple[str, str]) -> dict[str, Any]:
        return {
            "mapping": self.mapping,
            "topics": {names[t]: self.topics[t].to_json() for t in (QUERIES, FEEDBACK)},
            "feedback_joining_a_query": self.join_share,
            "maps": self.mapped > 0,
        }

    def render(self, names: tuple[str, str]) -> str:
        lines = [f"input mapping: {self.mapping}"]
        for topic in (QUERIES, FEEDBACK):
            t = self.topics[topic]
            bad = t.read - t.mapped - t.skipped
            lines.append(
                f"{names[topic]} ({ROLE[topic]}): {t.read} records read, {t.mapped} map cleanly"
                f"{_share(t.mapped, t.read)}, {t.skipped} skipped by the mapping, {bad} bad"
            )
            for p in sorted(t.problems.values(), key=lambda p: (-p.count, p.reason)):
                lines.append(
                    f"  {p.count:>7}  {p.reason}{f' at {p.path!r}' if p.path else ''}"
                    f"{_share(p.count, t.read)}"
                )
                lines.append(f"           e.g. {p.example_at}: {p.example}")
        share = self.join_share
        lines.append(
            "feedback whose query is in the sample: "
            + ("no feedback mapped" if share is None else f"{share:.1%}")
        )
        if not self.mapped:
            lines.append("nothing maps: check the mapping's paths against the records above")
        return "\n".join(lines)


def _share(n: int, of: int) -> str:
    return f" ({n / of:.1%})" if of else ""


def check_records(
    records: Iterable[tuple[Topic | None, str, bytes | Any]],
    mapping: InputMapping | None,
    sample: int | None = None,
) -> InputCheck:
    """Map every record: ``(topic, where, raw bytes or a decoded record)``, at most
    ``sample`` per topic. A record of unknown topic (None) is read as a query or a
    feedback record by which mapping finds more of its required fields in it."""
    mapper = Mapper(mapping if mapping is not None else InputMapping(name="contract"))
    report = InputCheck(mapping.name if mapping is not None else "the contract's shapes")
    query_ids: set[str] = set()
    feedback_ids: list[str] = []
    for given, where, record in records:
        failed: EventError | None = None
        try:  # read as run and replay read them
            decoded = loads(record) if isinstance(record, bytes | str) else record
        except EventError as error:
            decoded, failed = None, error
        topic = given if given is not None else mapper.topic_of(decoded)
        t = report.topics[topic]
        if sample is not None and t.read >= sample:
            if all(other.read >= sample for other in report.topics.values()):
                break  # (the records are read lazily: stop reading)
            continue
        t.read += 1
        if failed is not None:
            _note(t, failed, "", where)
            continue
        try:
            event: QueryEvent | FeedbackEvent | AuditEvent | None
            event = mapper.query(decoded) if topic == QUERIES else mapper.feedback(decoded)
        except EventError as error:
            _note(t, error, _path_of(mapper, topic, error.reason), where)
            continue
        if event is None:
            t.skipped += 1
            continue
        t.mapped += 1
        if isinstance(event, QueryEvent):
            query_ids.add(event.query_id)
        else:
            feedback_ids.append(event.query_id)
    report.feedback_joined = sum(1 for q in feedback_ids if q in query_ids)
    return report


def _path_of(mapper: Mapper, topic: Topic, reason: str) -> str:
    role = mapper.queries if topic == QUERIES else mapper.feedback_role
    f = role.field_of(reason)
    if f is None or f.spec.path is None:
        return ""
    return f.spec.path


def _note(t: TopicCheck, error: EventError, path: str, where: str) -> None:
    key = (error.reason, path)
    problem = t.problems.get(key)
    if problem is None:
        problem = t.problems[key] = Problem(
            error.reason, path, example_at=where, example=str(error)
        )
    problem.count += 1
