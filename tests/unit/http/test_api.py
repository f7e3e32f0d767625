"""HTTP API and /metrics over a pipeline fed with simulated traffic (no network)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from service.core.monitor import Monitor, MonitorConfig
from service.core.state import ServiceState
from service.http.app import create_app
from service.metrics.aggregates import SCALE, merge
from service.replay import replay
from service.sim.simulator import (
    HYBRID_V7,
    HYBRID_V8,
    SimulationConfig,
    generate,
    write_jsonl,
)
from service.stream.events import query_from
from service.stream.pipeline import PipelineConfig
from service.stream.windows import ClosedWindow
from service.times import HOUR_MS

START = 1_796_083_200_000
NOW = START + 10 * 24 * HOUR_MS


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Monitor, list[ClosedWindow]]:
    sim = SimulationConfig(
        seed=11,
        start_ms=START,
        duration_ms=3 * HOUR_MS,
        queries_per_hour=1500,
        before=HYBRID_V7,
        after=HYBRID_V8,
        switch_at_ms=START + 2 * HOUR_MS,
    )
    path = Path(tmp_path_factory.mktemp("api")) / "events.jsonl"
    write_jsonl(generate(sim), path)
    windows: list[ClosedWindow] = []
    monitor, _ = replay([str(path)], MonitorConfig(), windows.extend, now_ms=lambda: NOW)
    return monitor, windows


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return out


def _client(monitor: Monitor, needs_assignment: bool = False) -> tuple[TestClient, ServiceState]:
    state = ServiceState(monitor, lambda: NOW, needs_assignment=needs_assignment)
    return TestClient(create_app(state)), state


def test_summaries_on_metrics_equal_the_published_windows(
    replayed: tuple[Monitor, list[ClosedWindow]],
) -> None:
    monitor, windows = replayed
    client, _ = _client(monitor)
    samples = _samples(client.get("/metrics").text)
    per_retriever: dict[str, list[ClosedWindow]] = defaultdict(list)
    for w in windows:
        per_retriever[w.retriever].append(w)
    assert set(per_retriever) == {"hybrid-v7", "hybrid-v8"}
    for retriever, ws in per_retriever.items():
        merged = merge(w.metrics for w in ws)
        count = sum(
            v
            for (name, labels), v in samples.items()
            if name == "retrieval_hit_count"
            and ("k", "5") in labels
            and ("retriever", retriever) in labels
        )
        total = sum(
            v
            for (name, labels), v in samples.items()
            if name == "retrieval_recall_sum"
            and ("k", "5") in labels
            and ("retriever", retriever) in labels
        )
        assert count == merged["hit_rate@5"].count > 100
        assert total == pytest.approx(merged["recall@5"].sum_fx / SCALE, rel=1e-12)
        labelled = sum(
            v
            for (name, labels), v in samples.items()
            if name == "retrieval_queries_finalized_total"
            and ("retriever", retriever) in labels
            and ("labelled", "true") in labels
        )
        assert labelled == sum(w.labelled for w in ws)


def test_rolling_api_merges_windows_and_gives_intervals(
    replayed: tuple[Monitor, list[ClosedWindow]],
) -> None:
    monitor, windows = replayed
    client, _ = _client(monitor)
    body = client.get("/api/v1/rolling", params={"window": "24h"}).json()
    assert body["window"] == "24h"
    rows = {(s["retriever"], s["segment"]): s for s in body["slices"]}
    expected = merge(
        w.metrics for w in windows if (w.retriever, w.segment) == ("hybrid-v8", "docs")
    )
    got = rows["hybrid-v8", "docs"]["metrics"]["mrr"]
    assert got["n"] == expected["mrr"].count
    assert got["mean"] == pytest.approx(expected["mrr"].mean, rel=1e-12)
    assert got["ci_low"] < got["mean"] < got["ci_high"]
    # a 15-minute view holds fewer queries than the 24-hour one
    short = client.get("/api/v1/rolling", params={"window": "15m"}).json()
    assert sum(s["labelled"] for s in short["slices"]) < sum(s["labelled"] for s in body["slices"])


def test_windows_api_filters(replayed: tuple[Monitor, list[ClosedWindow]]) -> None:
    monitor, windows = replayed
    client, _ = _client(monitor)
    since = "2026-12-01T02:00:00Z"
    body = client.get(
        "/api/v1/windows", params={"retriever": "hybrid-v8", "segment": "billing", "since": since}
    ).json()
    starts = [w["window_start"] for w in body["windows"]]
    assert starts == sorted(starts)
    assert all(w["retriever"] == "hybrid-v8" and w["segment"] == "billing" for w in body["windows"])
    assert len(starts) == len(
        [w for w in windows if (w.retriever, w.segment) == ("hybrid-v8", "billing")]
    )
    epoch = client.get("/api/v1/windows", params={"since": str(NOW // 1000)}).json()
    assert epoch["windows"] == []


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/api/v1/rolling", {"window": "soon"}),
        ("/api/v1/rolling", {"window": "0s"}),
        ("/api/v1/rolling", {"window": "x" * 50}),
        ("/api/v1/windows", {"since": "yesterday"}),
        ("/api/v1/windows", {"since": "2026-12-01T00:00:00"}),
        ("/api/v1/windows", {"since": "\u00b2"}),  # a digit to str.isdigit (found by fuzzing)
        ("/api/v1/windows", {"since": "1" * 40}),
    ],
)
def test_bad_parameters_get_422(
    replayed: tuple[Monitor, list[ClosedWindow]], path: str, params: dict[str, str]
) -> None:
    client, _ = _client(replayed[0])
    response = client.get(path, params=params)
    assert response.status_code == 422
    assert "detail" in response.json()


def test_health_and_readiness_follow_the_loop() -> None:
    client, state = _client(Monitor(MonitorConfig(), lambda: NOW), needs_assignment=True)
    assert client.get("/healthz").status_code == 503
    state.beat()
    assert client.get("/healthz").status_code == 200
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["reason"] == "no partitions assigned yet"
    state.health.assigned = 2
    assert client.get("/readyz").status_code == 503  # assigned but never polled
    state.health.last_poll_ms = NOW - 1000
    assert client.get("/readyz").json() == {"ready": True, "partitions": 2}


def test_no_data_is_no_sample_and_labels_are_capped() -> None:
    config = MonitorConfig(PipelineConfig(max_label_values=2))
    monitor = Monitor(config, lambda: NOW)
    pipeline = monitor.pipeline
    pipeline.assign(0)
    for i, retriever in enumerate(["a", "b", "c", "d"]):
        event = query_from(
            {
                "query_id": f"q{i}",
                "timestamp": START // 1000 + i,
                "retriever": retriever,
                "results": ["x"],
            }
        )
        assert pipeline.query(0, i, event) is None
    pipeline.deliver(pipeline.finish())
    client, _ = _client(monitor)
    samples = _samples(client.get("/metrics").text)
    retrievers = {
        dict(labels)["retriever"] for (name, labels) in samples if name == "retrieval_queries_total"
    }
    assert retrievers == {"a", "b", "other"}
    assert samples["retrieval_label_overflow_total", (("label", "retriever"),)] == 2
    # every query is unlabelled: finalised counts exist, but no metric value is exposed
    assert (
        samples[
            "retrieval_queries_finalized_total",
            (("labelled", "false"), ("retriever", "other"), ("segment", "default")),
        ]
        == 2
    )
    assert not [name for name, _ in samples if name.startswith("retrieval_rolling_recall")]
    assert (
        samples[
            "retrieval_rolling_unlabelled_ratio",
            (("retriever", "a"), ("segment", "default"), ("window", "24h")),
        ]
        == 1.0
    )


def test_the_root_links_every_route(replayed: tuple[Monitor, list[ClosedWindow]]) -> None:
    client, _ = _client(replayed[0])
    body = client.get("/").json()
    links = {link["href"] for link in body["links"]}
    assert {"/metrics", "/healthz", "/readyz", "/api/v1/regressions", "/docs"} <= links
    for link in links:  # every link answers (readiness may say 503: not assigned here)
        assert client.get(link).status_code in (200, 503), link
    page = client.get("/", headers={"Accept": "text/html"})
    assert page.headers["content-type"].startswith("text/html")
    assert '<a href="/metrics">' in page.text


def test_metrics_negotiate_openmetrics_and_gzip(
    replayed: tuple[Monitor, list[ClosedWindow]],
) -> None:
    client, _ = _client(replayed[0])
    plain = client.get("/metrics", headers={"Accept-Encoding": "identity"})
    assert plain.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert "content-encoding" not in plain.headers
    accept = "application/openmetrics-text; version=1.0.0; charset=utf-8"
    om = client.get("/metrics", headers={"Accept": accept, "Accept-Encoding": "identity"})
    assert om.headers["content-type"].startswith("application/openmetrics-text")
    assert om.text.endswith("# EOF\n")
    assert "retrieval_queries_total{" in om.text
    zipped = client.get("/metrics", headers={"Accept-Encoding": "gzip"})
    assert zipped.headers["content-encoding"] == "gzip"
    assert _samples(zipped.text) == _samples(plain.text)  # httpx decompressed it


def test_a_dead_thread_fails_liveness() -> None:
    client, state = _client(Monitor(MonitorConfig(), lambda: NOW))
    state.beat()
    assert client.get("/healthz").status_code == 200
    state.health.failed = "the window follower stopped: ValueError()"
    response = client.get("/healthz")
    assert response.status_code == 503
    assert response.json() == {
        "status": "failed",
        "reason": "the window follower stopped: ValueError()",
    }
