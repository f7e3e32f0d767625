"""A restart keeps the rolling views and the open regressions (read back from the windows topic)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from service.sim.simulator import generate
from service.times import rfc3339
from tests.integration.kafka_helpers import ServiceProcess, Topics, deploy_traffic, produce


def _regressions(service: ServiceProcess) -> dict[str, Any]:
    status, body = service.get("/api/v1/regressions")
    assert status == 200, body
    result: dict[str, Any] = json.loads(body)
    return result


def _opened(service: ServiceProcess) -> set[tuple[str, str, str, str, str]]:
    return {
        (r["retriever"], r["segment"], r["metric"], r["baseline"], r["opened_at"])
        for r in _regressions(service)["regressions"]
    }


def _rolling(service: ServiceProcess) -> dict[tuple[str, str], tuple[int, int]]:
    body = json.loads(service.get("/api/v1/rolling?window=24h")[1])
    return {(s["retriever"], s["segment"]): (s["queries"], s["labelled"]) for s in body["slices"]}


@pytest.mark.slow
def test_a_restart_keeps_rolling_views_and_open_regressions(topics: Topics, tmp_path: Path) -> None:
    sim = deploy_traffic(bad=True, seed=21)
    produce(topics, generate(sim))
    tested_from = rfc3339((sim.switch_at_ms or 0) + 90 * 60_000)

    def caught_up(service: ServiceProcess) -> bool:
        through = _regressions(service)["evaluated_through"]
        return through is not None and through >= tested_from

    first = ServiceProcess(topics, tmp_path / "first.log")
    first.wait_ready()
    first.wait_progressing(lambda: caught_up(first), "the detector to test the deploy")
    opened, rolling = _opened(first), _rolling(first)
    assert opened, first.tail()
    assert {r[0] for r in opened} == {"hybrid-v8"}
    assert first.stop() == 0

    second = ServiceProcess(topics, tmp_path / "second.log")
    second.wait_ready()
    second.wait_progressing(lambda: caught_up(second), "the detector to catch up again")
    # every input record was committed: nothing is re-read, all of it comes back from
    # the windows topic, and the detector reaches the same verdicts at the same times
    assert _opened(second) >= opened
    assert _rolling(second) == rolling
    assert second.stop() == 0
