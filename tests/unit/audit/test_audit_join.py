"""The audit join of one partition on its own: an audit applied again (a window closed
again after a restart from an older commit) contributes exactly what it did the first
time, the state of a request round-trips, and its changes are reported for writing."""

from __future__ import annotations

import math

from service.audit.estimate import AuditSums
from service.stream.audit_join import AuditConfig, AuditJoin, AuditRequest
from service.stream.events import AuditEvent

KS = (1, 3, 5)
WINDOW_MS = 300_000
QUERY_MS = 1_000_000_200_000  # (inside a window)


def _join() -> AuditJoin:
    return AuditJoin(AuditConfig(rate=1.0), KS, WINDOW_MS)


def _held(join: AuditJoin, query_id: str = "q1") -> None:
    key = query_id.encode()
    assert join.in_sample(key)  # (rate 1: every query)
    join.query(key, ["a", "b", "c", "d", "e"])
    # live labels: a click on "b" (grade 1); f of every metric from them
    f = {"recall@5": 1.0, "hit_rate@1": 0.0, "mrr": 0.5}
    join.finalised(
        key, ("v1", "seg", QUERY_MS - QUERY_MS % WINDOW_MS), QUERY_MS, 5, {hash("b"): 1}, f
    )


def _audit(grades: dict[str, int], minutes: int, judge: str = "human") -> AuditEvent:
    ts = QUERY_MS + minutes * 60_000
    return AuditEvent("q1", ts / 1000, "audit", judge, grades, ts)


def _close_all(join: AuditJoin) -> dict[str, AuditSums]:
    out: dict[str, AuditSums] = {}
    for closing in join.close(1 << 62).values():
        for key, value in closing.sums.items():
            out[key] = out[key] + value if key in out else value
    return out


def test_the_first_audit_counts_its_true_values_against_the_live_ones() -> None:
    join = _join()
    _held(join)
    assert join.audit(10, _audit({"a": 0, "b": 2, "z": 3}, 60)) is None
    sums = _close_all(join)
    # R = {b, z}: recall@5 = 1/2, hit_rate@1 = 0 (a is not relevant), mrr = 1/2
    assert sums["recall@5"] == AuditSums.of(0.5, 1.0, 1.0, 1.0)
    assert sums["hit_rate@1"] == AuditSums.of(0.0, 1.0, 0.0, 1.0)
    assert sums["mrr"] == AuditSums.of(0.5, 1.0, 0.5, 1.0)
    assert join.counts["counted"] == 1


def test_an_audit_applied_again_contributes_as_the_first_time() -> None:
    first, again = _join(), _join()
    for join in (first, again):
        _held(join)
        join.audit(10, _audit({"b": 2}, 60))
        join.audit(20, _audit({"a": 3}, 70))  # the same judge later: replaces the first
    once = _close_all(first)
    # the second join has seen both applied already (its state read back after a
    # restart) and closes the same window again
    _close_all(again)
    again.audit(10, _audit({"b": 2}, 60))
    again.audit(20, _audit({"a": 3}, 70))
    assert _close_all(again) == once
    # net: only the later audit counts (R = {a}: recall@5 = 1, hit_rate@1 = 1, mrr = 1)
    assert once["recall@5"] == AuditSums.of(1.0, 1.0, 1.0, 1.0)
    assert once["mrr"] == AuditSums.of(1.0, 1.0, 0.5, 1.0)


def test_another_judge_is_kept_for_agreement_and_changes_no_sum() -> None:
    join = _join()
    _held(join)
    join.audit(10, _audit({"b": 2}, 60, "human"))
    join.audit(11, _audit({"a": 2}, 61, "llm"))
    sums = _close_all(join)
    assert sums["recall@5"] == AuditSums.of(1.0, 1.0, 1.0, 1.0)  # the human's: R = {b}
    assert join.counts["other_judge"] == 1
    assert join.held["q1"].judges() == {"human": {"b": 2}, "llm": {"a": 2}}


def test_the_state_of_a_request_round_trips_and_changes_are_reported() -> None:
    join = _join()
    join.changed = {}
    _held(join)
    join.audit(10, _audit({"b": 2, "z": 1}, 60))
    _close_all(join)
    changed = join.take_changes()
    assert list(changed) == ["q1"]
    request = changed["q1"]
    assert request is not None
    state = request.to_state()
    back = AuditRequest.from_state(state)
    assert back == request
    assert back.applied == [(10, "human", {"b": 2, "z": 1})]
    assert join.take_changes() == {}
    # a restarted join loads it, and the query finalised again keeps its audits
    restarted = _join()
    restarted.load([back])
    _held(restarted)
    assert restarted.held["q1"].applied == back.applied
    # expiry: past AUDIT_WINDOW and a day, the request is forgotten (a tombstone)
    join.expire(QUERY_MS + 9 * 86_400_000)
    assert "q1" not in join.held
    assert join.take_changes() == {"q1": None}


def test_an_audit_of_a_query_outside_the_sample_changes_nothing() -> None:
    join = AuditJoin(AuditConfig(rate=1e-12), KS, WINDOW_MS)
    assert not join.in_sample(b"q1")
    join.audit(5, _audit({"b": 2}, 60))
    assert _close_all(join) == {}
    assert join.counts["outside_sample"] == 1
    assert math.isclose(AuditSums.of(0.5, 1, 0.5, 1).mean("y"), 0.5)


def test_agreement_counts_each_pair_on_the_chunks_both_graded() -> None:
    join = _join()
    _held(join)  # results a..e; live: a click on b
    join.audit(10, _audit({"a": 0, "b": 2, "z": 3}, 60, "human"))
    join.audit(11, _audit({"a": 1, "b": 2, "c": 0}, 61, "llm"))
    tables: dict[str, list[int]] = {}
    for closing in join.close(1 << 62).values():
        for name, table in closing.judges.items():
            tables[name] = [x + y for x, y in zip(tables.get(name, [0] * 4), table, strict=True)]
    # human vs llm on a, b: a (no, yes) -> only the second; b both
    assert tables["human|llm"] == [1, 0, 1, 0]
    # human vs live on a, b (z was never retrieved nor signalled): b both, a neither
    assert tables["human|live"] == [1, 0, 0, 1]
    # llm vs live on a, b, c: a only llm, b both, c neither
    assert tables["llm|live"] == [1, 1, 0, 1]
    # the human audits again, calling a relevant: its pairs move by the difference only
    join.audit(12, _audit({"a": 1, "b": 2}, 62, "human"))
    again = join.close(1 << 62)
    (closing,) = again.values()
    assert closing.judges["human|llm"] == [1, 0, -1, 0]  # a: from (no, yes) to (yes, yes)
    assert closing.judges["human|live"] == [0, 1, 0, -1]  # a: from neither to only human


def test_kappa_of_a_known_table() -> None:
    from service.stream.agreement import kappa

    n, agreement, k = kappa((40, 10, 5, 45))
    assert n == 100
    assert agreement == 0.85
    assert k is not None
    assert math.isclose(k, 0.7)  # chance: 0.5 * 0.45 + 0.5 * 0.55 = 0.5
    assert kappa((0, 0, 0, 0)) == (0, None, None)
    assert kappa((0, 0, 0, 7)) == (7, 1.0, None)  # (both always say no: kappa undefined)
