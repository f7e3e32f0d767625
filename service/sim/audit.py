"""Simulated audit judges: thorough grades of the sampled queries, hours after them.

The simulator knows each query's ground truth, so it can play the user's judging pipeline
(contract: "Audit sample and audited estimates"). A query is audited when it is in the
audit sample (:func:`service.audit.in_audit_sample`, the rule every replica applies); each
:class:`JudgeModel` then audits a ``coverage`` share of the sampled queries. A judge grades
every retrieved chunk (all results: ``results_per_query`` is at least the largest k of
interest) and finds each truly relevant chunk that was not retrieved with probability
``find_unretrieved``. A careful judge gives every chunk it grades its true grade (0 when not
relevant); with ``confusion_rate`` it gets relevance wrong for a graded chunk: a relevant
chunk graded 0, a non-relevant one graded 1 or 2. A relevant chunk it keeps relevant keeps
its true grade.

Every draw comes from a ``random.Random`` of its own per (seed, query, judge), never from the
simulator's: turning auditing on, or adding a judge, changes no other event.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from service.audit import in_audit_sample
from service.errors import ConfigError
from service.sim.clicks import check_rate
from service.times import DAY_MS, HOUR_MS, MINUTE_MS, rfc3339_millis

AUDIT_WINDOW_MS = 7 * DAY_MS
"""Audits must come before this long after the query (the contract's ``AUDIT_WINDOW``)."""


@dataclass(frozen=True, slots=True)
class JudgeModel:
    """One judge of the audit sample: a human team or an LLM judge, and how it errs."""

    name: str
    """Emitted as the audit's ``judge``, e.g. ``human:careful`` or ``llm:judge``."""
    confusion_rate: float = 0.0
    """Per graded chunk, the probability of getting relevance wrong."""
    find_unretrieved: float = 1.0
    """Probability of finding (and grading) each truly relevant chunk that was not retrieved."""
    coverage: float = 1.0
    """Share of the sampled queries this judge audits."""
    delay_ms: tuple[int, int] = (10 * MINUTE_MS, 6 * HOUR_MS)
    """The audit's time after the query, uniform in these bounds (below 7 days)."""

    def __post_init__(self) -> None:
        if not 1 <= len(self.name) <= 100:
            raise ConfigError(f"a judge's name must have 1..100 characters, got {self.name!r}")
        for name in ("confusion_rate", "find_unretrieved", "coverage"):
            check_rate(f"judge {self.name!r}: {name}", getattr(self, name))
        low, high = self.delay_ms
        if not 0 <= low <= high < AUDIT_WINDOW_MS:
            raise ConfigError(
                f"judge {self.name!r}: delay_ms must be (low, high) with "
                f"0 <= low <= high < 7 days, got {self.delay_ms!r}"
            )


CAREFUL_JUDGE = JudgeModel("human:careful")
"""The judge of a run that samples queries but names none: thorough and never wrong."""


class Audit(NamedTuple):
    """One judge's audit of one query: when (after the query) and its grades."""

    judge: str
    delay_ms: int
    grades: dict[str, int]
    """Chunk id -> grade 0..3, the retrieved chunks in rank order, then those found."""


def judge_query(
    judge: JudgeModel,
    rng: random.Random,
    results: Sequence[str],
    relevant: Mapping[str, int],
) -> Audit:
    """The audit ``judge`` makes of a query with these results and this ground truth."""
    delay_ms = rng.randint(*judge.delay_ms)
    grades: dict[str, int] = {}

    def grade(chunk: str) -> int:
        truth = relevant.get(chunk, 0)
        if judge.confusion_rate == 0.0 or rng.random() >= judge.confusion_rate:
            return truth
        return 0 if truth else rng.randint(1, 2)

    for chunk in results:
        if chunk not in grades:  # a repeated id is graded once
            grades[chunk] = grade(chunk)
    for chunk in sorted(set(relevant) - set(results)):  # sorted: set order varies by process
        if rng.random() < judge.find_unretrieved:
            grades[chunk] = grade(chunk)
    return Audit(judge.name, delay_ms, grades)


def audit_rng(seed: int, query_id: str, judge: str) -> random.Random:
    """The random source of one judge's audit of one query, apart from every other draw."""
    return random.Random(f"{seed}:{query_id}:audit:{judge}")


class AuditModel(Protocol):
    """What the audits of a run depend on (``SimulationConfig`` has it all)."""

    @property
    def seed(self) -> int: ...
    @property
    def audit_rate(self) -> float: ...
    @property
    def judges(self) -> tuple[JudgeModel, ...]: ...


def simulate_audits(
    config: AuditModel, query_id: str, results: Sequence[str], relevant: Mapping[str, int]
) -> Iterator[tuple[Audit, random.Random]]:
    """Each judge's audit of the query (none outside the sample or past a judge's
    coverage), with the judge's random source for what the caller still draws (the lag);
    no judge named: :data:`CAREFUL_JUDGE`."""
    rate = config.audit_rate
    if rate == 0.0 or not in_audit_sample(query_id, rate):
        return
    for judge in config.judges or (CAREFUL_JUDGE,):
        rng = audit_rng(config.seed, query_id, judge.name)
        if judge.coverage < 1.0 and rng.random() >= judge.coverage:
            continue
        yield judge_query(judge, rng, results, relevant), rng


def audit_events(
    config: AuditModel,
    query_id: str,
    timestamp_ms: int,
    results: Sequence[str],
    relevant: Mapping[str, int],
    *,
    lag_ms: Callable[[random.Random], int],
) -> Iterator[tuple[dict[str, object], int, int]]:
    """(body, event time, arrival time) of each audit event of one query, for the feedback
    topic; ``lag_ms`` draws the ingestion lag from the audit's own random source."""
    for audit, rng in simulate_audits(config, query_id, results, relevant):
        audit_ms = timestamp_ms + audit.delay_ms
        body: dict[str, object] = {
            "query_id": query_id,
            "timestamp": rfc3339_millis(audit_ms),
            "signal": "audit",
            "judge": audit.judge,
            "grades": audit.grades,
        }
        yield body, audit_ms, audit_ms + lag_ms(rng)
