"""Property 18: the OpenAPI surface survives schemathesis fuzzing with no server error.

Every operation of ``/openapi.json`` is called with a few hundred generated requests
(valid and invalid parameters) against an app over a pipeline holding real data: closed
windows of two versions and an open regression. The service is live and ready, so any
5xx is a bug (a 503 from a stalled loop is by design, and is tested in test_api.py).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from service.core.monitor import MonitorConfig
from service.core.state import ServiceState
from service.http.app import create_app
from service.replay import replay
from service.sim.simulator import (
    HYBRID_V7,
    HYBRID_V8,
    SimulationConfig,
    generate,
    write_jsonl,
)
from service.times import HOUR_MS

START = 1_796_083_200_000
NOW = START + 6 * HOUR_MS


def _app() -> object:
    sim = SimulationConfig(
        seed=3,
        start_ms=START,
        duration_ms=5 * HOUR_MS,
        queries_per_hour=1200,
        before=HYBRID_V7,
        after=replace(HYBRID_V8, rank_decay=0.75),
        switch_at_ms=START + 3 * HOUR_MS,
        quality_drop=0.15,
    )
    path = Path(__file__).parent / ".fuzz-events.jsonl"
    try:
        write_jsonl(generate(sim), path)
        monitor, _ = replay([str(path)], MonitorConfig(), lambda _: None, now_ms=lambda: NOW)
    finally:
        path.unlink(missing_ok=True)
    state = ServiceState(monitor, lambda: NOW, needs_assignment=False)
    state.beat()
    state.health.last_poll_ms = NOW
    state.health.assigned = 1
    return create_app(state)


APP = _app()
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)
# valid requests and deliberately invalid ones (wrong types, out-of-range values)
schema.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE])


def test_the_fuzzed_app_has_data_and_an_open_regression() -> None:
    regressions = APP.state.service.detector.open  # type: ignore[attr-defined]
    assert regressions, "the fuzz target would not exercise /api/v1/regressions"


@pytest.mark.slow
@schema.parametrize()
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_errors(case: schemathesis.Case) -> None:
    case.call_and_validate(checks=[not_a_server_error])
