"""Which version a new one replaces: the deploy of a slice, decided once its first window
is closed (:meth:`service.detect.detector.Detector._deploy`); and what the new version is
compared with at a boundary (:func:`deploy_comparison`)."""

from __future__ import annotations

import bisect
from collections.abc import Mapping

from service.detect.budget import phase_alpha
from service.detect.days import same_hours, whole_days
from service.detect.history import SliceHistory
from service.detect.model import ComparisonKind, Deploy, DetectorConfig, Family, Sums
from service.detect.plans import Comparison
from service.detect.status import WhyNot
from service.detect.trend import trend_baseline, window_rows
from service.stream.windows import SliceKey

CANARY, DEPLOY = ComparisonKind.CANARY, ComparisonKind.DEPLOY


def find_previous(
    series: Mapping[SliceKey, SliceHistory], key: SliceKey, at: int, cfg: DetectorConfig
) -> Deploy | None:
    """The deploy of ``key``'s version, first seen at ``at``: the version of its segment
    with most labelled queries in the ``candidate_ms`` before it (None: no such version,
    or a version seen within the first hour of any history, a start, not a deploy)."""
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
    return Deploy(best[1], at, days)


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
        family = Family(CANARY, deploy.previous, phase_alpha(cfg.alpha, True), 1, deploy.at_ms)
        return family, since, candidate
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
    family = Family(DEPLOY, deploy.previous, phase_alpha(cfg.alpha, was_canary), 1, deploy.at_ms)
    return family, base, candidate
