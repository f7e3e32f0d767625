"""The trend baseline of a deploy without a day of history (:mod:`service.detect.trend`):
its jump is the least-squares one, its variance that of the fit, and a straight line
across the switch biases nothing."""

from __future__ import annotations

import numpy as np
import pytest

from service.detect.trend import WindowRow, trend_baseline, trend_moments
from service.metrics.aggregates import SCALE, Moments

W = 300_000
H = 3_600_000


def _row(values: np.ndarray) -> tuple[int, int, int]:
    """One window's exact (count, sum_fx, sum_sq_fx) of one metric."""
    fx = np.round(values * SCALE).astype(object)
    return len(values), int(sum(fx)), int(sum(v * v for v in fx) // SCALE)


def _side(
    rng: np.random.Generator, lo_ms: int, hi_ms: int, mean_at: float, slope: float
) -> tuple[list[WindowRow], list[tuple[float, np.ndarray]]]:
    """Windows of normal values around ``mean_at + slope * hours`` (20 to 60 a window)."""
    rows: list[WindowRow] = []
    raw = []
    for start in range(lo_ms, hi_ms, W):
        x = (start + W / 2) / H
        values = rng.normal(mean_at + slope * x, 0.3, int(rng.integers(20, 61)))
        rows.append((start, _row(values)))
        raw.append((x, values))
    return rows, raw


def _delta_and_variance(before: list[WindowRow], after: list[WindowRow]) -> tuple[float, float]:
    """The test's difference and variance, as the mixture SPRT computes them."""
    base = trend_moments(before, after, 0, W)
    cand = Moments(*(sum(r[1][k] for r in after) for k in range(3)))
    assert base.mean is not None
    assert base.variance is not None
    assert cand.mean is not None
    assert cand.variance is not None
    return cand.mean - base.mean, base.variance / base.count + cand.variance / cand.count


def test_the_jump_and_its_variance_are_those_of_the_least_squares_fit() -> None:
    """Against the fit of every value (intercept, common slope, jump at the switch): the
    same jump, and as its variance sum_i c_i^2 s_side^2, with c the jump's weights and
    each side's sample variance."""
    rng = np.random.default_rng(3)
    before, raw_b = _side(rng, -4 * H, 0, 0.7, -0.02)
    after, raw_c = _side(rng, 0, 3 * H, 0.6, -0.02)
    x = np.concatenate([np.full(len(v), t) for t, v in raw_b + raw_c])
    y = np.concatenate([v for _, v in raw_b + raw_c])
    new = np.concatenate(
        [np.full(len(v), float(i >= len(raw_b))) for i, (_, v) in enumerate(raw_b + raw_c)]
    )
    design = np.column_stack([np.ones_like(x), x, new])
    weights = np.linalg.pinv(design)[2]  # the jump = weights @ y
    var_b = np.var(np.concatenate([v for _, v in raw_b]), ddof=1)
    var_c = np.var(np.concatenate([v for _, v in raw_c]), ddof=1)
    expected_var = float(np.sum(weights**2 * np.where(new == 1.0, var_c, var_b)))
    delta, variance = _delta_and_variance(before, after)
    assert delta == pytest.approx(float(weights @ y), abs=1e-9)
    assert variance == pytest.approx(expected_var, rel=1e-6)
    # and far above the plain two-sample variance: the slope is estimated too
    assert variance > 3 * (
        var_b / sum(len(v) for _, v in raw_b) + var_c / sum(len(v) for _, v in raw_c)
    )


def test_a_line_across_the_switch_is_no_jump_and_the_variance_is_honest() -> None:
    """Many streams on one falling line (1.5 points an hour), no change at the switch:
    the jump averages 0 (a plain difference of means would average -0.06) and its
    spread is the variance the test is given."""
    rng = np.random.default_rng(7)
    deltas, variances = [], []
    for _ in range(400):
        before, _ = _side(rng, -4 * H, 0, 0.7, -0.015)
        after, _ = _side(rng, 0, 4 * H, 0.7, -0.015)
        delta, variance = _delta_and_variance(before, after)
        deltas.append(delta)
        variances.append(variance)
    d = np.array(deltas)
    assert abs(d.mean()) < 3 * d.std() / np.sqrt(len(d))
    assert d.var() / np.mean(variances) == pytest.approx(1.0, abs=0.15)


def test_a_side_without_values_or_slope_gives_an_empty_baseline() -> None:
    one_window = [(0, _row(np.array([0.5, 0.7, 0.9])))]
    several = [(t, _row(np.array([0.5, 0.7]))) for t in range(0, H, W)]
    assert trend_moments([], several, 0, W) == Moments()
    assert trend_moments([(-W, (1, SCALE // 2, SCALE // 4))], several, 0, W) == Moments()
    assert trend_moments(one_window, [(0, _row(np.array([0.4, 0.6])))], 0, W) == Moments()
    two = [(t, (*row, 0, 0, 0)) for t, row in several]  # a second metric without values
    assert trend_baseline(two, two, 2, W)[3:] == [0, 0, 0]
