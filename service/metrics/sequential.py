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

A regression is a *drop*, so the detector tests "the candidate is not worse"
(``theta >= 0``) with the same mixture restricted to drops (``theta < 0``, its density
doubled): ``Lambda_drop = 2 Lambda Phi(-d tau / sqrt(V (V + tau^2)))``, about twice
``Lambda`` for a clear drop, never above 1 on average for no change or an improvement
(each component's ratio has expectation ``exp(theta' theta / V) <= 1`` when
``theta' < 0 <= theta``). Several metrics of one slice are combined by closed testing
with the arithmetic mean of their e-values (:func:`closed_log_means`): correlated
metrics that all drop lend each other evidence instead of each paying a Bonferroni
share.

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


LN2 = math.log(2.0)
_SQRT2 = math.sqrt(2.0)


def _log_phi(x: float) -> float:
    """log of the standard normal distribution function, also far in the lower tail."""
    if x > -30.0:
        return math.log(0.5 * math.erfc(-x / _SQRT2))
    x2 = x * x  # Mills' ratio: Phi(x) ~ phi(x) / -x (1 - 1/x^2 + 3/x^4)
    return (
        -0.5 * x2 - math.log(-x) - 0.5 * math.log(2.0 * math.pi) + math.log1p(-1 / x2 + 3 / x2**2)
    )


_log_phi_array = np.vectorize(_log_phi, otypes=[float])


def log_drop_ratio(delta: FloatOrArray, variance: FloatOrArray, tau: float) -> FloatOrArray:
    """log Lambda_drop: the evidence that ``theta < 0`` against ``theta >= 0`` (the
    half-normal mixture over drops, see the module)."""
    tau2 = tau * tau
    v = variance
    z = delta * tau / np.sqrt(v * (v + tau2))
    tail = _log_phi(-float(z)) if np.ndim(z) == 0 else _log_phi_array(-z)
    return LN2 + log_mixture_ratio(delta, v, tau) + tail


def closed_log_means(log_es: list[float]) -> list[float]:
    """Closed testing of a family with the arithmetic mean of e-values: for each member
    ``i``, the log of the smallest mean of the e-values of any set of members that
    contains ``i`` (Vovk and Wang, "E-values: calibration, combination and
    applications", Annals of Statistics 2021, the adjustment of their Algorithm 1).

    Rejecting member ``i`` when that reaches ``1 / alpha`` controls the family-wise error
    rate at ``alpha`` at every look at once: if any true null is rejected, the mean over
    all true nulls, itself an e-process, has reached ``1 / alpha`` (Ville). The result
    is never below the Bonferroni adjustment ``e_i / m`` and never above ``e_i``.
    """
    values = [math.exp(min(x, 600.0)) for x in log_es]
    out = []
    for i, own in enumerate(values):
        others = sorted(v for j, v in enumerate(values) if j != i)
        total, size = own, 1
        for v in others:  # add the smallest while they lower the mean (it is unimodal)
            if v * size >= total:
                break
            total += v
            size += 1
        out.append(math.log(total / size) if total > 0 else -math.inf)
    return out


def confidence_radius(variance: FloatOrArray, tau: float, alpha: float) -> FloatOrArray:
    """Half-width of the (1 - alpha) confidence sequence for the difference at this look:
    every ``theta_0`` within it of ``delta`` has ``Lambda < 1 / alpha``."""
    tau2 = tau * tau
    v = variance
    inner = 2.0 * v * (v + tau2) / tau2 * (math.log(1.0 / alpha) + 0.5 * np.log((v + tau2) / v))
    return np.sqrt(inner)  # type: ignore[no-any-return]


def drop_radius(variance: float, tau: float, alpha: float) -> float:
    """Half-width ``r`` of the one-sided confidence sequences of the drop mixture: the
    difference is at most ``delta + r`` (and, mirrored, at least ``delta - r``) at every
    look at once with probability ``1 - alpha`` each. ``delta + r < 0`` exactly when
    ``Lambda_drop >= 1 / alpha``, so a drop found at that level is excluded from zero.
    Solved by bisection between 0 and the two-sided radius (``Lambda_drop >= Lambda``
    for a drop)."""
    target = math.log(1.0 / alpha)
    low, high = 0.0, float(confidence_radius(variance, tau, alpha))
    # log_drop_ratio(-r, variance, tau) = base + quadratic * r**2 + log Phi(slope * r), in
    # scalar math (numpy on single floats cost ten times as much, 48 times a look)
    v, tau2 = float(variance), tau * tau
    base = LN2 + 0.5 * math.log(v / (v + tau2))
    quadratic = tau2 / (2.0 * v * (v + tau2))
    slope = tau / math.sqrt(v * (v + tau2))
    # (``_log_phi`` written out, the same operations: ``slope * mid >= 0`` never takes its
    # tail branch, and its call was a sixth of this loop)
    log, erfc = math.log, math.erfc
    for _ in range(48):
        mid = 0.5 * (low + high)
        x = slope * mid
        if base + quadratic * mid * mid + log(0.5 * erfc(-x / _SQRT2)) >= target:
            high = mid
        else:
            low = mid
    return high


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
    log_e_drop: float
    """log Lambda_drop: the evidence of a drop, against "the candidate is not worse"."""
    tau: float
    alpha: float
    """The level of the confidence sequences (:attr:`radius`)."""

    @property
    def radius(self) -> float:
        """Half-width of the one-sided confidence sequences at level ``alpha``
        (:func:`drop_radius`): ``delta + radius`` bounds the difference from above.
        Computed when asked for (a bisection: most looks are never shown)."""
        return drop_radius(self.variance, self.tau, self.alpha)

    @property
    def e_value(self) -> float:
        return math.exp(min(self.log_e, 700.0))

    @property
    def p_value(self) -> float:
        """This look's always-valid p-value, ``min(1, 1 / Lambda)``; the reported one is the
        running minimum over the looks (:func:`running_p`)."""
        return running_p(None, self.log_e)

    @property
    def ci(self) -> tuple[float, float]:
        radius = self.radius
        return self.delta - radius, self.delta + radius


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
        log_e_drop=float(log_drop_ratio(delta, v, tau)),
        tau=tau,
        alpha=alpha,
    )


def running_p(previous: float | None, log_e: float) -> float:
    """The always-valid p-value after a look whose e-value is ``exp(log_e)``: the smallest
    ``min(1, 1 / e)`` so far (``previous``: the run's before it, None at its first look)."""
    p = math.exp(-log_e) if log_e > 0 else 1.0
    return p if previous is None else min(previous, p)
