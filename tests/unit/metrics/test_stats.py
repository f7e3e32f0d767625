"""Student-t quantiles, intervals, the paired randomisation test and Holm's correction."""

from __future__ import annotations

import numpy as np
import pytest

from service.metrics.stats import (
    holm_adjust,
    mean_estimate,
    paired_randomisation_test,
    regularized_beta,
    t_quantile,
    t_sf,
)


@pytest.mark.parametrize(
    ("df", "quantile"),
    # two-sided 95% critical values from published Student-t tables
    [
        (1, 12.7062),
        (2, 4.3027),
        (3, 3.1824),
        (5, 2.5706),
        (10, 2.2281),
        (30, 2.0423),
        (120, 1.9799),
    ],
)
def test_t_quantile_matches_tables(df: int, quantile: float) -> None:
    assert t_quantile(0.975, df) == pytest.approx(quantile, abs=1e-4)


def test_t_sf_closed_forms() -> None:
    # df = 1 is the Cauchy distribution: P(T > t) = 1/2 - atan(t)/pi
    for t in (0.0, 0.5, 1.0, 3.0, 40.0):
        assert t_sf(t, 1) == pytest.approx(0.5 - np.arctan(t) / np.pi, abs=1e-13)
    # df = 2: P(T > t) = (1 - t / sqrt(2 + t^2)) / 2
    for t in (0.1, 1.0, 7.0):
        assert t_sf(t, 2) == pytest.approx((1 - t / np.sqrt(2 + t * t)) / 2, abs=1e-13)
    assert t_sf(-1.0, 5) == pytest.approx(1 - t_sf(1.0, 5), abs=1e-15)
    assert t_sf(1.959963984540054, float("inf")) == pytest.approx(0.025, abs=1e-12)


def test_regularized_beta_symmetry_and_uniform_case() -> None:
    assert regularized_beta(1.0, 1.0, 0.3) == pytest.approx(0.3, abs=1e-14)
    assert regularized_beta(2.5, 4.0, 0.2) == pytest.approx(
        1 - regularized_beta(4.0, 2.5, 0.8), abs=1e-14
    )


def test_mean_estimate_interval_and_clipping() -> None:
    est = mean_estimate(0.5, 0.25, 101)
    half = t_quantile(0.975, 100) * np.sqrt(0.25 / 101)
    assert (est.ci_low, est.ci_high) == pytest.approx((0.5 - half, 0.5 + half))
    near_one = mean_estimate(0.99, 0.04, 10)
    assert near_one.ci_high == 1.0
    single = mean_estimate(1.0, None, 1)
    assert (single.ci_low, single.ci_high) == (None, None)


def test_randomisation_test_sees_a_real_shift_and_not_noise() -> None:
    rng = np.random.default_rng(3)
    a = rng.random(200)
    assert paired_randomisation_test(a, a.copy()) == 1.0
    shifted = np.clip(a - 0.1 + rng.normal(0, 0.05, 200), 0, 1)
    assert paired_randomisation_test(a, shifted, n_resamples=2000) < 0.001
    noise = a + rng.normal(0, 0.05, 200)  # zero-mean noise, no real change
    assert paired_randomisation_test(a, noise, n_resamples=2000) > 0.05


def test_randomisation_test_exact_for_a_tiny_sample() -> None:
    # two pairs with differences +1, +1: of the 4 sign patterns, 2 reach |mean| = 1
    p = paired_randomisation_test(np.zeros(2), np.ones(2), n_resamples=20_000, seed=1)
    assert p == pytest.approx(0.5, abs=0.02)


def test_holm_adjust_known_values() -> None:
    assert holm_adjust([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm_adjust([0.5, 0.9]) == pytest.approx([1.0, 1.0])
