"""Traffic shapes: a daily cycle in volume and quality, canaries, rollbacks, slow drift."""

from __future__ import annotations

import collections

import pytest

from service.errors import ConfigError
from service.sim.shape import TrafficShape
from service.sim.simulator import (
    DEFAULT_START_MS,
    HOUR_MS,
    HYBRID_V7,
    HYBRID_V8,
    SimulationConfig,
    simulate_queries,
)
from service.sim.truth import summarize

DAY_MS = 24 * HOUR_MS


def _sim(shape: TrafficShape, hours: float = 24, **kw: object) -> SimulationConfig:
    return SimulationConfig(
        seed=5,
        duration_ms=int(hours * HOUR_MS),
        queries_per_hour=1000,
        segments=(("default", 1.0),),
        shape=shape,
        **kw,  # type: ignore[arg-type]
    )


def test_the_daily_cycle_moves_volume_and_quality() -> None:
    shape = TrafficShape(volume_amplitude=0.5, quality_amplitude=0.1, peak_hour=15)
    per_hour: collections.Counter[int] = collections.Counter()
    found: dict[int, list[float]] = collections.defaultdict(list)
    for q in simulate_queries(_sim(shape)):
        hour = (q.timestamp_ms - DEFAULT_START_MS) // HOUR_MS
        per_hour[hour] += 1
        found[hour].append(sum(c in q.relevant for c in q.results) / len(q.relevant))
    peak, night = per_hour[15], per_hour[3]
    assert peak / night == pytest.approx(1.5 / 0.5, rel=0.25)  # 1,500 against 500 an hour
    assert sum(per_hour.values()) == pytest.approx(24 * 1000, rel=0.03)  # the mean is kept
    peak_find = sum(found[15]) / len(found[15])
    night_find = sum(found[3]) / len(found[3])
    assert peak_find - night_find == pytest.approx(0.2, abs=0.05)


def test_a_canary_serves_its_share_until_promoted() -> None:
    switch = DEFAULT_START_MS + 2 * HOUR_MS
    promote = switch + 2 * HOUR_MS
    shape = TrafficShape(canary_share=0.2, promote_at_ms=promote)
    sim = _sim(shape, hours=6, after=HYBRID_V8, switch_at_ms=switch)
    served: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for q in simulate_queries(sim):
        phase = (
            "before"
            if q.timestamp_ms < switch
            else "canary"
            if q.timestamp_ms < promote
            else "after"
        )
        served[phase][q.retriever] += 1
    assert set(served["before"]) == {HYBRID_V7.name}
    share = served["canary"][HYBRID_V8.name] / sum(served["canary"].values())
    assert share == pytest.approx(0.2, abs=0.03)
    assert set(served["after"]) == {HYBRID_V8.name}


def test_a_rollback_brings_the_old_version_back() -> None:
    switch = DEFAULT_START_MS + HOUR_MS
    back = switch + HOUR_MS
    sim = _sim(TrafficShape(rollback_at_ms=back), hours=3, after=HYBRID_V8, switch_at_ms=switch)
    versions = {
        (q.timestamp_ms >= back, q.timestamp_ms >= switch, q.retriever)
        for q in simulate_queries(sim)
    }
    assert versions == {
        (False, False, "hybrid-v7"),
        (False, True, "hybrid-v8"),
        (True, True, "hybrid-v7"),
    }


def test_drift_lowers_the_find_rate_slowly() -> None:
    start = DEFAULT_START_MS + 2 * HOUR_MS
    shape = TrafficShape(drift_start_ms=start, drift_ms=6 * HOUR_MS, drift_drop=0.3)
    assert shape.find_rate_shift(start) == 0.0
    assert shape.find_rate_shift(start + 3 * HOUR_MS) == pytest.approx(-0.15)
    assert shape.find_rate_shift(start + 9 * HOUR_MS) == pytest.approx(-0.3)
    queries = list(simulate_queries(_sim(shape, hours=10)))
    early = summarize(q for q in queries if q.timestamp_ms < start)
    late = summarize(q for q in queries if q.timestamp_ms >= start + 6 * HOUR_MS)
    assert early[HYBRID_V7.name].recall - late[HYBRID_V7.name].recall > 0.15


def test_a_flat_shape_changes_nothing_but_the_draws() -> None:
    flat = [q.retriever for q in simulate_queries(_sim(TrafficShape(), hours=1))]
    assert set(flat) == {HYBRID_V7.name}
    assert len(flat) == pytest.approx(1000, rel=0.1)


def test_shapes_are_validated() -> None:
    with pytest.raises(ConfigError, match="volume_amplitude"):
        TrafficShape(volume_amplitude=1.0)
    with pytest.raises(ConfigError, match="canary_share"):
        TrafficShape(canary_share=0.0)
    with pytest.raises(ConfigError, match="drift_drop"):
        TrafficShape(drift_drop=1.5)
