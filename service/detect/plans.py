"""The looks a detector makes at one boundary, and one look itself.

A *plan* is one sequential test of one metric to look at: a slice's own comparison (one
stratum), or a version's deploy pooled over the segments it replaced the previous
version in (one stratum per segment, segment ``*``). :func:`look` runs the mixture SPRT
on it (:func:`service.metrics.sequential.msprt_strata`, :func:`measure`); once the
e-values of a slice's metrics are closed over them, :func:`conclude` says whether it
regressed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import NamedTuple

from service.detect.budget import slice_level
from service.detect.model import (
    POOLED_SEGMENT,
    BoundaryTest,
    ComparisonKind,
    Family,
    Plan,
    Sums,
)
from service.metrics.aggregates import Moments
from service.metrics.ir import MetricKey
from service.metrics.sequential import SequentialResult, closed_log_means, msprt_strata, running_p
from service.stream.windows import SliceKey

STRATUM_MIN = 30
"""A segment enters a pooled test of a metric once both its sides have this many values
(its variance estimate is then usable; its weight is small anyway)."""
Comparison = tuple[Family, Sums, Sums]
"""A slice's family, baseline sums and candidate sums at one boundary."""
RunKey = tuple[str, str, MetricKey, ComparisonKind, int]
"""(retriever, segment, metric, kind, start): one run of one sequential test."""


def run_key(plan: Plan) -> RunKey:
    """The run of the sequential test a plan looks at."""
    return (*plan.slice, plan.metric, plan.family.kind, plan.family.start_ms)


def moments(flat: Sums, index: int) -> Moments:
    """The ``index``-th watched metric's sums in a flat row."""
    return Moments(flat[3 * index], flat[3 * index + 1], flat[3 * index + 2])


def slice_plans(
    key: SliceKey,
    comparison: Comparison,
    watched: tuple[MetricKey, ...],
    min_labelled: int,
) -> list[Plan]:
    """One look per watched metric with enough values on both sides."""
    family, base, candidate = comparison
    out = []
    for index, metric in enumerate(watched):
        b, c = moments(base, index), moments(candidate, index)
        if min(b.count, c.count) >= min_labelled:
            out.append(Plan(key, metric, family, ((b, c),)))
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
            out.append(Plan(key, metric, family, strata))
    return out


class Measured(NamedTuple):
    """One look's statistics, before the family's closed testing."""

    result: SequentialResult
    baseline_mean: float
    candidate_mean: float
    n_baseline: int
    n_candidate: int


def measure(plan: Plan, tau: float) -> Measured:
    """Run the mixture SPRT on a plan (its confidence sequences at the test's level, the
    family's alpha over its slices: the upper bound is below 0 once it opens)."""
    family, strata = plan.family, plan.strata
    sides = [
        (
            (b.mean or 0.0, b.variance or 0.0, b.count),
            (c.mean or 0.0, c.variance or 0.0, c.count),
        )
        for b, c in strata
    ]
    r = msprt_strata(sides, tau=tau, alpha=slice_level(family.alpha, family.slices))
    n_candidate = sum(c.count for _, c in strata)
    # both means weighted by the candidate's mix of strata (one stratum: its own means)
    weights = [c[2] / n_candidate for _, c in sides]
    baseline_mean = sum(w * b[0] for w, (b, _) in zip(weights, sides, strict=True))
    candidate_mean = sum(w * c[0] for w, (_, c) in zip(weights, sides, strict=True))
    return Measured(r, baseline_mean, candidate_mean, sum(b.count for b, _ in strata), n_candidate)


def conclude(
    plan: Plan,
    measured: Measured,
    closed_log_e: float,
    min_effect: float,
    smallest_p: float | None,
) -> tuple[BoundaryTest, float]:
    """The test of a measured plan, given its e-value closed over its slice's metrics
    (:func:`service.metrics.sequential.closed_log_means`), and the run's smallest
    ``1 / closed e-value`` after it (the run's previous one is ``smallest_p``).

    The slice's share of the family's alpha is the test's level: it regresses once the
    closed e-value reaches ``1 / level`` and the drop is at least ``min_effect``.
    """
    key, metric, family = plan.slice, plan.metric, plan.family
    level = slice_level(family.alpha, family.slices)
    r = measured.result
    smallest = running_p(smallest_p, closed_log_e)
    test = BoundaryTest(
        retriever=key[0],
        segment=key[1],
        metric=metric,
        baseline=family.baseline,
        kind=family.kind,
        baseline_mean=measured.baseline_mean,
        candidate_mean=measured.candidate_mean,
        n_baseline=measured.n_baseline,
        n_candidate=measured.n_candidate,
        delta=r.delta,
        look=r,
        log_e=r.log_e_drop,
        closed_log_e=closed_log_e,
        level=level,
        family_alpha=family.alpha,
        p_value=min(1.0, smallest * family.slices),
        regressed=closed_log_e >= -math.log(level) and -r.delta >= min_effect,
    )
    return test, smallest


def look(
    plans: list[Plan],
    watched: tuple[MetricKey, ...],
    tau: float,
    min_effect: float,
    *,
    last_log_e: dict[RunKey, float],
    running: dict[RunKey, float],
    caps: Mapping[RunKey, float] | None = None,
) -> list[BoundaryTest]:
    """Measure every plan of a boundary, close the e-values over each slice's metrics (a
    metric not tested now counts with its run's latest e-value, or 1), conclude; keeps
    each run's latest log e-value and smallest p in ``last_log_e`` and ``running``.
    ``caps``: runs whose log e-value is at most this (an intersection-union test's)."""
    measured = [measure(plan, tau) for plan in plans]
    runs = [run_key(p) for p in plans]
    for i, run in enumerate(runs):
        if caps and run in caps:
            r = measured[i].result
            capped = replace(r, log_e_drop=min(r.log_e_drop, caps[run]))
            measured[i] = measured[i]._replace(result=capped)
    for run, m in zip(runs, measured, strict=True):
        last_log_e[run] = m.result.log_e_drop
    groups: dict[tuple[SliceKey, Family], list[int]] = {}
    for i, plan in enumerate(plans):
        groups.setdefault((plan.slice, plan.family), []).append(i)
    closed = [0.0] * len(plans)
    for (key, family), members in groups.items():
        logs = [
            last_log_e.get((*key, metric, family.kind, family.start_ms), 0.0) for metric in watched
        ]
        by_metric = dict(zip(watched, closed_log_means(logs), strict=True))
        for i in members:
            closed[i] = by_metric[plans[i].metric]
    out = []
    for plan, run, m, log_e in zip(plans, runs, measured, closed, strict=True):
        test, smallest = conclude(plan, m, log_e, min_effect, running.get(run))
        running[run] = smallest
        out.append(test)
    return out
