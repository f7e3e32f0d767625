"""A replay with audits, shared by the tests of the view's estimates and of their route
and series: simulated queries, and the demo's careful judge auditing the sampled ones an
hour later (the simulator's judge, as ``demo`` has it), except those of ``UNAUDITED``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from service.commands.demo import AUDIT_DELAY, DEMO_JUDGE
from service.core.monitor import Monitor, MonitorConfig
from service.replay import replay
from service.sim.audit import JudgeModel
from service.sim.simulator import SimulationConfig, generate
from service.stream.audit_join import AuditConfig
from service.stream.pipeline import PipelineConfig
from service.stream.windows import ClosedWindow
from service.times import HOUR_MS

RATE = 0.05
START_MS = 1_796_083_200_000
"""2026-12-01T00:00Z."""
NOW_MS = START_MS + 10 * 24 * HOUR_MS
UNAUDITED = "billing"
"""The segment whose queries get no audit: its rows have no estimate."""


def config() -> MonitorConfig:
    return MonitorConfig(pipeline=PipelineConfig(audit=AuditConfig(rate=RATE)))


def traffic(seed: int, hours: float = 3.0) -> SimulationConfig:
    """Simulated traffic whose sampled queries the demo's judge audits an hour later."""
    return SimulationConfig(
        seed=seed,
        start_ms=START_MS,
        duration_ms=int(hours * HOUR_MS),
        queries_per_hour=2000,
        audit_rate=RATE,
        judges=(JudgeModel(DEMO_JUDGE, delay_ms=AUDIT_DELAY),),
    )


def write_events(path: Path, sim: SimulationConfig) -> int:
    """The replay file: every event of ``sim``, less the audits of ``UNAUDITED``'s
    queries, in arrival order; returns the number of audits written."""
    skipped = set()
    audits = 0
    with path.open("w", encoding="utf-8") as out:
        for e in generate(sim):
            if e.topic == "queries" and e.event["segment"] == UNAUDITED:
                skipped.add(e.key)
            if e.event.get("signal") == "audit":
                if e.key in skipped:
                    continue
                audits += 1
            out.write(json.dumps({"topic": e.topic, "event": e.event}) + "\n")
    return audits


def replayed(path: Path) -> tuple[Monitor, list[ClosedWindow]]:
    """The monitor after replaying ``path`` (one process), and the windows it closed."""
    windows: list[ClosedWindow] = []
    monitor, _ = replay([str(path)], config(), windows.extend, now_ms=lambda: NOW_MS, reader=False)
    return monitor, windows


def rolling(windows: Sequence[ClosedWindow], span_ms: int, until_ms: int) -> list[ClosedWindow]:
    """The windows a rolling view of ``span_ms`` ending at ``until_ms`` holds (the rule)."""
    return [w for w in windows if until_ms - span_ms < w.end_ms <= until_ms]
