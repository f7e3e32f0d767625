"""The global view: every replica answers for all the traffic, and they all agree (issue 13).

One, two or four replicas share four input partitions. Each publishes only the windows
of the partitions it owns, but all of them follow the whole windows topic and the group's
committed progress, so ``/api/v1/rolling``, ``/api/v1/windows``, ``/api/v1/compare`` and
``/api/v1/regressions`` are the same on every one, for all partitions; the rolling view
equals the offline evaluation of the events, and the regressions are those ``replay``
opens on the same events in one partition, whatever the replica count. The dashboards'
panels over global series give the same values scraping one replica or all. A replica
started afterwards catches up from the topic and agrees; a replica killed with kill -9
mid-stream changes no answer.
"""

from __future__ import annotations

import json
import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from service.core.monitor import MonitorConfig
from service.detect.model import DetectorConfig
from service.replay import replay
from service.sim.shape import TrafficShape
from service.sim.simulator import SimEvent, SimulationConfig, generate, write_jsonl
from service.times import HOUR_MS, MINUTE_MS, parse_aware_ms, rfc3339
from tests.integration.kafka_helpers import (
    FAST,
    ServiceProcess,
    Topics,
    deploy_traffic,
    expected_windows,
    free_port,
    produce,
    total,
)
from tests.integration.monitoring_helpers import Prometheus, wait_for
from tests.integration.test_e2e_alerting import dashboard_queries, substitute

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MOVING = ("watermark", "evaluated_through")
"""Fields that follow the wall clock (every replica's boundary moves every window)."""


def _get(service: ServiceProcess, path: str) -> dict[str, Any]:
    status, body = service.get(path)
    assert status == 200, (path, body)
    result: dict[str, Any] = json.loads(body)
    return result


def _answers(service: ServiceProcess) -> dict[str, dict[str, Any]]:
    paths = (
        "/api/v1/rolling?window=24h",
        "/api/v1/windows",
        "/api/v1/regressions",
        "/api/v1/regressions?state=all",
        "/api/v1/compare?baseline=hybrid-v7&candidate=hybrid-v8&window=24h",
    )
    out = {}
    for path in paths:
        body = _get(service, path)
        out[path] = {k: v for k, v in body.items() if k not in MOVING}
    return out


def _agreed(replicas: list[ServiceProcess]) -> dict[str, dict[str, Any]] | None:
    """The answers, once every replica gives the same ones (read twice: stable)."""
    first = [_answers(r) for r in replicas]
    second = [_answers(r) for r in replicas]
    if first == second and all(a == first[0] for a in first):
        return first[0]
    return None


def _complete(r: ServiceProcess, end_ms: int) -> bool:
    """The replica's detector has evaluated past ``end_ms``."""
    through = _get(r, "/api/v1/regressions")["evaluated_through"]
    return through is not None and (parse_aware_ms(through) or 0) >= end_ms


def _agreed_past(replicas: list[ServiceProcess], end_ms: int) -> dict[str, dict[str, Any]]:
    """Wait until every replica's view is evaluated past ``end_ms`` and all give the same
    answers (within a minute of that); return them."""
    for r in replicas:  # each view needs every replica's windows: their work counts
        others = [o for o in replicas if o is not r]
        r.wait_progressing(
            lambda r=r: _complete(r, end_ms), "the global view past the data", others
        )
    deadline = time.monotonic() + 60
    agreed = _agreed(replicas)
    while agreed is None and time.monotonic() < deadline:
        time.sleep(1)
        agreed = _agreed(replicas)
    assert agreed is not None, [_answers(r) for r in replicas]
    return agreed


def check_against_offline_and_replay(
    agreed: dict[str, dict[str, Any]], events: list[SimEvent], tmp_path: Path
) -> None:
    """The rolling view is the offline evaluation; the regressions are replay's."""
    expected = expected_windows(events)
    # the rolling view is the offline evaluation of all the events
    slices: dict[tuple[str, str], tuple[int, int]] = {}
    for w in expected.values():
        q, lab = slices.get((w.retriever, w.segment), (0, 0))
        slices[w.retriever, w.segment] = (q + w.queries, lab + w.labelled)
    rolling = agreed["/api/v1/rolling?window=24h"]["slices"]
    assert {(s["retriever"], s["segment"]): (s["queries"], s["labelled"]) for s in rolling} == (
        slices
    )
    windows = agreed["/api/v1/windows"]["windows"]
    assert sum(w["queries"] for w in windows) == sum(w.queries for w in expected.values())

    # the regressions, open and closed, are those replay opens and closes on the same events
    path = tmp_path / "events.jsonl"
    write_jsonl(events, path)
    monitor, _ = replay([str(path)], MonitorConfig(), lambda _: None)
    fields = ("retriever", "segment", "metric", "baseline", "opened_at", "closed_at")
    by_replay = {
        (*(r[f] for f in fields), r["closed_reason"])
        for r in (x.to_record() for x in monitor.detector.opened)
    }
    every = {
        (*(r[f] for f in fields), r["closed_reason"])
        for r in agreed["/api/v1/regressions?state=all"]["regressions"]
    }
    assert every == by_replay
    open_now = {r[:5] for r in every if r[5] is None}
    assert open_now == {
        (r["retriever"], r["segment"], r["metric"], r["baseline"], r["opened_at"])
        for r in agreed["/api/v1/regressions"]["regressions"]
    }
    assert open_now
    assert {r[0] for r in open_now} == {"hybrid-v8"}
    compared = next(body for path, body in agreed.items() if "compare" in path)
    assert "regression" in {m["verdict"] for m in compared["metrics"]}


def lifecycle_traffic() -> tuple[list[SimEvent], SimulationConfig]:
    """Ten hours ending 40 minutes ago: hybrid-v7, then after 6 hours a bad hybrid-v8 in
    two segments, rolled back in docs 2 hours later and serving on in kb."""
    kb = deploy_traffic(bad=True, seed=31, hours=10)
    kb = replace(
        kb,
        start_ms=kb.start_ms - 40 * MINUTE_MS,
        switch_at_ms=kb.start_ms - 40 * MINUTE_MS + 6 * HOUR_MS,
        segments=(("kb", 1.0),),
        queries_per_hour=1600,
    )
    docs = replace(
        kb,
        seed=33,
        segments=(("docs", 1.0),),
        queries_per_hour=800,
        id_prefix="e2e33-",
        shape=TrafficShape(rollback_at_ms=(kb.switch_at_ms or 0) + 2 * HOUR_MS),
    )
    events = sorted([*generate(kb), *generate(docs)], key=lambda e: e.arrival_ms)
    return events, kb


def check_the_regressions_life(agreed: dict[str, dict[str, Any]], switch_ms: int) -> None:
    """4 hours after a bad deploy with 6 hours of history, its regressions in kb are still
    open, each opened within the watch of a deploy without a day of history (a metric's
    e-value may cross its level late in the watch: the events' alignment to the wall
    clock moves the windows); those of docs closed as rolled_back an hour after the
    rollback, at the label age."""
    every = agreed["/api/v1/regressions?state=all"]["regressions"]
    kb = [r for r in every if r["segment"] == "kb"]
    docs = [r for r in every if r["segment"] == "docs"]
    assert kb
    assert docs
    assert all(r["state"] == "open" and r["closed_at"] is None for r in kb)
    watch_ends = switch_ms + DetectorConfig().no_history_watch_ms
    assert all(r["opened_at"] <= rfc3339(watch_ends + 5 * MINUTE_MS) for r in kb)
    # the first metric opens within the first hour: the bad version is found early
    assert min(r["opened_at"] for r in kb) < rfc3339(switch_ms + HOUR_MS)
    # the first boundary after an hour without v8, at the label age 5 minutes later: an hour after
    # the end of the window the rollback fell in (or its start, if no v8 query came in it)
    window = 5 * MINUTE_MS
    rollback = switch_ms + 2 * HOUR_MS
    last_v8_ends = {-(-rollback // window) * window, rollback // window * window}
    [(reason, closed_at)] = {(r["closed_reason"], r["closed_at"]) for r in docs}
    assert reason == "rolled_back"
    assert closed_at in {rfc3339(end + HOUR_MS + 5 * MINUTE_MS) for end in last_v8_ends}
    open_keys = {r["segment"] for r in agreed["/api/v1/regressions"]["regressions"]}
    assert "docs" not in open_keys
    assert "kb" in open_keys


GLOBAL_SERIES = ("retrieval_rolling_", "retrieval_regression", "retrieval_estimate")


def _values(prometheus: Prometheus, expr: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(r["metric"].items())): round(float(r["value"][1]), 9)
        for r in prometheus.query(expr)
    }


def check_dashboards_count_replicas_once(replicas: list[ServiceProcess], tmp_path: Path) -> None:
    """Every panel over a global series gives the same values whether Prometheus scrapes
    one replica or both (each replica exports the same values; the panels take them once)."""
    one = Prometheus(tmp_path / "prom-one", [replicas[0].port], free_port())
    both = Prometheus(tmp_path / "prom-both", [r.port for r in replicas], free_port())
    probe = 'count(retrieval_rolling_labelled_queries{window="24h"})'
    wait_for("both Prometheus to scrape", lambda: one.query(probe) and both.query(probe), 90)
    wait_for(  # every target of both scraped at least once
        "both replicas scraped",
        lambda: len([s for s in both.query("up") if s["value"][1] == "1"]) == len(replicas),
        90,
    )
    panels = [
        (title, substitute(expr))
        for _, title, expr in dashboard_queries()
        if any(name in expr for name in GLOBAL_SERIES)
    ]
    assert len(panels) >= 10, panels

    def differing() -> list[tuple[str, str, Any, Any]]:
        pairs = ((title, expr, _values(one, expr), _values(both, expr)) for title, expr in panels)
        return [pair for pair in pairs if pair[2] != pair[3]]

    # The rolling views move when a window boundary passes (every 5 minutes, with the
    # wall clock), and the two servers scrape 15 s apart at most: a pass that straddles a
    # boundary can see two states, so compare until one pass sees a single state. Panels
    # that counted the replicas' copies would differ on every pass.
    deadline = time.monotonic() + 90
    mismatched = differing()
    while mismatched and time.monotonic() < deadline:
        time.sleep(3)
        mismatched = differing()
    assert not mismatched, mismatched
    # what the panels avoid: summing the replicas' identical copies counts each n times
    naive = 'sum(retrieval_rolling_labelled_queries{window="24h"})'
    [(_, once)] = _values(one, naive).items()
    [(_, summed)] = _values(both, naive).items()
    assert summed == len(replicas) * once > 0
    for prometheus in (one, both):
        prometheus.stop()


@pytest.mark.parametrize("n", [1, 2, 4])
def test_every_replica_gives_the_same_global_answers(
    topics: Topics, tmp_path: Path, n: int
) -> None:
    """With 1, 2 or 4 replicas: the same answers on every one, the offline evaluation's
    and replay's (so the same answers whatever the replica count), open and closed
    regressions alike: a bad version that serves on stays open 4 hours after a deploy
    with 6 hours of history, and one rolled back closes as rolled_back."""
    # ten hours ending 40 minutes ago (every window is final once the watermark passes the
    # data, by idleness): hybrid-v7 for 6 hours (no day of history), then a bad
    # hybrid-v8; it stays in kb and is rolled back in docs after 2 hours
    events, sim = lifecycle_traffic()
    produce(topics, events)
    expected = expected_windows(events)
    end_ms = sim.start_ms + sim.duration_ms

    replicas = [
        ServiceProcess(topics, tmp_path / f"r{i}.log", transactional_id=f"g-{i}") for i in range(n)
    ]
    a = replicas[0]
    for r in replicas:
        r.wait_ready()

    agreed = _agreed_past(replicas, end_ms)

    # every replica published: each owns some of the partitions
    for r in replicas:
        assert r.samples()[("retrieval_assigned_partitions", ())] > 0, r.tail()

    check_against_offline_and_replay(agreed, events, tmp_path)
    check_the_regressions_life(agreed, sim.switch_at_ms or 0)

    # the regression series are the same on both pods
    def series(r: ServiceProcess) -> dict[Any, float]:
        return {k: v for k, v in r.samples().items() if k[0] == "retrieval_regression"}

    assert all(series(r) == series(a) != {} for r in replicas)
    if n > 1:
        check_dashboards_count_replicas_once(replicas, tmp_path)
    if n != 2:
        for r in replicas:
            assert r.stop() == 0
        return

    # a replica that starts now catches up from the topic and agrees
    c = ServiceProcess(topics, tmp_path / "c.log", transactional_id="g-c")
    started = time.monotonic()
    c.wait_ready()
    c.wait_progressing(lambda: _complete(c, end_ms), "the new replica to catch up")
    caught_up_s = time.monotonic() - started
    replicas.append(c)
    deadline = time.monotonic() + 60
    again = _agreed(replicas)
    while again is None and time.monotonic() < deadline:
        time.sleep(1)
        again = _agreed(replicas)
    assert again == agreed
    delay = c.samples().get(("retrieval_global_view_delay_seconds", ()))
    print(
        f"\nglobal view: {len(events)} events, {len(expected)} windows over 4 partitions, "
        f"{n} replicas agree; a third caught up in {caught_up_s:.1f} s "
        f"(view delay gauge {delay}); evaluated through "
        f"{_get(c, '/api/v1/regressions')['evaluated_through']} (data ends {rfc3339(end_ms)}, "
        f"{sim.duration_ms // HOUR_MS} h of traffic)"
    )
    for r in replicas:
        assert r.stop() == 0


def test_a_replica_killed_mid_stream_changes_no_answer(topics: Topics, tmp_path: Path) -> None:
    """B, alone in the group, is killed with kill -9 while it consumes; A and a new B (the
    same transactional id, fencing the dead one's open transaction) then share the rest.
    Both replicas end with the same answers, the offline evaluation's and replay's.

    B starts alone: with two replicas started together, the first in the group could read
    every partition before the second joined, and then nothing would be killed mid-stream.
    The events are produced up front (historic event time; a stream that starts after the
    partitions went idle would be late by the contract)."""
    sim = deploy_traffic(bad=True, seed=32)
    sim = replace(sim, start_ms=sim.start_ms - 40 * MINUTE_MS)
    events = list(generate(sim))
    produce(topics, events)
    end_ms = sim.start_ms + sim.duration_ms
    settings = {**FAST, "max_poll_records": "100"}
    # B's first life polls 5 records at a time, so that it is still mid-stream when the
    # kill lands (with 100 it once read 17,300 of 29,357 between two scrapes)
    seen: list[float] = []

    def mid_stream() -> bool:
        seen.append(total(b.samples(), "retrieval_events_total"))
        return seen[-1] > 2000

    slow = {**settings, "max_poll_records": "5"}
    b = ServiceProcess(topics, tmp_path / "b.log", transactional_id="k-b", **slow)
    b.wait_progressing(mid_stream, "B mid-stream")
    b.stop(signal.SIGKILL)
    read = seen[-1]
    assert read < len(events) / 2, f"B read {read} of {len(events)} events before the kill"
    a = ServiceProcess(topics, tmp_path / "a.log", transactional_id="k-a", **settings)
    b = ServiceProcess(topics, tmp_path / "b2.log", transactional_id="k-b", **settings)
    replicas = [a, b]

    for r in replicas:
        r.wait_ready()
    agreed = _agreed_past(replicas, end_ms)
    check_against_offline_and_replay(agreed, events, tmp_path)
    print(f"\nkill -9 of B after it read {read:.0f} of {len(events)} events: both agree")
    for r in replicas:
        assert r.stop() == 0
