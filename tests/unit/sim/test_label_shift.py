"""Label shifts: citations or clicks become rarer from a time on while retrieval holds, and
nothing before that time changes."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable

import pytest

from service.errors import ConfigError
from service.sim.shape import TrafficShape
from service.sim.simulator import (
    DEFAULT_START_MS,
    HYBRID_V8,
    SimEvent,
    SimQuery,
    SimulationConfig,
    generate,
    simulate_queries,
)
from service.times import HOUR_MS

RUN = SimulationConfig(duration_ms=3 * HOUR_MS, after=HYBRID_V8)
SHIFT_MS = DEFAULT_START_MS + HOUR_MS


def labels_per_query(queries: Iterable[SimQuery]) -> dict[str, float]:
    """Citations and first-rank clicks per query. Rank 1 is always examined, so its clicks
    show the click probability itself (later ranks are examined more often when the user,
    clicking less, stops less)."""
    counts: collections.Counter[str] = collections.Counter()
    n = 0
    for query in queries:
        n += 1
        for event in query.events[1:]:
            signal = event.event["signal"]
            if signal == "citation" or (
                signal == "click" and event.event["chunk_id"] == query.results[0]
            ):
                counts[str(signal)] += 1
    return {signal: count / n for signal, count in counts.items()}


def before(events: Iterable[SimEvent], at_ms: int) -> list[SimEvent]:
    """The events of the queries before ``at_ms`` (their feedback may come later)."""
    events = list(events)
    early = {e.key for e in events if e.topic == "queries" and e.timestamp_ms < at_ms}
    return [e for e in events if e.key in early]


@pytest.fixture(scope="module")
def plain() -> list[SimQuery]:
    return list(simulate_queries(RUN))


@pytest.mark.parametrize(("signal", "other"), [("citation", "click"), ("click", "citation")])
def test_a_halving_halves_one_source_from_its_time_and_changes_nothing_before(
    signal: str, other: str, plain: list[SimQuery]
) -> None:
    field = "citations" if signal == "citation" else "clicks"
    shape = TrafficShape(**{f"{field}_scale": 0.5, f"{field}_scale_at_ms": SHIFT_MS})  # type: ignore[arg-type]
    shifted = dataclasses.replace(RUN, shape=shape)
    assert before(generate(shifted), SHIFT_MS) == before(generate(RUN), SHIFT_MS)

    queries = list(simulate_queries(shifted))
    plain_late = labels_per_query(q for q in plain if q.timestamp_ms >= SHIFT_MS)
    late = labels_per_query(q for q in queries if q.timestamp_ms >= SHIFT_MS)
    early = labels_per_query(q for q in queries if q.timestamp_ms < SHIFT_MS)
    assert abs(late[signal] / plain_late[signal] - 0.5) < 0.05, late[signal] / plain_late[signal]
    assert abs(late[signal] / early[signal] - 0.5) < 0.06, late[signal] / early[signal]
    assert abs(late[other] / plain_late[other] - 1.0) < 0.06  # the other source holds


def test_a_shift_on_a_shaped_run_changes_nothing_before_its_time() -> None:
    canary = TrafficShape(volume_amplitude=0.3, canary_share=0.2)
    shifted = dataclasses.replace(canary, clicks_scale=0.5, clicks_scale_at_ms=SHIFT_MS)
    assert canary.shapes_traffic
    assert shifted.shapes_traffic
    runs = [dataclasses.replace(RUN, shape=shape) for shape in (canary, shifted)]
    assert before(generate(runs[0]), SHIFT_MS) == before(generate(runs[1]), SHIFT_MS)
    assert list(generate(runs[0])) != list(generate(runs[1]))


def test_only_a_pure_label_shift_skips_the_shape_draws() -> None:
    assert TrafficShape().shapes_traffic  # the flat shape draws, as it always has
    assert TrafficShape(clicks_scale=0.5).shapes_traffic  # no time: no shift
    assert TrafficShape(citations_scale=0.5, citations_scale_at_ms=0).shifts_labels
    assert not TrafficShape(citations_scale=0.5, citations_scale_at_ms=0).shapes_traffic
    shape = TrafficShape(clicks_scale=0.25, clicks_scale_at_ms=SHIFT_MS)
    assert (shape.clicks_factor(SHIFT_MS - 1), shape.clicks_factor(SHIFT_MS)) == (1.0, 0.25)
    assert shape.citations_factor(SHIFT_MS) == 1.0


@pytest.mark.parametrize("field", ["citations_scale", "clicks_scale"])
@pytest.mark.parametrize("value", [-0.1, 1.5])
def test_bad_scales_are_rejected(field: str, value: float) -> None:
    with pytest.raises(ConfigError, match=field):
        TrafficShape(**{field: value})  # type: ignore[arg-type]
