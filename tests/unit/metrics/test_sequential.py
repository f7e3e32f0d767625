"""The mixture SPRT: its formula, its confidence sequence, and the guarantee itself.

The guarantee is checked by simulation: many streams with no difference, looked at
every few queries for thousands of queries; the share of streams that *ever* reject
must stay under alpha. The per-look Welch test the detector used before, on the same
streams and the same looks, rejects in a large share of them: the test that shows why
a per-look test pages for nothing.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from numpy.typing import NDArray

from service.metrics.sequential import (
    confidence_radius,
    log_mixture_ratio,
    moments_variance,
    msprt,
    msprt_strata,
    running_p,
)

ALPHA = 0.05
LOOKS = 200
STEP = 20
"""Queries added to each side between two looks (4,000 per side at the last look)."""
STREAMS = 2000


def test_the_ratio_is_the_papers_balanced_arm_form() -> None:
    """Johari et al. state Lambda for n per arm and common variance sigma^2."""
    sigma2, n, tau, d = 0.21, 800, 0.03, -0.012
    paper = math.sqrt(2 * sigma2 / (2 * sigma2 + n * tau**2)) * math.exp(
        n**2 * tau**2 * d**2 / (4 * sigma2 * (2 * sigma2 + n * tau**2))
    )
    assert log_mixture_ratio(d, 2 * sigma2 / n, tau) == pytest.approx(math.log(paper), rel=1e-12)


def test_the_confidence_sequence_is_where_the_ratio_reaches_one_over_alpha() -> None:
    v, tau, delta = 2.5e-4, 0.02, -0.031
    radius = confidence_radius(v, tau, ALPHA)
    for theta in (delta - radius, delta + radius):
        assert log_mixture_ratio(delta, v, tau, theta) == pytest.approx(math.log(1 / ALPHA))
    inside = log_mixture_ratio(delta, v, tau, delta + 0.9 * radius)
    assert inside < math.log(1 / ALPHA)


def test_one_look_from_moments() -> None:
    base, cand = (0.80, 0.16, 1000), (0.74, 0.19, 900)
    r = msprt(base, cand, tau=0.02, alpha=ALPHA)
    v = 0.16 / 1000 + 0.19 / 900
    assert r.delta == pytest.approx(-0.06)
    assert r.variance == pytest.approx(v)
    assert r.log_e == pytest.approx(log_mixture_ratio(-0.06, v, 0.02))
    assert r.p_value == pytest.approx(math.exp(-r.log_e))
    assert r.ci[0] < r.delta < r.ci[1]
    assert running_p(0.5, r) == min(0.5, r.p_value)
    assert running_p(None, r) == r.p_value
    no_change = msprt(base, (0.80, 0.16, 1000), tau=0.02, alpha=ALPHA)
    assert no_change.log_e < 0
    assert no_change.p_value == 1.0
    with pytest.raises(ValueError, match="at least 2"):
        msprt(base, (0.8, 0.1, 1), tau=0.02, alpha=ALPHA)


def test_a_pooled_look_is_the_stratified_difference() -> None:
    """Two segments: each one's difference weighted by its share of the candidate's
    values; the variance adds the squared weights. One stratum is :func:`msprt`."""
    kb = ((0.90, 0.09, 400), (0.86, 0.12, 100))
    docs = ((0.50, 0.25, 400), (0.47, 0.25, 300))
    r = msprt_strata([kb, docs], tau=0.05, alpha=ALPHA)
    w_kb, w_docs = 100 / 400, 300 / 400
    assert r.delta == pytest.approx(w_kb * -0.04 + w_docs * -0.03)
    v = w_kb**2 * (0.09 / 400 + 0.12 / 100) + w_docs**2 * (0.25 / 400 + 0.25 / 300)
    assert r.variance == pytest.approx(v)
    assert r.log_e == pytest.approx(log_mixture_ratio(r.delta, v, 0.05))
    plain = (0.86 * 100 + 0.47 * 300) / 400 - (0.90 * 400 + 0.50 * 400) / 800
    assert plain == pytest.approx(-0.1325)  # what pooling the means would say
    assert -0.04 < r.delta < -0.03
    assert msprt_strata([kb], 0.05, ALPHA) == msprt(*kb, tau=0.05, alpha=ALPHA)
    with pytest.raises(ValueError, match="at least one stratum"):
        msprt_strata([], 0.05, ALPHA)


def test_moments_variance_is_the_sample_variance() -> None:
    x = np.random.default_rng(3).random(57)
    got = moments_variance(57.0, float(x.sum()), float((x * x).sum()))
    assert got == pytest.approx(float(x.var(ddof=1)))


def _null_streams(
    rng: np.random.Generator, kind: str
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Per-query values of two sides with the same distribution, STREAMS x LOOKS*STEP."""
    shape = (STREAMS, LOOKS * STEP)
    if kind == "hit":  # a 0/1 metric (hit rate, labelled share)
        return (
            (rng.random(shape) < 0.7).astype(np.float64),
            (rng.random(shape) < 0.7).astype(np.float64),
        )
    # a skewed metric in [0, 1] with mass near 0 and 1 (reciprocal rank, recall)
    return rng.beta(0.5, 0.8, shape), rng.beta(0.5, 0.8, shape)


def _at_looks(x: NDArray[np.float64]) -> tuple[NDArray[np.float64], ...]:
    """Count, sum and sum of squares at every look."""
    looks = np.arange(STEP - 1, x.shape[1], STEP)
    total = np.cumsum(x, axis=1)[:, looks]
    total_sq = np.cumsum(x * x, axis=1)[:, looks]
    return (looks + 1).astype(np.float64), total, total_sq


@pytest.mark.parametrize("kind", ["hit", "skewed"])
@pytest.mark.parametrize("tau", [0.02, 0.05])
def test_never_rejecting_a_null_stream_holds_over_every_look(kind: str, tau: float) -> None:
    rng = np.random.default_rng(20261203)
    base, cand = _null_streams(rng, kind)
    n, sum_b, sq_b = _at_looks(base)
    _, sum_c, sq_c = _at_looks(cand)
    v = moments_variance(n, sum_b, sq_b) / n + moments_variance(n, sum_c, sq_c) / n
    delta = sum_c / n - sum_b / n
    ever = (log_mixture_ratio(delta, v, tau) >= math.log(1 / ALPHA)).any(axis=1).mean()
    # the per-look test on the same streams and looks: z = delta / sqrt(v) beyond 1.96
    per_look = (np.abs(delta / np.sqrt(v)) >= 1.959964).any(axis=1).mean()
    print(f"\n{kind}, tau {tau}: ever rejected {ever:.3f} (per-look test {per_look:.3f})")
    assert ever <= ALPHA, f"{ever:.3f} of {STREAMS} null streams ever rejected"
    assert per_look > 5 * ALPHA, f"the per-look test rejected only {per_look:.3f}"


@pytest.mark.parametrize("tau", [0.02, 0.05])
def test_a_frozen_baseline_keeps_the_guarantee(tau: float) -> None:
    """A deploy against the old version's past: the baseline is one fixed sample (its own
    error never shrinks), the candidate grows. Measured, not assumed (see the notes)."""
    rng = np.random.default_rng(7)
    base, cand = _null_streams(rng, "skewed")
    frozen = base[:, :2000]
    nb = 2000.0
    vb = moments_variance(nb, frozen.sum(axis=1), (frozen * frozen).sum(axis=1))[:, None]
    mb = frozen.mean(axis=1)[:, None]
    n, sum_c, sq_c = _at_looks(cand)
    v = vb / nb + moments_variance(n, sum_c, sq_c) / n
    delta = sum_c / n - mb
    ever = (log_mixture_ratio(delta, v, tau) >= math.log(1 / ALPHA)).any(axis=1).mean()
    print(f"\nfrozen baseline, tau {tau}: ever rejected {ever:.3f}")
    assert ever <= ALPHA, f"{ever:.3f} of {STREAMS} null streams ever rejected"


def test_a_real_drop_is_found() -> None:
    """Power: a 5-point drop in a 0/1 metric is found in nearly every stream."""
    rng = np.random.default_rng(11)
    shape = (500, LOOKS * STEP)
    base = (rng.random(shape) < 0.70).astype(np.float64)
    cand = (rng.random(shape) < 0.65).astype(np.float64)
    n, sum_b, sq_b = _at_looks(base)
    _, sum_c, sq_c = _at_looks(cand)
    v = moments_variance(n, sum_b, sq_b) / n + moments_variance(n, sum_c, sq_c) / n
    delta = sum_c / n - sum_b / n
    reject = (log_mixture_ratio(delta, v, 0.02) >= math.log(1 / ALPHA)) & (delta < 0)
    found = reject.any(axis=1)
    assert found.mean() >= 0.95
    first = np.argmax(reject, axis=1)[found]
    assert float(np.median(first + 1)) * STEP < 2000  # queries per side at detection
