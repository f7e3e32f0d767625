"""How the detector spends its false-alarm budget: ``alpha`` per deploy, ``drift_budget``
per 30 days (the guarantee of :mod:`service.detect.detector` rests on these shares).

**Deploys.** A version that appears in a segment is one deploy; its false-alarm rate is
``alpha``. Half of it goes to the segment's own comparison and half to the comparison
pooled over every segment the version replaced the previous one in (segment ``*``; a
deploy to one segment leaves that half unspent). When the version served beside the
previous one first (a canary), each of those comparisons has two phases, canary then
deploy, and each phase gets half of the comparison's share. A union bound then keeps
every deploy's total at most ``alpha``: a deploy to ``k`` segments that changes nothing
opens a regression with probability at most ``(k + 1) * alpha / 2`` over all its
comparisons.

**Drift.** ``drift_budget`` expected false alarms per 30 days for the whole deployment is
spent in periods of ``drift_period_ms``, each with its share of the budget, split
evenly (Bonferroni) over the slices drift-tested in that period.

Within a family, each slice's test runs at the family's alpha over its slices
(:func:`slice_level`), closed over the slice's metrics.
"""

from __future__ import annotations

from collections.abc import Mapping

from service.detect.history import SliceHistory
from service.stream.windows import SliceKey
from service.times import DAY_MS

DEPLOY_COMPARISONS = 2
"""A deploy's alpha is split over this many comparisons: the segment's own and the
pooled one (whether or not the pooled one runs)."""
CANARY_PHASES = 2
"""A comparison whose version had a canary phase splits its share over the canary phase
and the deploy phase that follows it."""
DRIFT_BUDGET_SPAN_MS = 30 * DAY_MS
"""``drift_budget`` is the expected number of false drift alarms over this span."""


def phase_alpha(alpha: float, canary_phase: bool) -> float:
    """The family alpha of one phase of a deploy's comparison (the segment's own or the
    pooled one): ``alpha / 2``, or ``alpha / 4`` per phase once the version had a canary
    phase (the canary phase itself, and the deploy phase after it)."""
    return alpha / (DEPLOY_COMPARISONS * CANARY_PHASES if canary_phase else DEPLOY_COMPARISONS)


def drift_alpha(drift_budget: float, drift_period_ms: int) -> float:
    """One drift period's share of the budget, for all slices and metrics together."""
    return drift_budget * drift_period_ms / DRIFT_BUDGET_SPAN_MS


def slice_level(family_alpha: float, slices: int) -> float:
    """Each slice's level in a family of ``slices`` slices (Bonferroni)."""
    return family_alpha / slices


def drift_family(
    series: Mapping[SliceKey, SliceHistory], period: int, min_labelled: int
) -> frozenset[SliceKey]:
    """The slices whose drift tests share the period starting at ``period``: those with
    ``min_labelled`` values the day before it began (fixed for the period)."""
    return frozenset(
        key
        for key, s in series.items()
        if s.first_start_ms is not None
        and s.first_start_ms <= period - DAY_MS
        and max(s.total(period - DAY_MS, period)[0::3], default=0) >= min_labelled
    )
