"""Label sources over HTTP: the rolling views merge each window's ``sources``;
``/api/v1/rolling`` gives each source's labelled share and ``/metrics`` exports it as
``retrieval_rolling_source_labelled_ratio``, on hand-made traffic with known numbers."""

from __future__ import annotations

from dataclasses import replace

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from service.core.monitor import Monitor, MonitorConfig
from service.core.state import ServiceState
from service.http.app import create_app
from service.stream.events import feedback_from, query_from
from service.stream.rolling import ClosedWindows
from service.stream.windows import ClosedWindow
from tests.unit.samples import T0, W, window

NOW = T0 + 10 * 86_400_000


def test_slice_totals_merge_sources_over_partitions_and_windows() -> None:
    closed = ClosedWindows(W, 3600_000)
    closed.add(
        [
            _with(window(T0, 4), click=3, citation=1, judgment=0),  # 5 queries
            _with(window(T0, 2, partition=1), click=1, citation=2, judgment=1),  # 3 queries
            _with(window(T0 + W, 1), click=0, citation=1, judgment=0),  # 2 queries
        ]
    )
    [(key, totals)] = closed.rolling(2 * W, T0 + 2 * W).items()
    assert key == ("v1", "docs")
    assert totals.queries == 10
    assert totals.sources == {"click": 4, "citation": 4, "judgment": 1}
    assert totals.source_labelled_share == {"click": 0.4, "citation": 0.4, "judgment": 0.1}
    [(_, first)] = closed.rolling(W, T0 + W).items()  # the first window only
    assert first.sources == {"click": 4, "citation": 3, "judgment": 1}
    assert first.source_labelled_share == {"click": 0.5, "citation": 0.375, "judgment": 0.125}
    # a window of audits alone has no finalised query: no share, not zero
    audits_only = ClosedWindows(W, 3600_000)
    audits_only.add([ClosedWindow("v1", "docs", 0, T0, T0 + W, 0, 0)])
    [(_, none)] = audits_only.rolling(W, T0 + W).items()
    assert none.source_labelled_share == {"click": None, "citation": None, "judgment": None}


def _with(w: ClosedWindow, **sources: int) -> ClosedWindow:
    return replace(w, sources=sources)


def _monitor() -> Monitor:
    """Slice r1/default: 5 queries, clicks on 2, a citation on 1, a judgment >= 1 on 1 (and
    one of grade 0, and one click outside the attribution window); slice r2/default: one
    query, cited."""
    monitor = Monitor(MonitorConfig(), lambda: NOW)
    p = monitor.pipeline
    p.assign(0)
    offsets = [0, 0]
    s = T0 // 1000

    def q(query_id: str, retriever: str = "r1") -> None:
        event = query_from(
            {"query_id": query_id, "timestamp": s, "retriever": retriever, "results": ["a", "b"]}
        )
        assert p.query(0, offsets[0], event) is None
        offsets[0] += 1

    def fb(query_id: str, signal: str, at: int = 5, **extra: int) -> None:
        body = {"query_id": query_id, "timestamp": s + at, "chunk_id": "a", "signal": signal}
        assert p.feedback(0, offsets[1], feedback_from({**body, **extra})) is None
        offsets[1] += 1

    fb("q3", "judgment", grade=3)  # before its query: it waits
    q("q1")
    fb("q1", "click")
    fb("q1", "citation")
    q("q2")
    fb("q2", "click", dwell_ms=50_000)
    q("q3")
    q("q4")
    fb("q4", "judgment", grade=0)
    q("q5")
    fb("q5", "click", at=2 * 3600)  # outside the 30 min attribution window
    q("x1", retriever="r2")
    fb("x1", "citation")
    p.deliver(p.finish())
    return monitor


@pytest.fixture(scope="module")
def client() -> TestClient:
    return TestClient(create_app(ServiceState(_monitor(), lambda: NOW)))


def test_rolling_gives_each_sources_labelled_share(client: TestClient) -> None:
    body = client.get("/api/v1/rolling", params={"window": "24h"}).json()
    rows = {(s["retriever"], s["segment"]): s for s in body["slices"]}
    r1, r2 = rows["r1", "default"], rows["r2", "default"]
    assert (r1["queries"], r1["labelled"]) == (5, 3)
    assert r1["source_labelled_share"] == {"click": 0.4, "citation": 0.2, "judgment": 0.2}
    assert (r2["queries"], r2["labelled"]) == (1, 1)
    assert r2["source_labelled_share"] == {"click": 0.0, "citation": 1.0, "judgment": 0.0}
    [listed] = client.get("/api/v1/windows", params={"retriever": "r1"}).json()["windows"]
    assert listed["source_labelled_share"] == r1["source_labelled_share"]


def test_the_ratio_series_exports_the_same_shares(client: TestClient) -> None:
    text = client.get("/metrics").text
    [family] = [
        f
        for f in text_string_to_metric_families(text)
        if f.name == "retrieval_rolling_source_labelled_ratio"
    ]
    assert family.type == "gauge"
    got = {
        (s.labels["retriever"], s.labels["source"]): s.value
        for s in family.samples
        if s.labels["window"] == "24h"
    }
    assert got == {
        ("r1", "click"): 0.4,
        ("r1", "citation"): 0.2,
        ("r1", "judgment"): 0.2,
        ("r2", "click"): 0.0,
        ("r2", "citation"): 1.0,
        ("r2", "judgment"): 0.0,
    }
    assert {s.labels["segment"] for s in family.samples} == {"default"}
    assert {s.labels["window"] for s in family.samples} <= {"15m", "1h", "24h"}
