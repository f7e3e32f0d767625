"""The baseline of a deploy without a day of history: the previous version's trend
carried across the switch.

Without the previous version's same hours one day earlier, the new version can only be
compared with the hours around the switch, and a daily cycle in quality moves both. A
plain difference of means over a span mirrored about the switch (``s`` hours before,
``s`` after) is biased by about the cycle's slope times ``s``: it grows with the watch
(a +-4-point cycle falls by up to 1 point an hour). Here both versions share one straight
line in time and differ by a jump at the switch (a regression discontinuity with a common
slope), fitted by least squares on the windows' sums:

    y = a + b (t - t_switch) + delta [version is the new one]

Over a span mirrored about the switch, a linear trend cancels exactly and so does, by
symmetry, a quadratic one; what biases ``delta`` is the part of the cycle that is
neither, the cycle's curvature weighted by how unevenly traffic falls on both sides.
The detector fits at least ``no_history_span_ms`` (4 h) before the switch, which fixes
the slope better early on at the price of some curvature. With ``c_i`` the jump's weight
on window ``i`` and ``x_i`` its time from the switch, a cycle with ``|f''| <= M`` biases
the jump by at most ``M / 2 sum_i |c_i| x_i^2``; for a +-4-point 24-hour cycle with the
benchmark's traffic (volume 0.5 to 1.5 times its mean, in phase) that is at most 1.8
points in the first 4 hours after the switch, and a sinusoid itself at most 0.8 (see
docs/detection.md).

The fit is made with per-window (count, sum) of each side, in closed form: with each
side's count-weighted means ``y_b, y_c`` and times ``x_b, x_c``, and its within-side
sums ``Sxx = sum n_w (x_w - x)^2``, ``Sxy = sum (x_w - x) sum_w``, the common slope is
``b = (Sxy_b + Sxy_c) / (Sxx_b + Sxx_c)`` and ``delta = y_c - m`` with ``m = y_b + b
(x_c - x_b)``, the previous version's line at the new version's mean time. ``y_c`` is
uncorrelated with ``b`` and with ``y_b`` (within-side deviations are orthogonal to a
side's mean), so

    Var(delta) = s_c^2 / n_c + [s_b^2 / n_b + (x_c - x_b)^2 Var(b)],
    Var(b) = (s_b^2 Sxx_b + s_c^2 Sxx_c) / (Sxx_b + Sxx_c)^2,

with each side's sample variance ``s^2`` (which includes the little the trend adds, so
it errs on the safe side). The bracket is the baseline's share: :func:`trend_baseline`
returns, per metric, the sums of a sample of ``n_b`` values whose mean is ``m`` and
whose mean's variance is that bracket, so the mixture SPRT
(:func:`service.metrics.sequential.msprt_strata`) gets exactly ``delta`` and
``Var(delta)``. The fit on all windows so far is the least-squares (maximum likelihood,
for normal errors of one variance) estimate of the jump from nested data, so its looks
have the joint distribution of a sequential test on accumulating data, which is what
the mixture's guarantee rests on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from service.detect.history import SliceHistory, sample_moments
from service.detect.model import Sums
from service.metrics.aggregates import SCALE, Moments
from service.times import HOUR_MS

WindowRow = tuple[int, Sums]
"""(window start relative to the switch, in ms; the window's flat row)."""


class Side(NamedTuple):
    """One metric on one side of the switch (times in hours from the switch)."""

    n: int
    mean: float
    variance: float
    x_mean: float
    """The count-weighted mean time of its values (window midpoints)."""
    sxx: float
    sxy: float


def _side(rows: Sequence[WindowRow], index: int, half_ms: int) -> Side | None:
    """The ``index``-th metric's side, or None with fewer than 2 values."""
    n = total_fx = total_sq_fx = 0
    tx = 0.0
    for start, row in rows:
        count = row[3 * index]
        n += count
        total_fx += row[3 * index + 1]
        total_sq_fx += row[3 * index + 2]
        tx += count * (start + half_ms)
    if n < 2:
        return None
    moments = Moments(n, total_fx, total_sq_fx)
    x_mean = tx / n
    sxx = sxy = 0.0
    for start, row in rows:
        count = row[3 * index]
        if count:
            dx = (start + half_ms - x_mean) / HOUR_MS
            sxx += count * dx * dx
            sxy += dx * row[3 * index + 1] / SCALE
    return Side(n, moments.mean or 0.0, moments.variance or 0.0, x_mean / HOUR_MS, sxx, sxy)


def trend_moments(
    before: Sequence[WindowRow], after: Sequence[WindowRow], index: int, window_ms: int
) -> Moments:
    """The baseline side of the ``index``-th metric (see the module): the sums of ``n_b``
    values with the trend's mean at the new version's mean time and the variance that
    gives the fit's; empty when either side has fewer than 2 values or neither side's
    values span two windows (no slope to fit)."""
    half = window_ms // 2
    b = _side(before, index, half)
    c = _side(after, index, half)
    if b is None or c is None:
        return Moments()
    sxx = b.sxx + c.sxx
    if sxx <= 0.0:
        return Moments()
    slope = (b.sxy + c.sxy) / sxx
    slope_var = (b.variance * b.sxx + c.variance * c.sxx) / (sxx * sxx)
    gap = c.x_mean - b.x_mean
    mean = b.mean + slope * gap
    mean_var = b.variance / b.n + gap * gap * slope_var
    return sample_moments(b.n, mean, mean_var)


def trend_baseline(
    before: Sequence[WindowRow], after: Sequence[WindowRow], metrics: int, window_ms: int
) -> Sums:
    """The flat baseline row of every watched metric (:func:`trend_moments`): ``before``
    holds the previous version's windows, ``after`` the new version's, each with its start
    relative to the switch."""
    row: list[int] = []
    for index in range(metrics):
        m = trend_moments(before, after, index, window_ms)
        row += (m.count, m.sum_fx, m.sum_sq_fx)
    return row


def window_rows(series: SliceHistory | None, lo_ms: int, hi_ms: int, at_ms: int) -> list[WindowRow]:
    """The windows of ``series`` starting in ``[lo_ms, hi_ms)``, timed from ``at_ms``
    (none without a series: its windows were forgotten)."""
    if series is None:
        return []
    return [(t - at_ms, row) for t, row in series.rows(lo_ms, hi_ms)]
