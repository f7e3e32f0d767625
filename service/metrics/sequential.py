"""Anytime-valid comparison of two means: the mixture sequential probability ratio test.

A fixed-level test repeated at every window boundary on growing data rejects at *some*
boundary far more often than its level (given time, almost surely). The mixture
sequential probability ratio test (mSPRT; Robbins 1970; Johari, Koomen, Pekelis and
Walsh, "Always Valid Inference", Operations Research 2022; Lindon, Sanden and
Shirikian, "Rapid Regression Detection in Software Deployments through Sequential
Testing", KDD 2022) instead gives an e-process: under the null its expectation is at
most 1 at every look, and by Ville's inequality the chance that it *ever* reaches
``1 / alpha`` is at most ``alpha``, however often and however long one looks.

For a difference of means ``theta = mean_c - mean_b`` with estimate ``d`` and
variance ``V = s_b^2 / n_b + s_c^2 / n_c`` (from each side's count, sum and sum of
squares), a normal mixing distribution ``N(theta_0, tau^2)`` over the alternative gives
the mixture likelihood ratio

    Lambda = sqrt(V / (V + tau^2)) * exp((d - theta_0)^2 * tau^2 / (2 V (V + tau^2)))

(the normal approximation with plug-in variance, as in the sources). Inverting
``Lambda < 1 / alpha`` over ``theta_0`` gives a confidence sequence: an interval that
covers the true difference at every look at once with probability ``1 - alpha``.

``tau`` sets which effects are found fastest; it is chosen near the smallest effect
worth a page. Everything here works on numpy arrays as well as floats, so the tests
and benchmarks evaluate thousands of streams at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

FloatOrArray = TypeVar("FloatOrArray", float, np.ndarray)


def log_mixture_ratio(
    delta: FloatOrArray, variance: FloatOrArray, tau: float, theta_0: float = 0.0
) -> FloatOrArray:
    """log Lambda, the mixture likelihood ratio of ``theta = theta_0`` (see the module).

    ``variance`` is V, the variance of the estimate ``delta``; it must be positive.
    """
    tau2 = tau * tau
    v = variance
    shift = delta - theta_0
    return 0.5 * np.log(v / (v + tau2)) + shift * shift * tau2 / (2.0 * v * (v + tau2))  # type: ignore[no-any-return]


def confidence_radius(variance: FloatOrArray, tau: float, alpha: float) -> FloatOrArray:
    """Half-width of the (1 - alpha) confidence sequence for the difference at this look:
    every ``theta_0`` within it of ``delta`` has ``Lambda < 1 / alpha``."""
    tau2 = tau * tau
    v = variance
    inner = 2.0 * v * (v + tau2) / tau2 * (math.log(1.0 / alpha) + 0.5 * np.log((v + tau2) / v))
    return np.sqrt(inner)  # type: ignore[no-any-return]


def moments_variance(
    count: FloatOrArray, total: FloatOrArray, total_sq: FloatOrArray
) -> FloatOrArray:
    """The sample variance (n - 1 denominator) from count, sum and sum of squares."""
    n = count
    mean = total / n
    return np.maximum(0.0, (total_sq - n * mean * mean) / (n - 1))  # type: ignore[no-any-return]


@dataclass(frozen=True, slots=True)
class SequentialResult:
    """One look of the mSPRT at ``candidate - baseline``."""

    delta: float
    """Candidate mean minus baseline mean (negative: the candidate is worse)."""
    variance: float
    """V, the variance of ``delta``."""
    log_e: float
    """log Lambda at ``theta_0 = 0``: the evidence against "no difference"."""
    radius: float
    """Half-width of the confidence sequence at the level it was asked for."""

    @property
    def e_value(self) -> float:
        return math.exp(min(self.log_e, 700.0))

    @property
    def p_value(self) -> float:
        """This look's always-valid p-value, ``min(1, 1 / Lambda)``; the reported one is the
        running minimum over the looks (:func:`running_p`)."""
        return math.exp(-self.log_e) if self.log_e > 0 else 1.0

    @property
    def ci(self) -> tuple[float, float]:
        return self.delta - self.radius, self.delta + self.radius


VARIANCE_FLOOR = 1e-12
"""V is kept above this, so a side with identical values gives a finite ratio."""


def msprt(
    baseline: tuple[float, float, int],
    candidate: tuple[float, float, int],
    tau: float,
    alpha: float,
) -> SequentialResult:
    """One look at (mean, variance, n) of both sides; ``alpha`` sets the interval's level."""
    return msprt_strata([(baseline, candidate)], tau, alpha)


def msprt_strata(
    strata: list[tuple[tuple[float, float, int], tuple[float, float, int]]],
    tau: float,
    alpha: float,
) -> SequentialResult:
    """One look at a difference pooled over strata (segments), each a pair of
    (mean, variance, n) for baseline and candidate, as in :func:`msprt`.

    The estimate is the stratified one, ``d = sum_s w_s (mean_c,s - mean_b,s)`` with
    ``w_s`` the stratum's share of the candidate's values, so a baseline whose mix of
    strata differs from the candidate's (one segment busier at other hours, a canary at
    a different share) biases nothing; ``V = sum_s w_s^2 V_s``.
    """
    if not strata:
        raise ValueError("the pooled test needs at least one stratum")
    total = sum(c[2] for _, c in strata)
    delta = 0.0
    v = 0.0
    for (mean_b, var_b, n_b), (mean_c, var_c, n_c) in strata:
        if n_b < 2 or n_c < 2:
            raise ValueError("the sequential test needs at least 2 values on each side")
        w = n_c / total
        delta += w * (mean_c - mean_b)
        v += w * w * (var_b / n_b + var_c / n_c)
    if tau <= 0:
        raise ValueError(f"tau must be positive, got {tau!r}")
    v = max(VARIANCE_FLOOR, v)
    return SequentialResult(
        delta=delta,
        variance=v,
        log_e=float(log_mixture_ratio(delta, v, tau)),
        radius=float(confidence_radius(v, tau, alpha)),
    )


def running_p(previous: float | None, result: SequentialResult) -> float:
    """The always-valid p-value after this look: the smallest ``1 / Lambda`` so far."""
    p = result.p_value
    return p if previous is None else min(previous, p)
