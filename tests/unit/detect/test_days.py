"""A deploy's baseline over several previous days (service/detect/days.py): the days'
values pooled, their day-to-day variation counted, so that more days find a drop sooner
and a weekly pattern does not page."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from service.detect import days as days_module
from service.detect.days import between_day_variance, day_baseline, pooled_days
from service.detect.detector import Detector
from service.detect.model import DetectorConfig
from service.metrics.aggregates import Moments, aggregate
from service.stream.windows import ClosedWindow
from tests.unit.detect.test_detector import CONFIG, T0, D, traffic

SEVEN = replace(CONFIG, baseline_days=7)


def _moments(values: np.ndarray) -> Moments:
    return aggregate({"m": values})["m"]


def _day(rng: np.random.Generator, p: float, n: int) -> Moments:
    return _moments((rng.random(n) < p).astype(np.float64))


def test_one_day_is_its_sums_as_they_are() -> None:
    day = _day(np.random.default_rng(1), 0.8, 500)
    assert pooled_days([day]) == day
    single = Moments(1, day.sum_fx // day.count, day.sum_fx // day.count)
    assert pooled_days([day, Moments(), single]) == day + single  # (one day with a variance)


def test_the_between_day_variance_is_dersimonian_lairds() -> None:
    """Against the estimator written out in numpy, on days of unequal size and spread."""
    rng = np.random.default_rng(2)
    for trial in range(20):
        days = [
            _moments(
                np.clip(
                    rng.normal(0.6 + rng.normal(0, 0.05 * trial / 20), 0.25, rng.integers(20, 400)),
                    0,
                    1,
                )
            )
            for _ in range(7)
        ]
        means = np.array([m.mean for m in days])
        u = np.array([m.count / m.variance for m in days])
        centre = (u * means).sum() / u.sum()
        q = (u * (means - centre) ** 2).sum()
        expected = max(0.0, (q - 6) / (u.sum() - (u * u).sum() / u.sum()))
        assert between_day_variance(days) == pytest.approx(expected, rel=1e-9, abs=1e-15)


def test_days_pool_their_values_and_count_the_day_effect() -> None:
    """The pooled mean is count-weighted; its variance (the sample variance over the count)
    is the days' within-day share plus the day effect, today's included."""
    rng = np.random.default_rng(3)
    days = [_day(rng, p, n) for p, n in [(0.70, 300), (0.80, 500), (0.75, 200), (0.90, 400)]]
    pooled = pooled_days(days)
    n = sum(m.count for m in days)
    assert pooled.count == n
    assert pooled.mean == pytest.approx(sum(m.sum for m in days) / n, rel=1e-12)
    between = between_day_variance(days)
    assert between > 0.001  # days 10 and 20 points apart: a real day effect
    within = sum((m.count / n) ** 2 * (m.variance / m.count + between) for m in days)
    assert pooled.variance / pooled.count == pytest.approx(between + within, rel=1e-9)


def _z_variance(effect: float, reps: int = 400, seed: int = 4) -> tuple[float, float]:
    """The variance of the z of a no-change comparison (today against 7 previous days, a
    day effect of standard deviation ``effect``): with the days pooled here, and with
    their plain sums (as if the days were one sample)."""
    rng = np.random.default_rng(seed)
    pooled, plain = [], []
    for _ in range(reps):
        days = [_day(rng, 0.8 + rng.normal(0, effect), 300) for _ in range(8)]
        today, before = days[0], days[1:]
        for base, out in ((pooled_days(before), pooled), (sum(before, Moments()), plain)):
            v = today.variance / today.count + base.variance / base.count
            out.append((today.mean - base.mean) / v**0.5)
    return float(np.var(pooled)), float(np.var(plain))


def test_a_no_change_comparison_keeps_its_spread_with_day_effects() -> None:
    """Without day effects both are near 1; with day effects near the within-day noise
    (a day's mean varies by 2.3 points from sampling alone, here 3 points more), the plain
    sums' z spreads almost three times as wide, the pooled days' stays near 1."""
    calm, calm_plain = _z_variance(0.0)
    assert 0.6 < calm < 1.25
    assert 0.6 < calm_plain < 1.25
    stormy, stormy_plain = _z_variance(0.03)
    assert stormy < 1.5
    assert stormy_plain > 2.2


def test_the_flat_row_is_each_metrics_pooled_days() -> None:
    rng = np.random.default_rng(5)
    a = [_day(rng, 0.8, 200) for _ in range(3)]
    b = [_day(rng, 0.4, 100) for _ in range(3)]
    rows = [
        [x.count, x.sum_fx, x.sum_sq_fx, y.count, y.sum_fx, y.sum_sq_fx]
        for x, y in zip(a, b, strict=True)
    ]
    m_a, m_b = pooled_days(a), pooled_days(b)
    assert day_baseline(rows, 2) == [
        *(m_a.count, m_a.sum_fx, m_a.sum_sq_fx),
        *(m_b.count, m_b.sum_fx, m_b.sum_sq_fx),
    ]


# -- in the detector ------------------------------------------------------------------------


def _week(quality: list[float], seed: int) -> list[ClosedWindow]:
    """v7 for a week, day ``i`` at ``quality[i]`` (40 values a window)."""
    return [
        w
        for i, p in enumerate(quality)
        for w in traffic("v7", T0 + i * D, 24, p, 40, seed=seed + i)
    ]


def _first_opened(windows: list[ClosedWindow], config: DetectorConfig = SEVEN) -> int | None:
    detector = Detector(config)
    detector.add(windows)
    detector.advance(max(w.end_ms for w in windows))
    times = [r.opened_ms for r in detector.opened if r.opening.retriever == "v8"]
    return min(times) if times else None


def test_more_days_find_a_drop_sooner() -> None:
    """v8, 5 points worse, replaces v7 after a week: against seven days it opens earlier
    than against one (the baseline's noise is a seventh of it)."""
    switch = T0 + 7 * D + 2 * 3_600_000
    windows = _week([0.85] * 7, seed=10) + traffic("v7", T0 + 7 * D, 2, 0.85, 40, seed=20)
    windows += traffic("v8", switch, 10, 0.80, 40, seed=21)
    one, seven = _first_opened(windows, replace(CONFIG, baseline_days=1)), _first_opened(windows)
    assert one is not None
    assert seven is not None
    assert seven < one


def test_a_weekly_pattern_does_not_page(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two days of the week are 8 points better. A version as good as v7 on a weekday is
    2.3 points below the week's mean: with the day effect counted that is within the
    week's spread; counted as no more than noise (the days as one sample) it pages, and so
    does the one previous day when it was the better day."""
    weekly = [0.85, 0.85, 0.85, 0.85, 0.93, 0.93, 0.85]
    windows = _week(weekly, seed=30) + traffic("v8", T0 + 7 * D, 24, 0.85, 40, seed=40)
    assert _first_opened(windows) is None
    assert _first_opened(windows, replace(CONFIG, baseline_days=1)) is None  # (a weekday)
    better_yesterday = _week([0.85, 0.85, 0.85, 0.85, 0.85, 0.93, 0.93], seed=30)
    better_yesterday += traffic("v8", T0 + 7 * D, 24, 0.85, 40, seed=40)
    assert _first_opened(better_yesterday) is None
    assert _first_opened(better_yesterday, replace(CONFIG, baseline_days=1)) is not None
    monkeypatch.setattr(days_module, "between_day_variance", lambda days: 0.0)
    assert _first_opened(windows) is not None


def _drift_opened(windows: list[ClosedWindow], config: DetectorConfig) -> list[int]:
    detector = Detector(config)
    detector.add(windows)
    detector.advance(max(w.end_ms for w in windows))
    return [r.opened_ms for r in detector.opened if r.opening.kind == "drift"]


def test_a_weekly_pattern_is_not_drift() -> None:
    """A slice whose weekend days are 8 points better, for eight days: each day's drift
    tests against the days before open nothing; against the one day before, the first
    weekday after the weekend is a drift."""
    windows = _week([0.85, 0.85, 0.85, 0.85, 0.85, 0.93, 0.93], seed=50)
    windows += traffic("v7", T0 + 7 * D, 24, 0.85, 40, seed=60)
    assert _drift_opened(windows, SEVEN) == []
    monday = _drift_opened(windows, replace(CONFIG, baseline_days=1))
    assert monday
    assert all(T0 + 7 * D < t <= T0 + 8 * D for t in monday)
