"""The baseline of a deploy with days of history, and of drift: the previous version
(drift: the slice itself) over the same hours of up to ``baseline_days`` previous days,
with day-to-day variation counted.

One previous day as baseline is as noisy as the new version's own hours: the difference
of means has twice the variance of either side. Pooling ``D`` days shrinks the
baseline's share to ``1 / D`` of it, but only if the days agree: each day's quality over
the same hours also differs by a day effect (a busy Monday, a weekend's other users, a
weekly pattern), and so does today's. With day means ``m_d`` over ``n_d`` values of
within-day variance ``s_d^2`` (``v_d = s_d^2 / n_d``), count weights ``w_d = n_d / N``
and a between-day variance ``sigma_B^2``, the baseline mean ``m = sum_d w_d m_d`` and
the new version's mean ``y_c`` differ, when nothing changed, by

    Var(y_c - m) = s_c^2 / n_c + sigma_B^2 + sum_d w_d^2 (v_d + sigma_B^2),

today's own day effect (``sigma_B^2``) included: that term is what keeps a weekly
pattern from paging. ``sigma_B^2`` is estimated from the day means by the moment
estimator of DerSimonian and Laird ("Meta-analysis in clinical trials", Controlled
Clinical Trials 1986), with inverse-variance weights ``u_d = 1 / v_d``:

    Q = sum_d u_d (m_d - m_u)^2,   sigma_B^2 = max(0, (Q - (D - 1)) / (U - sum u_d^2 / U)),

``m_u`` the ``u``-weighted mean and ``U = sum u_d``. With one day there is nothing to
estimate it from: the baseline is that day's sums as they are (the detector before it
had more days). :func:`day_baseline` returns, per metric, the sums of ``N`` values whose
mean is ``m`` and whose mean's variance is everything above but ``s_c^2 / n_c`` (the
baseline's share, as :mod:`service.detect.trend` does for its line), so the mixture SPRT
(:func:`service.metrics.sequential.msprt_strata`) gets exactly the difference and its
variance.
"""

from __future__ import annotations

from collections.abc import Sequence

from service.detect.history import SliceHistory, sample_moments
from service.detect.model import Sums
from service.metrics.aggregates import Moments
from service.times import DAY_MS

MIN_DAY_VALUES = 2
"""A day enters a metric's baseline with at least this many values (a variance)."""
VARIANCE_FLOOR = 1e-12
"""A day whose values are all equal still gets a finite inverse-variance weight."""


def between_day_variance(days: Sequence[Moments]) -> float:
    """The DerSimonian-Laird estimate of ``sigma_B^2`` (see the module); 0 with fewer
    than two days of at least :data:`MIN_DAY_VALUES` values."""
    kept = [m for m in days if m.count >= MIN_DAY_VALUES]
    if len(kept) < 2:
        return 0.0
    means = [m.mean or 0.0 for m in kept]
    weights = [m.count / max(m.variance or 0.0, VARIANCE_FLOOR) for m in kept]
    total = sum(weights)
    centre = sum(u * x for u, x in zip(weights, means, strict=True)) / total
    q = sum(u * (x - centre) ** 2 for u, x in zip(weights, means, strict=True))
    scale = total - sum(u * u for u in weights) / total
    return max(0.0, (q - (len(kept) - 1)) / scale) if scale > 0 else 0.0


def pooled_days(days: Sequence[Moments]) -> Moments:
    """One metric's baseline over its days (see the module): one day's sums as they are,
    several days' count-weighted mean with the variance of the difference's baseline
    share (day effects included)."""
    kept = [m for m in days if m.count >= MIN_DAY_VALUES]
    if len(kept) < 2:
        return sum(days, Moments())
    n = sum(m.count for m in kept)
    between = between_day_variance(kept)
    mean = sum(m.count * (m.mean or 0.0) for m in kept) / n
    spread = sum((m.count / n) ** 2 * ((m.variance or 0.0) / m.count + between) for m in kept)
    return sample_moments(n, mean, between + spread)


def whole_days(first_ms: int | None, at_ms: int, most: int) -> int:
    """How many whole days before ``at_ms`` a history starting at ``first_ms`` covers, at
    most ``most``."""
    return 0 if first_ms is None else min(most, max(0, (at_ms - first_ms) // DAY_MS))


def day_rows(previous: SliceHistory, lo_ms: int, hi_ms: int, days: int) -> list[Sums]:
    """The previous version's sums over ``[lo_ms, hi_ms)`` on each of the ``days`` days
    before, the nearest first (a day it did not serve in is all zeros)."""
    return [previous.total(lo_ms - d * DAY_MS, hi_ms - d * DAY_MS) for d in range(1, days + 1)]


def day_baseline(rows: Sequence[Sums], metrics: int) -> Sums:
    """The flat baseline row of every watched metric over the days' rows
    (:func:`pooled_days`)."""
    out: list[int] = []
    for index in range(metrics):
        m = pooled_days([Moments(*row[3 * index : 3 * index + 3]) for row in rows])
        out += (m.count, m.sum_fx, m.sum_sq_fx)
    return out


def same_hours(series: SliceHistory, lo_ms: int, hi_ms: int, most_days: int) -> Sums:
    """The baseline row of ``series`` over ``[lo_ms, hi_ms)`` on each of the previous days
    its history covers, at most ``most_days`` (:func:`day_baseline`)."""
    days = whole_days(series.first_start_ms, lo_ms, most_days)
    return day_baseline(day_rows(series, lo_ms, hi_ms, days), series.width // 3)
