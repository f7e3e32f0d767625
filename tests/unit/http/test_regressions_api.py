"""Regressions end to end without a network: replay, /metrics, the API, the JSONL output."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from service.commands.cli import main
from service.core.monitor import Monitor, MonitorConfig
from service.core.state import ServiceState
from service.detect.detector import Detector
from service.http import regression_series
from service.http.app import create_app
from service.replay import replay
from service.sim.shape import TrafficShape
from service.sim.simulator import (
    HYBRID_V7,
    HYBRID_V8,
    SimulationConfig,
    generate,
    write_jsonl,
)
from service.stream.events import feedback_from, query_from
from service.stream.pipeline import Pipeline
from service.stream.reference import evaluate_event_log
from service.stream.windows import ClosedWindow
from service.times import HOUR_MS

START = 1_796_083_200_000
DEPLOY = START + 3 * HOUR_MS
NOW = START + 10 * 24 * HOUR_MS
KEY = ("hybrid-v8", "default", "mrr", "hybrid-v7")


def simulation(bad: bool) -> SimulationConfig:
    return SimulationConfig(
        seed=5,
        start_ms=START,
        duration_ms=5 * HOUR_MS,
        queries_per_hour=1500,
        segments=(("default", 1.0),),
        before=HYBRID_V7,
        after=replace(HYBRID_V8, rank_decay=0.75) if bad else HYBRID_V8,
        switch_at_ms=DEPLOY,
        quality_drop=0.15 if bad else 0.0,
    )


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("regressions")
    out = {}
    for name in ("bad", "good"):
        out[name] = folder / f"{name}.jsonl"
        write_jsonl(generate(simulation(name == "bad")), out[name])
    return out


@pytest.fixture(scope="module")
def bad(files: dict[str, Path]) -> Monitor:
    monitor, _ = replay([str(files["bad"])], MonitorConfig(), lambda _: None, now_ms=lambda: NOW)
    return monitor


def _client(monitor: Monitor) -> TestClient:
    return TestClient(create_app(ServiceState(monitor, lambda: NOW, needs_assignment=False)))


def test_replay_writes_the_regressions_it_opened(files: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "regressions.jsonl"
    assert main(["replay", str(files["bad"]), "--regressions-out", str(out)]) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines, "the bad deploy was not detected"
    first = lines[0]
    assert {"retriever", "segment", "metric", "baseline", "delta", "p_value", "opened_at"} <= set(
        first
    )
    assert (first["retriever"], first["baseline"], first["kind"]) == (
        "hybrid-v8",
        "hybrid-v7",
        "deploy",
    )
    assert first["delta"] < -0.02
    assert first["p_value"] < 0.01
    assert first["delta"] == pytest.approx(first["candidate_mean"] - first["baseline_mean"])
    # the evidence: the closed e-value reached 1 / level, the upper bound is below 0
    assert first["e_value"] >= first["closed_e_value"] >= 1 / first["level"]
    assert first["ci_low"] < first["delta"] < first["ci_high"] < 0
    # the detector compares labels at their age of 5 minutes: never before the deploy's
    # first window (03:00 to 03:05) has its labels of that age
    assert first["opened_at"] >= "2026-12-01T03:10:00Z"
    assert first["opened_at"] <= "2026-12-01T05:00:00Z"

    quiet = tmp_path / "quiet.jsonl"
    assert main(["replay", str(files["good"]), "--regressions-out", str(quiet)]) == 0
    assert quiet.read_text() == ""


def test_streaming_detection_equals_detection_on_the_offline_windows(
    files: dict[str, Path], bad: Monitor
) -> None:
    queries, feedback = [], []
    for line in files["bad"].read_text().splitlines():
        record = json.loads(line)
        if record["topic"] == "queries":
            queries.append(query_from(record["event"]))
        else:
            feedback.append(feedback_from(record["event"]))
    windows = list(evaluate_event_log(queries, feedback).values())
    offline = Detector(bad.detector.config)
    offline.add(windows)
    offline.advance(max(w.end_ms for w in windows))
    assert [r.to_record() for r in offline.opened] == [r.to_record() for r in bad.detector.opened]


def test_metrics_expose_the_open_regression(bad: Monitor) -> None:
    text = _client(bad).get("/metrics").text
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[s.name, tuple(sorted(s.labels.items()))] = s.value
    labels = tuple(sorted(zip(("retriever", "segment", "metric", "baseline"), KEY, strict=True)))
    assert samples["retrieval_regression", labels] == 1.0
    assert samples["retrieval_regression_delta", labels] < -0.02
    assert 0 <= samples["retrieval_regression_p_value", labels] < 0.01
    # what opened it: the closed e-value, at most the test's own
    opened = bad.detector.open[KEY].latest
    closed_e = samples["retrieval_regression_closed_e_value", labels]
    assert closed_e == pytest.approx(opened.closed_e_value)
    assert closed_e <= samples["retrieval_regression_e_value", labels]
    # the labelled share is watched with the other metrics (a few hours: no drift yet)
    watched = {
        dict(ls)["metric"]
        for (name, ls), _ in samples.items()
        if name == "retrieval_regression" and ("baseline", "hybrid-v7") in ls
    }
    assert watched == {*bad.detector.config.metrics, "labelled_share"}
    assert not [ls for (name, ls) in samples if ("baseline", "previous_day") in ls]
    first_seen = samples[
        "retrieval_retriever_first_seen_timestamp_seconds", (("retriever", "hybrid-v8"),)
    ]
    assert DEPLOY / 1000 <= first_seen < DEPLOY / 1000 + 60


def test_regressions_endpoint_lists_what_is_open(bad: Monitor) -> None:
    body = _client(bad).get("/api/v1/regressions").json()
    keys = {(r["retriever"], r["segment"], r["metric"], r["baseline"]) for r in body["regressions"]}
    assert KEY in keys
    assert keys == set(bad.detector.open)
    row = next(r for r in body["regressions"] if r["metric"] == "mrr")
    assert row["kind"] == "deploy"
    assert row["n_candidate"] >= 200
    assert row["ci_high"] < 0


def test_compare_endpoint(bad: Monitor) -> None:
    client = _client(bad)
    body = client.get("/api/v1/compare?baseline=hybrid-v7&candidate=hybrid-v8&window=24h").json()
    by_metric = {m["metric"]: m for m in body["metrics"]}
    assert by_metric["mrr"]["verdict"] == "regression"
    assert by_metric["mrr"]["delta"] == pytest.approx(
        by_metric["mrr"]["candidate"]["mean"] - by_metric["mrr"]["baseline"]["mean"]
    )
    same = client.get("/api/v1/compare?baseline=hybrid-v7&candidate=hybrid-v7").json()
    assert {m["verdict"] for m in same["metrics"]} == {"no_significant_difference"}
    absent = client.get("/api/v1/compare?baseline=hybrid-v7&candidate=nope").json()
    assert {m["verdict"] for m in absent["metrics"]} == {"insufficient_data"}


@pytest.mark.parametrize(
    "query",
    [
        "/api/v1/compare?candidate=hybrid-v8",
        "/api/v1/compare?baseline=hybrid-v7",
        "/api/v1/compare?baseline=a&candidate=b&window=abc",
        "/api/v1/compare?baseline=a&candidate=b&window=48h",
        "/api/v1/compare?baseline=&candidate=b",
    ],
)
def test_compare_rejects_bad_parameters(bad: Monitor, query: str) -> None:
    response = _client(bad).get(query)
    assert response.status_code == 422, response.text


# -- wiring: repeats, partitions without event time, replicas without partitions ---------


def _feed(pipeline: Pipeline, path: Path, partitions: tuple[int, ...]) -> None:
    offsets: dict[tuple[int, int], int] = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        partition = int(record["event"]["query_id"][-1]) % 2
        if partition not in partitions:
            continue
        kind = 0 if record["topic"] == "queries" else 1
        offset = offsets.get((partition, kind), 0)
        offsets[partition, kind] = offset + 1
        if kind == 0:
            pipeline.query(partition, offset, query_from(record["event"]))
        else:
            pipeline.feedback(partition, offset, feedback_from(record["event"]))


def test_a_window_confirmed_twice_counts_once(files: dict[str, Path]) -> None:
    windows: list[ClosedWindow] = []
    monitor, _ = replay([str(files["bad"])], MonitorConfig(), windows.extend, now_ms=lambda: NOW)
    pipeline = monitor.pipeline
    before = (
        pipeline.counts.windows_published,
        dict(pipeline.counts.finalized),
        {k: c.n_candidate for k, c in monitor.detector.latest.items()},
    )
    pipeline.confirm(windows[-40:])  # published again after a failed commit
    monitor.detector.advance(monitor.detector.through_ms or 0)
    after = (
        pipeline.counts.windows_published,
        dict(pipeline.counts.finalized),
        {k: c.n_candidate for k, c in monitor.detector.latest.items()},
    )
    assert after == before


def test_after_a_rebuild_no_boundary_is_tested_with_some_partitions_only(
    files: dict[str, Path],
) -> None:
    monitor = Monitor(MonitorConfig(), lambda: NOW)
    pipeline = monitor.pipeline
    for p in (0, 1):
        pipeline.assign(p)
    _feed(pipeline, files["bad"], (0, 1))
    closed = pipeline.advance()  # sent, but the transaction is aborted: never confirmed
    assert closed
    for p in (0, 1):  # the rebuild: both partitions start again from the last commit
        pipeline.revoke(p)
        pipeline.assign(p)
    _feed(pipeline, files["bad"], (0,))  # partition 0 is re-read first
    pipeline.deliver(pipeline.advance())
    assert monitor.detector.through_ms is None  # partition 1 has no event time yet
    client = _client(monitor)
    _feed(pipeline, files["bad"], (1,))
    pipeline.deliver(pipeline.advance())
    assert monitor.detector.through_ms is not None
    assert "retrieval_regression{" in client.get("/metrics").text
    pipeline.revoke(0)
    pipeline.revoke(1)  # a replica left without partitions says nothing about regressions
    assert "retrieval_regression{" not in client.get("/metrics").text


def _samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


def test_metrics_expose_a_regression_closed_by_a_rollback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rolled back 1.5 h after the bad deploy: the regression closes, its flag goes, and
    the closed series carries its reason and the event time of the close, for 7 days."""
    path = tmp_path / "rolled-back.jsonl"
    rollback = DEPLOY + 3 * HOUR_MS // 2
    sim = replace(
        simulation(bad=True), duration_ms=7 * HOUR_MS, shape=TrafficShape(rollback_at_ms=rollback)
    )
    write_jsonl(generate(sim), path)
    monitor, _ = replay([str(path)], MonitorConfig(), lambda _: None, now_ms=lambda: NOW)
    detector = monitor.detector
    assert not detector.open
    closed = {r.key: r for r in detector.closed}
    assert KEY in closed
    assert {str(r.closed_reason) for r in closed.values()} == {"rolled_back"}
    client = _client(monitor)
    text = client.get("/metrics").text
    flags = _samples(text, "retrieval_regression")
    labels = tuple(sorted(zip(("retriever", "segment", "metric", "baseline"), KEY, strict=True)))
    assert flags.get(labels, 0.0) == 0.0
    series = _samples(text, "retrieval_regression_closed_timestamp_seconds")
    closed_ms = closed[KEY].closed_ms
    assert closed_ms is not None
    assert closed_ms >= rollback + HOUR_MS  # the rollback had lasted REGRESSION_CANDIDATE
    assert series[tuple(sorted((*labels, ("reason", "rolled_back"))))] == closed_ms / 1000
    assert len(series) == len(closed)  # one per regression closed (each its own labels)
    assert {dict(ls)["reason"] for ls in series} == {"rolled_back"}
    # older than CLOSED_SHOWN_MS of event time before the last boundary: gone
    through = detector.through_ms
    assert through is not None
    monkeypatch.setattr(regression_series, "CLOSED_SHOWN_MS", through - closed_ms - 1)
    assert not _samples(
        client.get("/metrics").text, "retrieval_regression_closed_timestamp_seconds"
    )
    monkeypatch.setattr(regression_series, "CLOSED_SHOWN_MS", through - closed_ms)
    assert _samples(client.get("/metrics").text, "retrieval_regression_closed_timestamp_seconds")
