"""A regression's life through replay and the API: open, then closed by a rollback, with
its history; and every comparison the detector holds, with why it does not run."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.commands.cli import main
from service.core.monitor import Monitor, MonitorConfig
from service.core.state import ServiceState
from service.detect.detector import Detector
from service.http.app import create_app
from service.replay import replay
from service.sim.shape import TrafficShape
from service.sim.simulator import HYBRID_V8, SimulationConfig, generate, write_jsonl
from service.stream.windows import ClosedWindow
from service.times import DAY_MS, HOUR_MS, rfc3339

START = 1_796_083_200_000  # 2026-12-01T00:00:00Z
NOW = START + 10 * DAY_MS


def _write(folder: Path, name: str, config: SimulationConfig) -> Path:
    path = folder / f"{name}.jsonl"
    write_jsonl(generate(config), path)
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("lifecycle")
    bad = replace(HYBRID_V8, rank_decay=0.75)
    rollback = SimulationConfig(  # a bad deploy after 6 h, rolled back 3 h later
        seed=11,
        start_ms=START,
        duration_ms=12 * HOUR_MS,
        queries_per_hour=1500,
        segments=(("default", 1.0),),
        after=bad,
        switch_at_ms=START + 6 * HOUR_MS,
        quality_drop=0.15,
        shape=TrafficShape(rollback_at_ms=START + 9 * HOUR_MS),
    )
    quiet = SimulationConfig(  # a good deploy after 3 h, 3.5 h more; one segment is tiny
        seed=12,
        start_ms=START,
        duration_ms=int(6.5 * HOUR_MS),
        queries_per_hour=1500,
        segments=(("default", 0.97), ("tiny", 0.03)),
        after=HYBRID_V8,
        switch_at_ms=START + 3 * HOUR_MS,
    )
    return {
        "rollback": _write(folder, "rollback", rollback),
        "quiet": _write(folder, "quiet", quiet),
    }


def _replayed(path: Path) -> Monitor:
    monitor, _ = replay([str(path)], MonitorConfig(), lambda _: None, now_ms=lambda: NOW)
    return monitor


def _client(monitor: Monitor) -> TestClient:
    return TestClient(create_app(ServiceState(monitor, lambda: NOW, needs_assignment=False)))


def test_a_rollback_closes_every_regression_of_the_bad_version(files: dict[str, Path]) -> None:
    monitor = _replayed(files["rollback"])
    client = _client(monitor)
    assert client.get("/api/v1/regressions").json()["regressions"] == []
    closed = client.get("/api/v1/regressions?state=closed").json()["regressions"]
    assert closed
    assert {r["retriever"] for r in closed} == {"hybrid-v8"}
    assert {r["closed_reason"] for r in closed} == {"rolled_back"}
    assert {r["state"] for r in closed} == {"closed"}
    rollback = START + 9 * HOUR_MS
    for r in closed:
        assert r["opened_at"] < rfc3339(rollback) <= r["closed_at"]
        # decided once v8 served nothing for an hour, when those windows' labels were of
        # the label age the detector compares (5 minutes)
        assert r["closed_at"] == rfc3339(rollback + HOUR_MS + 5 * 60_000)
    every = client.get("/api/v1/regressions?state=all").json()["regressions"]
    assert [r["opened_at"] for r in every] == sorted(r["opened_at"] for r in every)
    assert len(every) == len(closed) == len(monitor.detector.opened)
    later = rfc3339(rollback + 2 * HOUR_MS)
    assert client.get(f"/api/v1/regressions?state=closed&since={later}").json()["regressions"] == []


@pytest.mark.parametrize(
    "query",
    ["/api/v1/regressions?state=gone", "/api/v1/regressions?since=yesterday"],
)
def test_regressions_rejects_bad_parameters(files: dict[str, Path], query: str) -> None:
    monitor = _replayed(files["quiet"])
    response = _client(monitor).get(query)
    assert response.status_code == 422, response.text


def test_replay_writes_closed_at_and_reason(files: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "regressions.jsonl"
    assert main(["replay", str(files["rollback"]), "--regressions-out", str(out)]) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines
    assert {line["closed_reason"] for line in lines} == {"rolled_back"}
    assert all(line["closed_at"] > line["opened_at"] for line in lines)


def test_tests_name_why_a_comparison_does_not_run(files: dict[str, Path], tmp_path: Path) -> None:
    """A good deploy 3.5 h before the end, without a day of history: its watch (2 h here,
    shorter than the default) has ended; the tiny segment never had 200 values a side;
    hybrid-v7 has been seen from the start (no previous version); nothing has a day of
    history for drift."""
    out = tmp_path / "tests.jsonl"
    watch = ["--regression-no-history-watch", "2h"]
    assert main(["replay", str(files["quiet"]), "--tests-out", str(out), *watch]) == 0
    rows = {
        (r["retriever"], r["segment"], r["metric"], r["kind"]): r
        for r in map(json.loads, out.read_text().splitlines())
    }
    ended = rows["hybrid-v8", "default", "recall@5", "deploy"]
    assert (ended["running"], ended["why_not"], ended["baseline"]) == (
        False,
        "watch_ended",
        "hybrid-v7",
    )
    assert ended["n_candidate"] >= 200
    assert ended["looked_at"] is not None
    # a diagnosis test: a quarter of alpha over the previous version's two segments;
    # the primary test, pooled over both (tiny has a stratum's 30 values), has the rest
    assert ended["needed_e_value"] == pytest.approx(1 / (0.01 / 8))
    pooled = rows["hybrid-v8", "*", "recall@5", "deploy"]
    assert pooled["needed_e_value"] == pytest.approx(1 / (0.01 * 3 / 4))
    tiny = rows["hybrid-v8", "tiny", "recall@5", "deploy"]
    assert tiny["why_not"] in ("too_few_values", "watch_ended")
    assert tiny["n_candidate"] < 200
    assert tiny["looked_at"] is None  # never looked at: too few values all along
    start = rows["hybrid-v7", "default", "recall@5", "deploy"]
    assert (start["why_not"], start["baseline"]) == ("no_baseline", None)
    drift = rows["hybrid-v8", "default", "recall@5", "drift"]
    assert drift["why_not"] == "no_baseline"
    # the route answers the same, filtered
    client = _client(_replayed(files["quiet"]))
    body = client.get("/api/v1/tests?retriever=hybrid-v8&segment=tiny").json()
    assert {(t["retriever"], t["segment"]) for t in body["tests"]} == {("hybrid-v8", "tiny")}
    assert client.get("/api/v1/tests?retriever=nope").json()["tests"] == []


def test_a_comparison_with_too_few_values_says_so_while_its_watch_runs(
    files: dict[str, Path],
) -> None:
    """Looked at 90 minutes after the deploy (its watch still runs): the big segment's
    comparison runs, the tiny one's has too few values, with its sample sizes."""
    windows: list[ClosedWindow] = []
    monitor, _ = replay([str(files["quiet"])], MonitorConfig(), windows.extend)
    detector = Detector(monitor.detector.config)
    detector.add(windows)
    detector.advance(START + 3 * HOUR_MS + 90 * 60_000)
    rows = {(r.segment, r.metric, r.kind): r for r in detector.comparisons.select("hybrid-v8")}
    running = rows["default", "recall@5", "deploy"]
    assert running.why_not is None
    assert running.look is not None
    tiny = rows["tiny", "recall@5", "deploy"]
    assert tiny.why_not == "too_few_values"
    assert 0 < tiny.n_candidate < 200
    assert 0 < tiny.n_baseline < 200  # (as long a span before the switch as after it)
