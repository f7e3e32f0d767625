"""The detector's false-alarm budget (service/detect/budget.py): the shares a deploy
spends never sum above ``alpha`` (``REGRESSION_ALPHA``), and drift's never above its
budget per 30 days, read from the families the detector actually tests."""

from __future__ import annotations

import pytest

from service.detect.budget import (
    DRIFT_BUDGET_SPAN_MS,
    drift_alpha,
    primary_alpha,
    segment_alpha,
    slice_level,
)
from service.detect.detector import Detector
from service.detect.model import POOLED_SEGMENT, DetectorConfig
from service.stream.windows import ClosedWindow
from tests.unit.detect.test_detector import CONFIG, T0, H, W, traffic

ROUNDING = 1 + 1e-12
"""A sum of equal float shares may exceed its total by an ulp or two."""


def _deploy(segments: int, canary: bool) -> list[ClosedWindow]:
    """v8 replaces v7 in ``segments`` segments at T0 + 6h: at once, or after 3 hours
    beside it (a canary at a fifth of the traffic, then promoted)."""
    switch = T0 + 6 * H
    windows: list[ClosedWindow] = []
    for i in range(segments):
        seg = f"seg{i}"
        windows += traffic("v7", T0, 6, 0.85, 40, seed=10 * i + 1, segment=seg)
        if canary:
            windows += traffic("v7", switch, 3, 0.85, 40, seed=10 * i + 2, segment=seg)
            windows += traffic("v8", switch, 3, 0.85, 10, seed=10 * i + 3, segment=seg)
            windows += traffic("v8", switch + 3 * H, 3, 0.85, 50, seed=10 * i + 4, segment=seg)
        else:
            windows += traffic("v8", switch, 6, 0.85, 40, seed=10 * i + 5, segment=seg)
    return windows


def _spent(windows: list[ClosedWindow], config: DetectorConfig) -> dict[str, dict[str, float]]:
    """Segment -> kind -> the largest family alpha the detector tested v8 with there,
    looking at every boundary in turn (each phase of each comparison is one share)."""
    detector = Detector(config)
    detector.add(windows)
    spent: dict[str, dict[str, float]] = {}
    start = min(w.start_ms for w in windows)
    for boundary in range(start + W, max(w.end_ms for w in windows) + W, W):
        detector.advance(boundary)
        for c in detector.latest.values():
            if c.retriever == "v8":
                kinds = spent.setdefault(c.segment, {})
                kinds[c.kind] = max(kinds.get(c.kind, 0.0), c.family_alpha)
    return spent


@pytest.mark.parametrize("canary", [False, True])
@pytest.mark.parametrize("segments", [1, 2, 3])
def test_a_deploy_spends_alpha_in_all_and_no_more(segments: int, canary: bool) -> None:
    """A deploy's comparisons, each phase at the largest family alpha the detector
    tested it with: the segments' own tests and the pooled primary one sum to ``alpha``
    (not ``(k + 1) alpha / 2`` as when each had half), whatever the number of segments;
    a deploy to one segment spends it all on that segment's test."""
    spent = _spent(_deploy(segments, canary), CONFIG)
    names = {f"seg{i}" for i in range(segments)}
    assert set(spent) == names | ({POOLED_SEGMENT} if segments > 1 else set())
    expected = {"canary", "deploy"} if canary else {"deploy"}
    for segment in names:
        assert set(spent[segment]) == expected  # every phase was tested (and counted)
    total = sum(alpha for kinds in spent.values() for alpha in kinds.values())
    assert total == pytest.approx(CONFIG.alpha, rel=1e-12)
    if segments > 1:  # the primary test has the most
        primary = spent[POOLED_SEGMENT]
        assert all(primary[k] > 2 * spent["seg0"][k] for k in expected)


@pytest.mark.parametrize("canary", [False, True])
@pytest.mark.parametrize("segments", range(1, 9))
def test_the_budget_module_splits_alpha_within_a_deploy(segments: int, canary: bool) -> None:
    alpha = 0.01
    phases = [(True, True), (False, True)] if canary else [(False, False)]
    own = sum(segment_alpha(alpha, c, w, segments, alone=False) for c, w in phases)
    primary = sum(primary_alpha(alpha, c, w) for c, w in phases)
    assert segments * own + primary == pytest.approx(alpha, rel=1e-12)
    # the only segment so far carries the pooled test's share: no more than both
    for c, w in phases:
        alone = segment_alpha(alpha, c, w, segments, alone=True)
        own_phase = segment_alpha(alpha, c, w, segments, alone=False)
        assert alone == pytest.approx(own_phase + primary_alpha(alpha, c, w), rel=1e-12)
    if canary:  # the canary phase has the larger part
        canary_phase, after = primary_alpha(alpha, True, True), primary_alpha(alpha, False, True)
        assert canary_phase == pytest.approx(2 * after)


def test_drifts_shares_never_sum_above_its_budget() -> None:
    """Four slices with a day of history: each drift period's family spends the period's
    share, split over its slices; the periods of 30 days spend at most the budget."""
    segments = [f"seg{s}" for s in range(4)]
    windows = [
        w
        for i, seg in enumerate(segments)
        for w in traffic("v7", T0, 40, 0.85, 20, seed=10 + i, segment=seg)
    ]
    detector = Detector(CONFIG)
    detector.add(windows)
    detector.advance(max(w.end_ms for w in windows))
    drift = [c for c in detector.latest.values() if c.kind == "drift"]
    assert {c.segment for c in drift} == set(segments)
    family = max(c.family_alpha for c in drift)
    periods = DRIFT_BUDGET_SPAN_MS // CONFIG.drift_period_ms
    assert periods * family <= CONFIG.drift_budget * ROUNDING
    levels = {c.segment: c.level for c in drift}
    assert sum(levels.values()) <= family * ROUNDING


@pytest.mark.parametrize("period_h", [1, 2, 3, 6, 8, 12, 24])
@pytest.mark.parametrize("budget", [0.1, 0.5, 1.0, 7.0, 30.0])
@pytest.mark.parametrize("slices", [1, 3, 7, 64])
def test_the_budget_module_splits_drifts_budget(period_h: int, budget: float, slices: int) -> None:
    period_ms = period_h * H
    share = drift_alpha(budget, period_ms)
    assert (DRIFT_BUDGET_SPAN_MS // period_ms) * share <= budget * ROUNDING
    assert slices * slice_level(share, slices) <= share * ROUNDING
