"""The recovery test of an open regression: has the drop gone, against a frozen baseline?

When a regression opens, the baseline's values of its metric over the baseline's last
day (the previous version's, or for drift the slice's own day before the period) are
frozen as a profile by hour of the day, so that a daily cycle cancels: each window is
compared with the same hours of the baseline. The null hypothesis is "still bad": every
window's mean is at most its hour's baseline mean minus ``drop`` (half the drop the
regression opened with, at least ``min_effect``), plus the profile bin's standard error
(the profile's own error never helps a version close).

Against it, each window after the opening gives an e-value from its count, sum and sum
of squares: for values in [0, 1], Fan's inequality ``exp(l*y - psi(l)*y^2) <= 1 + l*y``
(``y`` a value minus the floor, ``psi(l) = -log(1 - l) - l``, ``0 <= l < 1``) makes the
product over a window's values an e-value for any distribution whose mean is at most
the floor. The statistic at a boundary is the largest product of the e-values of a run
of consecutive windows ending there, within the last ``RECOVERY_MEMORY_MS`` (an e-CUSUM
with bounded memory: a pure function of the recent windows and the frozen profile, so a
restarted replica computes the same). By Ville's inequality, the run starting at any one
boundary ever reaches ``c`` with probability at most ``1 / c``; with ``c`` the number of
boundaries in ``FALSE_CLOSE_YEARS`` years, a version that stays bad by at least ``drop``
closes as recovered at most once in that many years of serving, in expectation.

A version fixed in place gathers about ``gain`` of log-evidence per value
(:func:`expected_values`), so it closes after about ``log c / gain`` values plus
``close_after``: the bound docs/detection.md states.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from service.metrics.aggregates import SCALE
from service.times import DAY_MS, HOUR_MS

Row = list[int]
PROFILE_BINS = 24
"""The profile's bins: the hours of the day (UTC)."""
PROFILE_MIN = 100
"""Values a bin needs (with its neighbours) to be a baseline; windows at hours without
one are not part of the recovery test."""
FALSE_CLOSE_YEARS = 100
"""A version that stays bad closes as recovered at most once in this many years of
serving, in expectation (see the module docstring)."""
RECOVERY_MEMORY_MS = DAY_MS
"""The recovery statistic looks at most this far back."""
LAMBDA_MAX = 0.5
YEAR_MS = 365 * DAY_MS


def recovery_threshold(window_ms: int) -> float:
    """``log c``: c is the number of boundaries in ``FALSE_CLOSE_YEARS`` years."""
    return math.log(FALSE_CLOSE_YEARS * YEAR_MS / window_ms)


@dataclass(frozen=True, slots=True)
class Recovery:
    """The frozen baseline of a regression's recovery test, and how it bets."""

    metric_index: int
    """The metric's place among the watched ones (its sums in a window's row)."""
    floors: tuple[float | None, ...]
    """By hour of the day: the null's bound on a window's mean (the baseline's mean at
    that hour minus ``drop``, plus the bin's standard error), None without a baseline."""
    drop: float
    margin: float
    """The largest standard error of a bin (what the floors add to the null's bound)."""
    bet: float
    """The fraction ``l`` of each value's excess over the floor bet on (frozen, so the
    product stays an e-value)."""

    def log_e(self, start_ms: int, count: int, sum_fx: int, sum_sq_fx: int) -> float | None:
        """log of the e-value of one window (None: no baseline at its hour, or no values)."""
        floor = self.floors[(start_ms % DAY_MS) // HOUR_MS]
        if floor is None or not count:
            return None
        total, total_sq = sum_fx / SCALE, sum_sq_fx / SCALE
        excess = total - count * floor  # sum of y = x - floor
        spread = total_sq - 2.0 * floor * total + count * floor * floor  # sum of y^2
        lam = self.bet
        return lam * excess - (-math.log1p(-lam) - lam) * spread

    def statistic(self, windows: Iterable[tuple[int, Row]]) -> float:
        """The largest log e-value of a run of consecutive windows ending at the last one
        (0 when none is positive): ``windows`` are (start, row), oldest first."""
        best = running = 0.0
        base = 3 * self.metric_index
        increments = []
        for start, row in windows:
            e = self.log_e(start, row[base], row[base + 1], row[base + 2])
            if e is not None:
                increments.append(e)
        for e in reversed(increments):
            running += e
            best = max(best, running)
        return best


def profile(baseline: Iterable[tuple[int, Row]], metric_index: int, drop: float) -> Recovery | None:
    """The recovery test against these baseline windows (start, row) for a regression of
    ``drop`` (None: no hour of the day has ``PROFILE_MIN`` values)."""
    n = [0.0] * PROFILE_BINS
    s = [0.0] * PROFILE_BINS
    q = [0.0] * PROFILE_BINS
    base = 3 * metric_index
    for start, row in baseline:
        h = (start % DAY_MS) // HOUR_MS
        n[h] += row[base]
        s[h] += row[base + 1] / SCALE
        q[h] += row[base + 2] / SCALE
    floors: list[float | None] = []
    margin = 0.0
    for h in range(PROFILE_BINS):
        # each hour with its neighbours: a smooth cycle barely moves over 3 hours
        near = [(h + d) % PROFILE_BINS for d in (-1, 0, 1)]
        count = sum(n[i] for i in near)
        if count < PROFILE_MIN:
            floors.append(None)
            continue
        mean = sum(s[i] for i in near) / count
        variance = max(0.0, (sum(q[i] for i in near) - count * mean * mean) / (count - 1))
        error = math.sqrt(variance / count)
        margin = max(margin, error)
        floors.append(mean - drop + error)
    total = sum(n)
    if total < PROFILE_MIN or all(f is None for f in floors):
        return None
    mean = sum(s) / total
    variance = max(1e-6, (sum(q) - total * mean * mean) / (total - 1))
    return Recovery(metric_index, tuple(floors), drop, margin, best_bet(drop, variance))


def best_bet(gap: float, variance: float) -> float:
    """The bet whose evidence grows fastest when values exceed the floor by ``gap`` on
    average with this variance: ``l`` maximising ``l*g - psi(l)*(v + g^2)``, whose root is
    ``l / (1 - l) = g / (v + g^2)`` (at most ``LAMBDA_MAX``)."""
    ratio = gap / (variance + gap * gap)
    return min(LAMBDA_MAX, ratio / (1.0 + ratio))


def gain(bet: float, gap: float, variance: float) -> float:
    """The expected log e-value per value when values exceed the floor by ``gap`` on
    average with this variance (the bound of a fix: Fan's lower bound, exact here)."""
    return bet * gap - (-math.log1p(-bet) - bet) * (variance + gap * gap)


def expected_values(recovery: Recovery, variance: float, window_ms: int) -> float:
    """About how many values a version fixed in place (back to the baseline's mean, with
    this variance) needs before its recovery statistic reaches the threshold: its values
    exceed the floor by ``drop`` less the profile's standard error."""
    gap = recovery.drop - recovery.margin
    return recovery_threshold(window_ms) / gain(recovery.bet, gap, variance)


def recovery_drop(opening_delta: float, min_effect: float) -> float:
    """What the recovery test's null keeps as "still bad": half the drop it opened with,
    at least ``min_effect``."""
    return max(min_effect, -opening_delta / 2.0)
