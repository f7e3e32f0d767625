"""How the detector spends its false-alarm budget: ``alpha`` per deploy, ``drift_budget``
per 30 days (the guarantee of :mod:`service.detect.detector` rests on these shares).

**Deploys.** A version that appears in segments where it replaces one previous version
is one deploy; the probability that a deploy which changes nothing ever opens a
regression, in any of its comparisons, during its whole watch, is at most ``alpha``:

* the **primary** test, the one that pages, gets ``PRIMARY_SHARE`` (three quarters): the
  version's comparison pooled over every segment it replaced the previous one in
  (segment ``*``, stratified). While only one of the version's segments has values
  enough to be tested, the pooled comparison would have that one stratum and be that
  segment's own comparison: the segment's test then carries the primary share besides
  its own (the same e-value passing the larger of two levels), until the pooled test
  first looks (a second segment has values; from then on the pooled test has it);
* the **diagnosis** tests, each segment's own, share the rest evenly over the segments
  the previous version served in the hour before the deploy (``Deploy.segments``): they
  say where a drop is, and find a drop confined to one segment that pooling dilutes.

When the version served beside the previous one first (a canary), each comparison has
two phases, canary then deploy: the canary phase gets ``CANARY_SHARE`` (two thirds) of
the comparison's share, since a canary's small traffic needs it most and a canary that
is never promoted has no other, and the deploy phase after it the rest. A union bound
over these shares keeps each deploy's total at most ``alpha`` (a previous version that
served more segments after the deploy began than before it could spend a little more).

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

PRIMARY_SHARE = 0.75
"""A deploy's share of ``alpha`` for its primary test, pooled over its segments; the
rest goes to the segments' own tests."""
CANARY_SHARE = 2 / 3
"""A comparison whose version had a canary phase: the canary phase's part of the
comparison's share (the deploy phase after it has the rest)."""
DRIFT_BUDGET_SPAN_MS = 30 * DAY_MS
"""``drift_budget`` is the expected number of false drift alarms over this span."""


def phase_share(canary_phase: bool, was_canary: bool) -> float:
    """The part of a comparison's share one phase spends: ``CANARY_SHARE`` in a canary
    phase, the rest in the deploy phase after one, all of it in a deploy without one."""
    if canary_phase:
        return CANARY_SHARE
    return 1.0 - CANARY_SHARE if was_canary else 1.0


def primary_alpha(alpha: float, canary_phase: bool, was_canary: bool) -> float:
    """The family alpha of one phase of a deploy's primary test (pooled over segments)."""
    return alpha * PRIMARY_SHARE * phase_share(canary_phase, was_canary)


def segment_alpha(
    alpha: float, canary_phase: bool, was_canary: bool, segments: int, alone: bool
) -> float:
    """The family alpha of one phase of a segment's own deploy test: its part of the
    diagnosis share over ``segments``, plus the primary share while the segment is the
    version's only one (``alone``: the pooled test has one stratum, this one)."""
    share = (1.0 - PRIMARY_SHARE) / max(1, segments) + (PRIMARY_SHARE if alone else 0.0)
    return alpha * share * phase_share(canary_phase, was_canary)


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
