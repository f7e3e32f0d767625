"""``/api/v1/judges`` through replay: a careful judge and a noisy LLM judge audit the same
sample; their agreement and kappa follow the LLM judge's confusion rate, and each judge's
agreement with the live labels shows what the live labels miss."""

from __future__ import annotations

from dataclasses import replace

import pytest
from fastapi.testclient import TestClient

from service.core.monitor import Monitor, MonitorConfig
from service.core.state import ServiceState
from service.http.app import create_app
from service.replay import replay
from service.sim.audit import JudgeModel
from service.sim.simulator import SimulationConfig, generate, write_jsonl
from service.stream.audit_join import AuditConfig
from service.stream.pipeline import PipelineConfig
from service.times import DAY_MS, HOUR_MS

START = 1_794_000_000_000
NOW = START + 10 * DAY_MS
CAREFUL = JudgeModel("human:careful", delay_ms=(10 * 60_000, HOUR_MS))
NOISY = JudgeModel("llm:judge", confusion_rate=0.2, delay_ms=(10 * 60_000, HOUR_MS))


@pytest.fixture(scope="module")
def monitor(tmp_path_factory: pytest.TempPathFactory) -> Monitor:
    path = tmp_path_factory.mktemp("judges") / "events.jsonl"
    sim = SimulationConfig(
        seed=21,
        start_ms=START,
        duration_ms=4 * HOUR_MS,
        queries_per_hour=2000,
        audit_rate=0.1,
        judges=(CAREFUL, NOISY),
    )
    write_jsonl(generate(sim), path)
    config = MonitorConfig(pipeline=replace(PipelineConfig(), audit=AuditConfig(rate=0.1)))
    replayed, _ = replay([str(path)], config, lambda _: None, now_ms=lambda: NOW)
    return replayed


def _pairs(monitor: Monitor, query: str = "") -> dict[tuple[str, str], dict[str, object]]:
    client = TestClient(create_app(ServiceState(monitor, lambda: NOW, needs_assignment=False)))
    response = client.get(f"/api/v1/judges?window=24h{query}")
    assert response.status_code == 200, response.text
    return {(p["first"], p["second"]): p for p in response.json()["pairs"]}


def test_agreement_follows_the_noisy_judges_confusion(monitor: Monitor) -> None:
    pairs = _pairs(monitor)
    assert set(pairs) == {
        ("human:careful", "llm:judge"),
        ("human:careful", "live"),
        ("llm:judge", "live"),
    }
    both = pairs["human:careful", "llm:judge"]
    assert isinstance(both["count"], int)
    assert both["count"] > 5000
    # the LLM judge gets 20% of the chunks wrong: agreement 0.8 with the careful one
    assert both["agreement"] == pytest.approx(0.8, abs=0.02)
    assert isinstance(both["kappa"], float)
    assert 0.2 < both["kappa"] < 0.6
    table = [both[k] for k in ("both_relevant", "first_only", "second_only", "neither")]
    assert sum(table) == both["count"]  # type: ignore[arg-type]
    # the live labels miss relevant chunks the careful judge finds: it calls chunks
    # relevant that the live labels do not, far more than the other way round
    live = pairs["human:careful", "live"]
    assert live["first_only"] > 3 * live["second_only"]  # type: ignore[operator]


def test_a_judge_filter_and_a_bad_window(monitor: Monitor) -> None:
    only = _pairs(monitor, "&judge=llm:judge")
    assert set(only) == {("human:careful", "llm:judge"), ("llm:judge", "live")}
    client = TestClient(create_app(ServiceState(monitor, lambda: NOW, needs_assignment=False)))
    assert client.get("/api/v1/judges?window=soon").status_code == 422
