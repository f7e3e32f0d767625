"""Which version a new one replaces: the deploy of a slice, decided once its first window
is closed (:meth:`service.detect.detector.Detector._deploy`); what the new version is
compared with at a boundary (:func:`deploy_comparison`); and the looks of a deploy's
comparisons, its segments' own and the primary one pooled over them
(:func:`deploy_plans`)."""

from __future__ import annotations

import bisect
from collections.abc import Mapping

from service.detect.budget import primary_alpha, segment_alpha
from service.detect.days import same_hours, whole_days
from service.detect.history import SliceHistory
from service.detect.model import (
    POOLED_SEGMENT,
    ComparisonKind,
    Deploy,
    DetectorConfig,
    Family,
    Plan,
    Sums,
)
from service.detect.plans import Comparison, pooled_plans, slice_plans
from service.detect.status import ComparisonBook, WhyNot
from service.detect.trend import trend_baseline, window_rows
from service.metrics.ir import MetricKey
from service.stream.windows import SliceKey

CANARY, DEPLOY = ComparisonKind.CANARY, ComparisonKind.DEPLOY


def find_previous(
    series: Mapping[SliceKey, SliceHistory], key: SliceKey, at: int, cfg: DetectorConfig
) -> Deploy | None:
    """The deploy of ``key``'s version, first seen at ``at``: the version of its segment
    with most labelled queries in the ``candidate_ms`` before it (None: no such version,
    or a version seen within the first hour of any history, a start, not a deploy), and
    how many segments that version served queries in then (its diagnosis tests
    share their part of the budget over them: :mod:`service.detect.budget`)."""
    best: tuple[int, str] | None = None
    history_from = None
    for (retriever, segment), other in series.items():
        if segment != key[1] or retriever == key[0]:
            continue
        first = other.first_start_ms
        if first is not None and (history_from is None or first < history_from):
            history_from = first
        recent = other.total(at - cfg.candidate_ms, at)
        labelled = max(recent[0::3], default=0)
        if labelled and (best is None or (labelled, retriever) > best):
            best = (labelled, retriever)
    # a version seen within the first hour of any history is not a deploy but a start
    if best is None or history_from is None or history_from > at - cfg.candidate_ms:
        return None
    days = whole_days(series[best[1], key[1]].first_start_ms, at, cfg.baseline_days)
    served = sum(
        1
        for (retriever, _), other in series.items()
        if retriever == best[1] and other.served(at - cfg.candidate_ms, at)
    )
    return Deploy(best[1], at, days, max(1, served))


def deploy_comparison(
    cfg: DetectorConfig,
    histories: Mapping[SliceKey, SliceHistory],
    canaried: set[SliceKey],
    key: SliceKey,
    *,
    deploy: Deploy,
    boundary: int,
) -> Comparison | WhyNot:
    """The canary comparison while the previous version serves beside the new one, the
    deploy comparison once it does not; why not once the new version itself stopped
    serving (a rollback: :mod:`service.detect.lifecycle` closes its regression) or a
    deploy without a day of history is past its watch. A slice whose previous version
    served beside it joins ``canaried``."""
    series = histories[key]
    if not series.served(boundary - cfg.candidate_ms, boundary):
        return WhyNot.NOT_SERVING
    # both sides end where the new version's evidence ends: its last closed window (not
    # a later one already known, so that catching up equals stepping through)
    end = series.starts[bisect.bisect_left(series.starts, boundary) - 1] + cfg.window_ms
    previous = histories.get((deploy.previous, key[1]))
    candidate = series.total(deploy.at_ms, end)
    since: Sums = previous.total(deploy.at_ms, end) if previous else [0] * series.width
    # beside the new one: in its last hour of evidence, after the switch's own window
    # (which holds both versions' queries of a full rollout)
    recent = max(deploy.at_ms + cfg.window_ms, end - cfg.candidate_ms)
    serving = previous is not None and previous.served(recent, end)
    was_canary = key in canaried
    if serving:
        canaried.add(key)
        alpha = segment_alpha(cfg.alpha, True, True, deploy.segments, alone=False)
        return Family(CANARY, deploy.previous, alpha, 1, deploy.at_ms), since, candidate
    if deploy.days and previous is not None:
        # the previous version over the same hours of earlier days: a daily cycle of
        # traffic and quality cancels (the full day before would not match the hours)
        base: Sums = same_hours(previous, deploy.at_ms, end, deploy.days)  # (decided once)
    else:  # less than a day of its history: a trend across the switch
        if end - deploy.at_ms > cfg.no_history_watch_ms:
            return WhyNot.WATCH_ENDED  # (past it the cycle's curvature would bias it)
        # at least no_history_span_ms, then mirrored about the switch (where a quadratic
        # part of a daily cycle cancels too)
        span = min(cfg.baseline_ms, max(cfg.no_history_span_ms, end - deploy.at_ms))
        # (none when the previous version's windows are forgotten: too few values)
        before = window_rows(previous, deploy.at_ms - span, end, deploy.at_ms)
        after = window_rows(series, deploy.at_ms, end, deploy.at_ms)
        base = trend_baseline(before, after, series.width // 3, cfg.window_ms)
    alpha = segment_alpha(cfg.alpha, False, was_canary, deploy.segments, alone=False)
    return Family(DEPLOY, deploy.previous, alpha, 1, deploy.at_ms), base, candidate


Group = tuple[str, str]
"""A deploy: (new version, previous version)."""


def deploy_plans(
    cfg: DetectorConfig,
    groups: Mapping[Group, list[tuple[SliceKey, Comparison]]],
    *,
    deploys: Mapping[SliceKey, Deploy | None],
    canaried: set[SliceKey],
    pooled: set[Group],
    book: ComparisonBook,
    watched: tuple[MetricKey, ...],
) -> list[Plan]:
    """The looks of every deploy compared at a boundary: the primary test pooled over its
    segments (once two have values), then each segment's own. A deploy whose pooled test
    looked joins ``pooled``; until then, the only segment with values enough to be tested
    is the pooled test's one stratum and carries the primary share
    (:mod:`service.detect.budget`)."""
    planned: list[Plan] = []
    for group, members in groups.items():
        if len(members) > 1:
            comparisons = [c for _, c in members]
            looks = _pooled_plans(
                cfg,
                group,
                comparisons,
                deploys=deploys,
                canaried=canaried,
                book=book,
                watched=watched,
            )
            if looks:
                pooled.add(group)
            planned += looks
        looked = {key: slice_plans(key, c, watched, cfg.min_labelled) for key, c in members}
        tested = [key for key, plans in looked.items() if plans]
        for key, (family, base, candidate) in members:
            plans = looked[key]
            if group not in pooled and tested == [key]:  # the pooled test's one stratum
                deploy = deploys[key]
                assert deploy is not None  # (compared: decided)
                canary = family.kind == CANARY
                alpha = segment_alpha(
                    cfg.alpha, canary, key in canaried, deploy.segments, alone=True
                )
                family = family._replace(alpha=alpha)  # noqa: PLW2901
                plans = [plan._replace(family=family) for plan in plans]
            book.compared(key, family, base, candidate)
            planned += plans
    return planned


def _pooled_plans(
    cfg: DetectorConfig,
    group: Group,
    members: list[Comparison],
    *,
    deploys: Mapping[SliceKey, Deploy | None],
    canaried: set[SliceKey],
    book: ComparisonBook,
    watched: tuple[MetricKey, ...],
) -> list[Plan]:
    """The deploy of a version over every segment it replaced the previous one in, as one
    stratified test per metric (segment ``*``): the deploy's primary test, with the
    primary share of its ``alpha`` per phase (:mod:`service.detect.budget`)."""
    retriever, previous = group
    canary = any(family.kind == CANARY for family, _, _ in members)
    if canary:
        canaried.add((retriever, POOLED_SEGMENT))
    alpha = primary_alpha(cfg.alpha, canary, (retriever, POOLED_SEGMENT) in canaried)
    start = min(
        d.at_ms
        for (r, _), d in deploys.items()
        if r == retriever and d is not None and d.previous == previous
    )
    family = Family(CANARY if canary else DEPLOY, previous, alpha, 1, start)
    base = [sum(col) for col in zip(*(b for _, b, _ in members), strict=True)]
    candidate = [sum(col) for col in zip(*(c for _, _, c in members), strict=True)]
    book.compared((retriever, POOLED_SEGMENT), family, base, candidate)
    return pooled_plans(retriever, family, members, watched, cfg.min_labelled)
