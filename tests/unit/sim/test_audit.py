"""Simulated audits: the sampled queries, judged against the ground truth the simulator knows,
from random sources of their own (turning auditing on changes no other event)."""

from __future__ import annotations

import dataclasses
import re

import pytest

from service.audit import in_audit_sample
from service.errors import ConfigError
from service.sim.audit import CAREFUL_JUDGE, JudgeModel
from service.sim.simulator import (
    HYBRID_V8,
    SimEvent,
    SimQuery,
    SimulationConfig,
    generate,
    simulate_queries,
)
from service.times import DAY_MS, HOUR_MS, MINUTE_MS, parse_aware_ms

RFC3339_MS_Z = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
RUN = SimulationConfig(duration_ms=HOUR_MS, after=HYBRID_V8, quality_drop=0.05)
AUDITED = dataclasses.replace(RUN, audit_rate=0.05)


def audits(query: SimQuery) -> list[SimEvent]:
    return [e for e in query.events if e.event.get("signal") == "audit"]


@pytest.fixture(scope="module")
def audited() -> list[SimQuery]:
    return list(simulate_queries(AUDITED))


def test_only_sampled_queries_are_audited_and_only_with_a_rate(audited: list[SimQuery]) -> None:
    sampled = {q.query_id for q in audited if in_audit_sample(q.query_id, AUDITED.audit_rate)}
    assert {q.query_id for q in audited if audits(q)} == sampled
    assert 0.03 * len(audited) < len(sampled) < 0.07 * len(audited)
    assert all(len(audits(q)) == 1 for q in audited if q.query_id in sampled)
    assert not any(audits(q) for q in simulate_queries(RUN))


def test_a_careful_judge_grades_the_results_and_the_unretrieved_truth(
    audited: list[SimQuery],
) -> None:
    unretrieved = 0
    for query in audited:
        for event in audits(query):
            body = event.event
            assert set(body) == {"query_id", "timestamp", "signal", "judge", "grades"}
            assert body["query_id"] == event.key == query.query_id
            assert body["judge"] == CAREFUL_JUDGE.name
            assert event.topic == "feedback"
            assert RFC3339_MS_Z.match(str(body["timestamp"]))
            assert parse_aware_ms(str(body["timestamp"])) == event.timestamp_ms
            assert 10 * MINUTE_MS <= event.timestamp_ms - query.timestamp_ms <= 6 * HOUR_MS
            assert 0 <= event.arrival_ms - event.timestamp_ms <= AUDITED.max_arrival_delay_ms
            truth = {chunk: query.relevant.get(chunk, 0) for chunk in query.results}
            truth |= query.relevant  # every relevant chunk, retrieved or not
            assert body["grades"] == truth
            assert list(body["grades"])[: len(query.results)] == list(query.results)
            unretrieved += len(set(query.relevant) - set(query.results))
    assert unretrieved > 0  # the judge did find chunks the retriever missed


def test_confusion_coverage_and_finding_are_near_their_settings() -> None:
    sloppy = JudgeModel("llm:judge", confusion_rate=0.15, find_unretrieved=0.5, coverage=0.5)
    config = dataclasses.replace(
        RUN, duration_ms=30 * MINUTE_MS, audit_rate=1.0, judges=(CAREFUL_JUDGE, sloppy)
    )
    graded = wrong = judged = queries = missed = found = 0
    for query in simulate_queries(config):
        queries += 1
        by_judge = {str(e.event["judge"]): e.event["grades"] for e in audits(query)}
        assert isinstance(by_judge[CAREFUL_JUDGE.name], dict)
        grades = by_judge.get(sloppy.name)
        if not isinstance(grades, dict):
            continue
        judged += 1
        for chunk, grade in grades.items():
            truth = query.relevant.get(chunk, 0)
            graded += 1
            if (grade > 0) != (truth > 0):
                wrong += 1
                assert grade == 0 if truth else grade in {1, 2}
            elif truth:
                assert grade == truth  # a relevant chunk kept relevant keeps its grade
        for chunk in set(query.relevant) - set(query.results):
            missed += 1
            found += chunk in grades
    assert queries > 1000
    assert abs(wrong / graded - 0.15) < 0.015, wrong / graded
    assert abs(judged / queries - 0.5) < 0.05, judged / queries
    assert missed > 200
    assert abs(found / missed - 0.5) < 0.1, found / missed


def test_auditing_changes_no_other_event() -> None:
    """A run with audits is the run without them plus the audit events, in the same order."""
    judges = (CAREFUL_JUDGE, JudgeModel("llm:judge", confusion_rate=0.2, coverage=0.7))
    plain = list(generate(RUN))
    assert list(generate(dataclasses.replace(RUN, judges=judges))) == plain  # rate 0
    with_audits = list(generate(dataclasses.replace(RUN, audit_rate=0.2, judges=judges)))
    assert [e for e in with_audits if e.event.get("signal") != "audit"] == plain
    assert len(with_audits) > len(plain)


def test_a_judges_audits_do_not_depend_on_the_other_judges() -> None:
    llm = JudgeModel("llm:judge", confusion_rate=0.2)
    config = dataclasses.replace(RUN, duration_ms=20 * MINUTE_MS, audit_rate=0.3)

    def audits_of(judges: tuple[JudgeModel, ...], name: str) -> list[SimEvent]:
        run = simulate_queries(dataclasses.replace(config, judges=judges))
        return [e for q in run for e in audits(q) if e.event["judge"] == name]

    assert audits_of((llm,), llm.name) == audits_of((CAREFUL_JUDGE, llm), llm.name)
    assert audits_of((), CAREFUL_JUDGE.name) == audits_of((CAREFUL_JUDGE,), CAREFUL_JUDGE.name)


def test_generate_stays_in_arrival_order_with_audits_hours_late() -> None:
    config = dataclasses.replace(RUN, duration_ms=3 * HOUR_MS, audit_rate=0.1)
    events = list(generate(config))
    arrivals = [e.arrival_ms for e in events]
    assert arrivals == sorted(arrivals)
    late = [e for e in events if e.event.get("signal") == "audit"]
    assert len(late) > 500
    assert max(e.arrival_ms for e in late) > config.end_ms  # some come after the last query
    assert len(events) == sum(len(q.events) for q in simulate_queries(config))


@pytest.mark.parametrize(
    ("judge", "message"),
    [
        ({"name": ""}, "1..100 characters"),
        ({"name": "x" * 101}, "1..100 characters"),
        ({"name": "j", "confusion_rate": 1.5}, "confusion_rate"),
        ({"name": "j", "find_unretrieved": -0.1}, "find_unretrieved"),
        ({"name": "j", "coverage": 2.0}, "coverage"),
        ({"name": "j", "delay_ms": (0, 7 * DAY_MS)}, "below 7 days|< 7 days"),
        ({"name": "j", "delay_ms": (5, 4)}, "low <= high"),
    ],
)
def test_bad_judges_are_rejected(judge: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        JudgeModel(**judge)  # type: ignore[arg-type]


def test_bad_audit_configs_are_rejected() -> None:
    with pytest.raises(ConfigError, match="audit_rate"):
        SimulationConfig(audit_rate=1.5)
    with pytest.raises(ConfigError, match="distinct names"):
        SimulationConfig(audit_rate=0.1, judges=(CAREFUL_JUDGE, CAREFUL_JUDGE))
