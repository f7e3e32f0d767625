"""Statistics on metric values: Student-t intervals, the paired randomisation test, Holm.

Pure Python and numpy; no scipy. The Student-t tail comes from the regularised
incomplete beta function (continued fraction, Lentz's method), which is accurate to
about 1e-14 here and is checked against published table values in the tests.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from numpy.typing import NDArray

_EPS = 1e-16
_TINY = 1e-300
_MAX_ITERATIONS = 10_000


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c = 1.0
    d = 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, _MAX_ITERATIONS + 1):
        m2 = 2 * m
        for aa in (
            m * (b - m) * x / ((qam + m2) * (a + m2)),
            -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2)),
        ):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + aa / c
            c = c if abs(c) > _TINY else _TINY
            step = d * c
            h *= step
        if abs(step - 1.0) < _EPS:
            break
    return h


def regularized_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularised incomplete beta function, for a, b > 0 and x in [0, 1]."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    front = math.exp(log_front)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_continued_fraction(a, b, x) / a
    return 1.0 - front * _beta_continued_fraction(b, a, 1.0 - x) / b


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom."""
    if math.isinf(df):
        return 0.5 * math.erfc(t / math.sqrt(2.0))
    tail = 0.5 * regularized_beta(df / 2.0, 0.5, df / (df + t * t))
    return tail if t >= 0 else 1.0 - tail


@lru_cache(maxsize=4096)
def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t (0.5 < p < 1), by bisection on :func:`t_sf`."""
    if not 0.5 < p < 1.0:
        raise ValueError(f"p must lie in (0.5, 1), got {p!r}")
    lo, hi = 0.0, 1.0
    while t_sf(hi, df) > 1.0 - p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_sf(mid, df) > 1.0 - p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-13 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


@dataclass(frozen=True, slots=True)
class MeanEstimate:
    """A mean over n values with its 95% Student-t confidence interval (None when n < 2)."""

    mean: float
    n: int
    ci_low: float | None
    ci_high: float | None

    def to_dict(self) -> dict[str, float | int | None]:
        return {"mean": self.mean, "n": self.n, "ci_low": self.ci_low, "ci_high": self.ci_high}


def mean_estimate(
    mean: float,
    variance: float | None,
    n: int,
    bounds: tuple[float, float] = (0.0, 1.0),
) -> MeanEstimate:
    """The 95% interval mean +- t(0.975, n-1) * sqrt(variance / n), clipped to ``bounds``."""
    if n < 2 or variance is None:
        return MeanEstimate(mean, n, None, None)
    half = t_quantile(0.975, n - 1) * math.sqrt(variance / n)
    return MeanEstimate(mean, n, max(bounds[0], mean - half), min(bounds[1], mean + half))


def sample_estimate(values: NDArray[np.float64], bounds: tuple[float, float]) -> MeanEstimate:
    """Mean and 95% interval of a sample given as an array."""
    n = int(values.size)
    mean = float(values.mean()) if n else math.nan
    variance = float(values.var(ddof=1)) if n >= 2 else None
    return mean_estimate(mean, variance, n, bounds)


def paired_randomisation_test(
    a: NDArray[np.float64],
    b: NDArray[np.float64],
    n_resamples: int = 10_000,
    seed: int = 0,
) -> float:
    """Two-sided p-value of a paired sign-flip randomisation test of mean(b - a) = 0.

    Under the null hypothesis each per-query difference is as likely to have the
    opposite sign; the p-value is (1 + resamples with |mean| >= observed) / (1 + R).
    """
    if a.shape != b.shape:
        raise ValueError("paired samples must have the same length")
    diffs = b - a
    n = diffs.size
    if n == 0:
        return 1.0
    observed = abs(float(diffs.mean()))
    threshold = observed - 1e-12 * max(1.0, observed)
    rng = np.random.default_rng(seed)
    chunk = max(1, 4_000_000 // n)
    extreme = 0
    for start in range(0, n_resamples, chunk):
        rows = min(chunk, n_resamples - start)
        signs = rng.integers(0, 2, size=(rows, n), dtype=np.int8).astype(np.float64) * 2.0 - 1.0
        means = np.abs(signs @ diffs) / n
        extreme += int(np.count_nonzero(means >= threshold))
    return (extreme + 1) / (n_resamples + 1)


def holm_adjust(p_values: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (family-wise error control), in input order."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [0.0] * m
    running = 0.0
    for position, i in enumerate(order):
        running = max(running, min(1.0, (m - position) * p_values[i]))
        adjusted[i] = running
    return adjusted


@dataclass(frozen=True, slots=True)
class WelchResult:
    """Welch's unequal-variance t-test of candidate mean - baseline mean."""

    delta: float
    """Candidate mean minus baseline mean (negative: the candidate is worse)."""
    se: float
    df: float
    p_lower: float
    """One-sided p-value of H1 "the candidate mean is lower"."""
    p_two_sided: float

    @property
    def ci(self) -> tuple[float, float]:
        """95% two-sided interval of the delta (Welch-Satterthwaite degrees of freedom)."""
        half = t_quantile(0.975, self.df) * self.se if self.se else 0.0
        return self.delta - half, self.delta + half


def welch_test(
    baseline: tuple[float, float, int],
    candidate: tuple[float, float, int],
) -> WelchResult:
    """Welch's t-test on (mean, variance, n) of two independent samples, n >= 2 each.

    With zero variance on both sides the difference is exact: p is 0 for any drop and
    1 otherwise.
    """
    (mean_b, var_b, n_b), (mean_c, var_c, n_c) = baseline, candidate
    if n_b < 2 or n_c < 2:
        raise ValueError("Welch's test needs at least 2 values on each side")
    delta = mean_c - mean_b
    a, b = var_b / n_b, var_c / n_c
    se = math.sqrt(a + b)
    if se == 0.0:
        p = 0.0 if delta < 0 else 1.0
        two = 0.0 if delta != 0 else 1.0
        return WelchResult(delta, 0.0, float(n_b + n_c - 2), p, two)
    df = (a + b) ** 2 / (a * a / (n_b - 1) + b * b / (n_c - 1))
    t = delta / se
    p_lower = t_sf(-t, df)
    two_sided = min(1.0, 2.0 * t_sf(abs(t), df))
    return WelchResult(delta, se, df, p_lower, two_sided)
