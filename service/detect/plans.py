"""The looks a detector makes at one boundary, and one look itself.

A *plan* is one sequential test of one metric to look at: a slice's own comparison (one
stratum), or a version's deploy pooled over the segments it replaced the previous
version in (one stratum per segment, segment ``*``). :func:`look` runs the mixture SPRT
on it (:func:`service.metrics.sequential.msprt_strata`) and says whether it regressed.
"""

from __future__ import annotations

import math

from service.detect.model import (
    POOLED_SEGMENT,
    BoundaryTest,
    Family,
    Plan,
    Sums,
)
from service.metrics.aggregates import Moments
from service.metrics.ir import MetricKey
from service.metrics.sequential import msprt_strata, running_p
from service.stream.windows import SliceKey

STRATUM_MIN = 30
"""A segment enters a pooled test of a metric once both its sides have this many values
(its variance estimate is then usable; its weight is small anyway)."""
Comparison = tuple[Family, Sums, Sums]
"""A slice's family, baseline sums and candidate sums at one boundary."""


def moments(flat: Sums, index: int) -> Moments:
    """The ``index``-th watched metric's sums in a flat row."""
    return Moments(flat[3 * index], flat[3 * index + 1], flat[3 * index + 2])


def slice_plans(
    key: SliceKey,
    comparison: Comparison,
    watched: tuple[MetricKey, ...],
    min_labelled: int,
) -> list[Plan]:
    """One look per watched metric with enough values on both sides; the family's
    members are every metric of every slice in it, tested now or not."""
    family, base, candidate = comparison
    members = family.slices * len(watched)
    out = []
    for index, metric in enumerate(watched):
        b, c = moments(base, index), moments(candidate, index)
        if min(b.count, c.count) >= min_labelled:
            out.append(Plan(key, metric, family, members, ((b, c),)))
    return out


def pooled_plans(
    retriever: str,
    family: Family,
    group: list[Comparison],
    watched: tuple[MetricKey, ...],
    min_labelled: int,
) -> list[Plan]:
    """One stratified look per watched metric over the segments of ``group`` with
    ``STRATUM_MIN`` values on both sides: at least two of them, and ``min_labelled``
    values on each side in all."""
    key = (retriever, POOLED_SEGMENT)
    out = []
    for index, metric in enumerate(watched):
        pairs = ((moments(base, index), moments(cand, index)) for _, base, cand in group)
        strata = tuple((b, c) for b, c in pairs if min(b.count, c.count) >= STRATUM_MIN)
        if (
            len(strata) > 1
            and sum(b.count for b, _ in strata) >= min_labelled
            and sum(c.count for _, c in strata) >= min_labelled
        ):
            out.append(Plan(key, metric, family, len(watched), strata))
    return out


def look(
    plan: Plan, tau: float, min_effect: float, smallest_p: float | None
) -> tuple[BoundaryTest, float]:
    """One look at a plan, and the run's smallest ``1 / e-value`` after it (the run's
    previous one is ``smallest_p``)."""
    key, metric, family, members, strata = plan
    level = family.alpha / members
    sides = [
        (
            (b.mean or 0.0, b.variance or 0.0, b.count),
            (c.mean or 0.0, c.variance or 0.0, c.count),
        )
        for b, c in strata
    ]
    r = msprt_strata(sides, tau=tau, alpha=level)
    n_candidate = sum(c.count for _, c in strata)
    # both means weighted by the candidate's mix of strata (one stratum: its own means)
    weights = [c[2] / n_candidate for _, c in sides]
    baseline_mean = sum(w * b[0] for w, (b, _) in zip(weights, sides, strict=True))
    candidate_mean = sum(w * c[0] for w, (_, c) in zip(weights, sides, strict=True))
    smallest = running_p(smallest_p, r)
    test = BoundaryTest(
        retriever=key[0],
        segment=key[1],
        metric=metric,
        baseline=family.baseline,
        kind=family.kind,
        baseline_mean=baseline_mean,
        candidate_mean=candidate_mean,
        n_baseline=sum(b.count for b, _ in strata),
        n_candidate=n_candidate,
        delta=r.delta,
        ci_low=r.ci[0],
        ci_high=r.ci[1],
        log_e=r.log_e,
        level=level,
        family_alpha=family.alpha,
        p_value=min(1.0, smallest * members),
        regressed=r.log_e >= -math.log(level) and -r.delta >= min_effect,
    )
    return test, smallest
