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
    closed_log_means,
    confidence_radius,
    drop_radius,
    log_drop_ratio,
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
    assert running_p(0.5, r.log_e) == min(0.5, r.p_value)
    assert running_p(None, r.log_e) == r.p_value
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


# -- the one-sided test of a drop ----------------------------------------------------------


def test_the_drop_ratio_is_the_half_normal_mixture() -> None:
    """Lambda_drop integrates the normal likelihood ratio over drops (theta < 0) with the
    N(0, tau^2) density doubled; checked by quadrature, for drops, rises and no change."""
    v, tau = 4e-4, 0.05
    theta = np.linspace(-12 * tau, 0.0, 200_001)
    density = 2 * np.exp(-(theta**2) / (2 * tau**2)) / (tau * math.sqrt(2 * math.pi))
    for d in (-0.08, -0.03, 0.0, 0.02, 0.09):
        ratio = np.exp((theta * d - theta**2 / 2) / v)
        f = ratio * density
        quad = float(((f[1:] + f[:-1]) / 2 * np.diff(theta)).sum())
        assert log_drop_ratio(d, v, tau) == pytest.approx(math.log(quad), rel=1e-6, abs=1e-6)
    # about twice the two-sided ratio for a clear drop, the same at no change
    assert log_drop_ratio(-0.08, v, tau) == pytest.approx(
        log_mixture_ratio(-0.08, v, tau) + math.log(2), abs=1e-3
    )
    assert log_drop_ratio(0.0, v, tau) == pytest.approx(log_mixture_ratio(0.0, v, tau))
    rises = [log_drop_ratio(d, v, tau) for d in (0.0, 0.05, 0.4, 3.0)]
    assert rises == sorted(rises, reverse=True)  # a larger rise: less evidence of a drop
    assert all(math.isfinite(x) for x in rises)  # far in the normal tail too


@pytest.mark.parametrize(
    ("v", "tau"), [(2.5e-4, 0.05), (1e-7, 0.05), (1e-2, 0.02), (3e-5, 0.2), (1e-9, 0.5)]
)
def test_the_drop_radius_is_where_the_drop_ratio_reaches_one_over_alpha(
    v: float, tau: float
) -> None:
    r = drop_radius(v, tau, ALPHA)
    assert log_drop_ratio(-r, v, tau) == pytest.approx(math.log(1 / ALPHA), abs=1e-9)
    assert log_drop_ratio(-r * (1 - 1e-6), v, tau) < math.log(1 / ALPHA)  # the smallest such
    assert 0 < r < confidence_radius(v, tau, ALPHA)  # one-sided: tighter


@pytest.mark.parametrize("shift", [0.0, 0.02])
def test_the_drop_test_never_rejects_no_change_or_a_rise(shift: float) -> None:
    """Under no change, or when the candidate is better, the one-sided e-process stays a
    supermartingale: it ever reaches 1 / alpha in at most alpha of the streams."""
    rng = np.random.default_rng(44)
    shape = (STREAMS, LOOKS * STEP)
    base = (rng.random(shape) < 0.7).astype(np.float64)
    cand = (rng.random(shape) < 0.7 + shift).astype(np.float64)
    n, sum_b, sq_b = _at_looks(base)
    _, sum_c, sq_c = _at_looks(cand)
    v = moments_variance(n, sum_b, sq_b) / n + moments_variance(n, sum_c, sq_c) / n
    delta = sum_c / n - sum_b / n
    drop = log_drop_ratio(delta, v, 0.05)
    ever = (drop >= math.log(1 / ALPHA)).any(axis=1).mean()
    two_sided = (log_mixture_ratio(delta, v, 0.05) >= math.log(1 / ALPHA)).any(axis=1).mean()
    print(f"\nshift {shift}: drop test ever rejected {ever:.3f} (two-sided {two_sided:.3f})")
    assert ever <= ALPHA
    if shift:  # the two-sided test calls a rise a difference; the drop test never does
        assert two_sided > 0.2
        assert ever < 0.01


# -- closed testing over a slice's metrics ---------------------------------------------------


def test_closed_means_are_the_smallest_mean_over_every_set_containing_the_member() -> None:
    rng = np.random.default_rng(5)
    for _ in range(200):
        m = int(rng.integers(1, 7))
        logs = list(rng.normal(0.0, 4.0, m))
        got = closed_log_means(logs)
        e = np.exp(logs)
        for i in range(m):
            others = [j for j in range(m) if j != i]
            best = e[i]
            for mask in range(1 << (m - 1)):
                chosen = [e[others[b]] for b in range(m - 1) if mask >> b & 1]
                best = min(best, (e[i] + sum(chosen)) / (1 + len(chosen)))
            assert got[i] == pytest.approx(math.log(best), rel=1e-9, abs=1e-12)
            assert logs[i] - math.log(m) - 1e-12 <= got[i] <= logs[i] + 1e-12


def _ranks(rng: np.random.Generator, shape: tuple[int, int], find: float) -> NDArray[np.int64]:
    """Rank of the first relevant result (11: none in the top 10), geometric-like."""
    found = rng.random(shape) < find
    return np.where(found, np.minimum(rng.geometric(0.45, shape), 10), 11)


def _rank_metrics(ranks: NDArray[np.int64]) -> list[NDArray[np.float64]]:
    """hit@1, hit@3, hit@5 and the reciprocal rank: four strongly correlated metrics."""
    rr = np.where(ranks <= 10, 1.0 / ranks, 0.0)
    return [(ranks <= k).astype(np.float64) for k in (1, 3, 5)] + [rr]


def _first_rejection(
    rng: np.random.Generator, find_c: float, closed: bool, streams: int
) -> NDArray[np.int64]:
    """Per stream, the first look at which any metric is rejected (-1: never), with the
    four metrics' e-values closed (arithmetic mean) or Bonferroni at ALPHA."""
    shape = (streams, LOOKS * STEP)
    base = _rank_metrics(_ranks(rng, shape, 0.8))
    cand = _rank_metrics(_ranks(rng, shape, find_c))
    logs = []
    for b, c in zip(base, cand, strict=True):
        n, sum_b, sq_b = _at_looks(b)
        _, sum_c, sq_c = _at_looks(c)
        v = moments_variance(n, sum_b, sq_b) / n + moments_variance(n, sum_c, sq_c) / n
        logs.append(log_drop_ratio(sum_c / n - sum_b / n, np.maximum(v, 1e-12), 0.05))
    stacked = np.stack(logs, axis=-1)  # streams x looks x 4
    first = np.full(streams, -1)
    threshold = math.log(1 / ALPHA)
    for s in range(streams):
        for look in np.nonzero(stacked[s].max(axis=1) >= threshold - math.log(4) * (not closed))[0]:
            row = list(stacked[s, look])
            adjusted = closed_log_means(row) if closed else [x - math.log(4) for x in row]
            if max(adjusted) >= threshold:
                first[s] = look
                break
    return first


def test_closing_correlated_metrics_keeps_the_family_wise_guarantee_and_finds_drops_sooner() -> (
    None
):
    """Four correlated metrics of one slice: with no change, closed testing rejects some
    metric in at most alpha of the streams at any look; on a drop it finds it sooner
    than Bonferroni over the four, on the same streams."""
    null = _first_rejection(np.random.default_rng(9), 0.8, closed=True, streams=1000)
    ever = float((null >= 0).mean())
    closed = _first_rejection(np.random.default_rng(10), 0.76, closed=True, streams=300)
    bonferroni = _first_rejection(np.random.default_rng(10), 0.76, closed=False, streams=300)
    found_closed, found_bonferroni = closed[closed >= 0], bonferroni[bonferroni >= 0]
    print(
        f"\nclosed testing: null ever rejected {ever:.3f}; a 4-point find-rate drop found in "
        f"{len(found_closed)}/300 at look {np.median(found_closed) + 1:.0f} (median), "
        f"Bonferroni {len(found_bonferroni)}/300 at look {np.median(found_bonferroni) + 1:.0f}"
    )
    assert ever <= ALPHA
    assert len(found_closed) >= len(found_bonferroni)
    both = (closed >= 0) & (bonferroni >= 0)
    assert (closed[both] <= bonferroni[both]).all()  # never later on the same stream
    assert np.median(closed[both]) < np.median(bonferroni[both])
