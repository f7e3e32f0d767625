"""The regression detector on hand-built closed windows (no pipeline, no clock).

Each comparison is a sequential test (mixture SPRT) looked at every boundary; the
guarantee itself is tested on many null streams in ``tests/unit/metrics/test_sequential.py``.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from service.detect.compare import compare_metrics
from service.detect.detector import Detector
from service.detect.model import LABELLED_SHARE, POOLED_SEGMENT, DetectorConfig
from service.metrics.aggregates import SCALE, aggregate
from service.metrics.sequential import log_drop_ratio
from service.metrics.stats import t_sf, welch_test
from service.stream.windows import ClosedWindow

W = 300_000
H = 3_600_000
D = 24 * H
T0 = 1_796_083_200_000  # 2026-12-01T00:00:00Z, a multiple of the window
CONFIG = DetectorConfig(
    metrics=("recall@5",),
    window_ms=W,
    attribution_ms=30 * 60_000,
    no_history_watch_ms=D,  # most tests here have hours of history, not a day
)
DEFAULT_NO_HISTORY_WATCH = DetectorConfig().no_history_watch_ms


def window(
    retriever: str,
    start: int,
    rng: np.random.Generator,
    p: float,
    n: int,
    segment: str = "kb",
    find: float = 1.0,
) -> ClosedWindow:
    """A closed window of n finalised queries, each labelled with probability ``find``,
    whose recall@5 (over the labelled ones) is 1 with probability p."""
    labelled = int((rng.random(n) < find).sum()) if find < 1.0 else n
    values = (rng.random(labelled) < p).astype(np.float64)
    return ClosedWindow(
        retriever, segment, 0, start, start + W, n, labelled, aggregate({"recall@5": values})
    )


def traffic(
    retriever: str,
    start: int,
    hours: float,
    p: float,
    per_window: int,
    seed: int,
    segment: str = "kb",
    find: float = 1.0,
) -> list[ClosedWindow]:
    rng = np.random.default_rng(seed)
    n = round(hours * H / W)
    return [window(retriever, start + i * W, rng, p, per_window, segment, find) for i in range(n)]


def run(windows: list[ClosedWindow], config: DetectorConfig = CONFIG) -> Detector:
    detector = Detector(config)
    detector.add(windows)
    detector.advance(max(w.end_ms for w in windows))
    return detector


# -- Welch ---------------------------------------------------------------------------------


def test_welch_matches_the_textbook_formula() -> None:
    rng = np.random.default_rng(1)
    a, b = rng.normal(0.7, 0.2, 40), rng.normal(0.6, 0.35, 25)
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    t = (b.mean() - a.mean()) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1))
    r = welch_test((a.mean(), a.var(ddof=1), a.size), (b.mean(), b.var(ddof=1), b.size))
    assert r.delta == pytest.approx(b.mean() - a.mean(), abs=1e-12)
    assert r.df == pytest.approx(df, rel=1e-12)
    assert r.p_lower == pytest.approx(t_sf(-t, df), rel=1e-12)
    assert r.p_two_sided == pytest.approx(2 * t_sf(abs(t), df), rel=1e-12)
    assert r.ci[0] < r.delta < r.ci[1]


def test_welch_with_equal_sizes_and_variances_is_students_test() -> None:
    r = welch_test((0.5, 0.04, 30), (0.45, 0.04, 30))
    assert r.df == pytest.approx(58.0)
    t = -0.05 / math.sqrt(2 * 0.04 / 30)
    assert r.p_lower == pytest.approx(t_sf(-t, 58.0), rel=1e-12)
    assert 0.15 < r.p_lower < 0.2


def test_welch_without_variance_is_exact() -> None:
    assert welch_test((1.0, 0.0, 10), (0.9, 0.0, 10)).p_lower == 0.0
    assert welch_test((1.0, 0.0, 10), (1.0, 0.0, 10)).p_lower == 1.0
    with pytest.raises(ValueError, match="at least 2"):
        welch_test((1.0, 0.0, 1), (1.0, 0.0, 10))


# -- deploy comparison ---------------------------------------------------------------------


def test_a_bad_deploy_opens_a_regression_against_the_previous_version() -> None:
    deploy = T0 + 6 * H
    windows = traffic("v7", T0, 6, 0.85, 40, seed=1)
    windows += traffic("v8", deploy, 3, 0.70, 40, seed=2)
    detector = run(windows)
    opened = [r for r in detector.opened if r.opening.retriever == "v8"]
    assert len(opened) == 1
    r = opened[0]
    assert (r.opening.kind, r.opening.baseline, r.opening.metric) == ("deploy", "v7", "recall@5")
    # first possible boundary: 200 labelled queries = 5 windows of 40 after the deploy
    assert r.evidence_end_ms >= deploy + 5 * W
    assert r.opened_ms == r.evidence_end_ms + 30 * 60_000
    assert r.opening.delta == pytest.approx(r.opening.candidate_mean - r.opening.baseline_mean)
    assert -0.25 < r.opening.delta < -0.05
    assert r.opening.p_value < CONFIG.alpha
    # one family per deploy; a deploy to one segment spends the whole alpha there (its
    # pooled test would be this one); its metrics (recall@5, the labelled share) are closed
    assert r.opening.level == pytest.approx(CONFIG.alpha)
    assert r.opening.closed_e_value >= 1 / r.opening.level
    # closed over recall@5 and a labelled share that did not move: about their mean
    assert r.opening.closed_e_value <= r.opening.e_value
    low, high = r.opening.ci
    assert low < r.opening.delta < high < 0  # the confidence sequence excludes no change
    record = r.to_record()
    assert set(record) >= {"retriever", "segment", "metric", "baseline", "delta", "p_value"}
    assert record["kind"] == "deploy"
    assert record["e_value"] == pytest.approx(r.opening.e_value)
    assert record["alpha"] == pytest.approx(CONFIG.alpha)
    assert record["opened_at"].endswith("Z")
    assert ("v8", "kb", "recall@5", "v7") in detector.open


def test_an_equally_good_deploy_opens_nothing() -> None:
    deploy = T0 + 6 * H
    windows = traffic("v7", T0, 6, 0.85, 40, seed=1) + traffic("v8", deploy, 6, 0.85, 40, seed=2)
    detector = run(windows)
    assert not detector.opened
    tested = set(detector.latest)
    assert ("v8", "kb", "recall@5", "v7") in tested  # it was compared, not skipped


def test_low_volume_is_never_compared() -> None:
    deploy = T0 + 6 * H
    # 10 labelled queries per window: 120 in the hour after the deploy, under 200
    windows = traffic("v7", T0, 6, 0.85, 40, seed=1) + traffic("v8", deploy, 1, 0.2, 10, seed=2)
    detector = run(windows, DetectorConfig(metrics=("recall@5",), deploy_watch_ms=H))
    assert not detector.opened


def test_a_significant_but_tiny_drop_is_not_a_regression() -> None:
    deploy = T0 + 6 * H
    windows = traffic("v7", T0, 6, 0.900, 4000, seed=1) + traffic("v8", deploy, 3, 0.888, 4000, 2)
    detector = run(windows)
    deploy_tests = [c for c in detector.latest.values() if c.kind == "deploy"]
    assert deploy_tests
    assert deploy_tests[0].p_value < 1e-6  # significant ...
    assert not detector.opened  # ... but smaller than min_effect (0.02)


def test_maturing_windows_are_never_compared() -> None:
    deploy = T0 + 6 * H
    windows = traffic("v7", T0, 6, 0.85, 40, seed=1) + traffic("v8", deploy, 3, 0.5, 40, seed=2)
    detector = Detector(CONFIG)
    detector.add(windows)  # all closed windows are known ...
    detector.advance(deploy + 4 * W)  # ... but only those ending by here are final
    assert not detector.opened
    detector.advance(deploy + 6 * W)
    assert len(detector.opened) == 1


def test_results_do_not_depend_on_batching_or_order() -> None:
    deploy = T0 + 6 * H
    windows = traffic("v7", T0, 8, 0.85, 40, seed=1) + traffic("v8", deploy, 4, 0.72, 40, seed=2)
    at_once = run(windows)
    step = Detector(CONFIG)
    by_end: dict[int, list[ClosedWindow]] = {}
    for w in windows:
        by_end.setdefault(w.end_ms, []).append(w)
    for end in sorted(by_end):
        step.add(reversed(by_end[end]))
        step.advance(end)
    assert [r.to_record() for r in step.opened] == [r.to_record() for r in at_once.opened]
    assert at_once.opened


def test_versions_present_from_the_start_are_not_a_deploy() -> None:
    windows = traffic("v7", T0, 6, 0.85, 40, seed=1) + traffic("v8", T0 + W, 6, 0.6, 40, seed=2)
    detector = run(windows)
    assert not detector.latest  # no deploy, and no day of history for drift yet
    assert not detector.opened


def _cycled(
    retriever: str,
    start: int,
    hours: int,
    seed: int,
    drop: float = 0.0,
    drop_from: int | None = None,
) -> list[ClosedWindow]:
    """A version with a daily cycle in quality (0.75 at night to 0.91 in the afternoon)
    and in volume (20 to 60 labelled queries per window); ``drop`` lower from
    ``drop_from`` on (from the start when None)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(hours * 12):
        start_i = start + i * W
        phase = math.sin(2 * math.pi * ((start_i % D) / D - 0.375))
        lower = drop if drop_from is None or start_i >= drop_from else 0.0
        out.append(
            window(retriever, start_i, rng, 0.83 + 0.08 * phase - lower, round(40 + 20 * phase))
        )
    return out


def test_a_deploy_after_a_day_of_history_is_compared_with_the_same_hours() -> None:
    """A no-change deploy at night: against the previous version's whole day it would look
    like a drop of several points; against the same hours the day before it is none."""
    switch = T0 + 26 * H  # 02:00 on the second day
    windows = _cycled("v7", T0, 26, seed=1) + _cycled("v8", switch, 8, seed=2)
    detector = run(windows)
    c = detector.latest["v8", "kb", "recall@5", "v7"]
    assert c.kind == "deploy"
    same_hours = [
        w for w in windows if w.retriever == "v7" and T0 + 2 * H <= w.start_ms < T0 + 10 * H
    ]
    assert c.n_baseline == sum(w.labelled for w in same_hours)
    assert not detector.opened
    whole_day = [w for w in windows if w.retriever == "v7" and w.start_ms >= switch - D]
    day_mean = sum(w.metrics["recall@5"].sum for w in whole_day) / sum(
        w.metrics["recall@5"].count for w in whole_day
    )
    assert day_mean - c.candidate_mean > 0.04  # what a whole-day baseline would have called a drop


def _trending(
    retriever: str, start: int, hours: int, seed: int, drop: float = 0.0, per_window: int = 40
) -> list[ClosedWindow]:
    """Recall falling by 1.5 points an hour from 0.90 at ``T0 + 12 h``, all day long
    (a linear stretch of a daily cycle); ``drop`` lower throughout."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(hours * 12):
        t = start + i * W
        p = 0.90 - 0.015 * (t + W / 2 - T0 - 12 * H) / H - drop
        out.append(window(retriever, t, rng, p, per_window))
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_without_history_a_linear_trend_across_the_switch_is_not_a_drop(seed: int) -> None:
    """A no-change deploy with 9 hours of history while quality falls 1.5 points an hour:
    against a mean of the hours before the switch, the decline looks like a drop that
    grows with the span (about 6 points after 4 hours; watched that long, the comparison
    before this one opened on seed 2). The line shared by both versions carries the trend
    across the switch: the deploy is tested for the whole default ``no_history_watch_ms``
    (4 h, twice the old comparison's) and nothing opens."""
    switch = T0 + 21 * H
    windows = _trending("v7", switch - 9 * H, 9, seed) + _trending("v8", switch, 8, seed + 10)
    key = ("v8", "kb", "recall@5", "v7")
    detector = Detector(replace(CONFIG, no_history_watch_ms=DEFAULT_NO_HISTORY_WATCH))
    detector.add(windows)
    detector.advance(switch + DEFAULT_NO_HISTORY_WATCH)
    c = detector.latest[key]
    assert c.kind == "deploy"  # still tested, 4 hours after the switch
    assert c.n_candidate == DEFAULT_NO_HISTORY_WATCH // W * 40
    # the line's prediction at v8's hours, not the mean of v7's last hours
    before = [w for w in windows if w.retriever == "v7" and w.start_ms >= switch - 4 * H]
    plain = sum(w.metrics["recall@5"].sum for w in before) / sum(
        w.metrics["recall@5"].count for w in before
    )
    assert plain - c.candidate_mean > 0.03  # 0.06 expected
    # the line at v8's hours: 0.765 at the switch, 1.5 points an hour lower, 2 h on average
    assert c.baseline_mean == pytest.approx(0.735, abs=3 * math.sqrt(c.look.variance))
    assert abs(c.delta) < 3 * math.sqrt(c.look.variance)  # no drop, within its noise
    detector.advance(switch + 8 * H)
    assert not detector.opened
    assert key not in detector.latest  # its watch ended


def test_without_history_a_drop_is_found_after_two_hours() -> None:
    """A 10-point drop across the same falling trend, at a volume (300 an hour) where the
    first 2 hours of evidence (the whole watch before the trend) do not suffice: it opens
    later, within the 4-hour watch."""
    switch = T0 + 21 * H
    windows = _trending("v7", switch - 9 * H, 9, seed=5, per_window=25)
    windows += _trending("v8", switch, 8, seed=6, drop=0.10, per_window=25)
    detector = Detector(replace(CONFIG, no_history_watch_ms=DEFAULT_NO_HISTORY_WATCH))
    detector.add(windows)
    detector.advance(switch + 8 * H)
    opened = [r for r in detector.opened if r.opening.retriever == "v8"]
    assert [r.opening.key for r in opened] == [("v8", "kb", "recall@5", "v7")]
    assert switch + 2 * H < opened[0].evidence_end_ms <= switch + DEFAULT_NO_HISTORY_WATCH
    assert opened[0].opening.delta < -CONFIG.min_effect


def test_a_bad_deploy_at_night_is_still_found_against_the_same_hours() -> None:
    switch = T0 + 26 * H
    windows = _cycled("v7", T0, 26, seed=1) + _cycled("v8", switch, 8, seed=2, drop=0.12)
    detector = run(windows)
    opened = [r for r in detector.opened if r.opening.retriever == "v8"]
    assert opened
    assert opened[0].opening.kind == "deploy"


# -- canaries --------------------------------------------------------------------------


def test_a_canary_is_compared_with_the_old_version_over_the_same_span() -> None:
    """v8 serves 20% beside v7: the comparison is concurrent (same hours, same traffic
    mix), against v7 since the switch, not against v7's past."""
    switch = T0 + 6 * H
    windows = traffic("v7", T0, 6, 0.85, 50, seed=1)
    windows += traffic("v7", switch, 4, 0.85, 40, seed=2)  # 80% of the traffic
    windows += traffic("v8", switch, 4, 0.70, 10, seed=3)  # the canary, 20%
    detector = run(windows)
    key = ("v8", "kb", "recall@5", "v7")
    c = detector.latest[key]
    assert c.kind == "canary"
    assert c.n_baseline == 4 * 12 * 40  # v7 over the same four hours, nothing before
    assert c.n_candidate == 4 * 12 * 10
    # two thirds of the deploy's alpha (its only segment): a deploy phase may come
    assert c.family_alpha == pytest.approx(CONFIG.alpha * 2 / 3)
    opened = [r for r in detector.opened if r.opening.retriever == "v8"]
    assert [r.opening.kind for r in opened] == ["canary"]


def test_a_rollout_in_the_middle_of_a_window_is_not_a_canary() -> None:
    """The switch's own window holds queries of both versions; that is not the old version
    serving beside the new one, so the comparison is a deploy's from the first look."""
    deploy = T0 + 6 * H
    windows = traffic("v7", T0, 6, 0.85, 40, seed=1)
    windows += traffic("v7", deploy, 1 / 12, 0.85, 15, seed=2)  # 15 queries before the switch
    windows += traffic("v8", deploy, 2, 0.85, 40, seed=3)
    detector = Detector(CONFIG)
    detector.add(windows)
    detector.advance(deploy + 30 * 60_000)
    c = detector.latest["v8", "kb", "recall@5", "v7"]
    assert c.kind == "deploy"
    assert c.family_alpha == pytest.approx(CONFIG.alpha)  # no canary phase: all of it


def test_a_promoted_canary_keeps_one_comparison() -> None:
    switch = T0 + 6 * H
    promoted = switch + 3 * H
    windows = traffic("v7", T0, 6, 0.85, 50, seed=1)
    windows += traffic("v7", switch, 3, 0.85, 40, seed=2)
    windows += traffic("v8", switch, 3, 0.70, 10, seed=3)
    windows += traffic("v8", promoted, 4, 0.70, 50, seed=4)  # now all the traffic
    detector = run(windows)
    key = ("v8", "kb", "recall@5", "v7")
    c = detector.latest[key]
    assert c.kind == "deploy"  # v7 no longer serves: against its past and its canary share
    assert c.n_baseline == 72 * 50 + 36 * 40
    assert c.family_alpha == pytest.approx(CONFIG.alpha / 3)  # what the canary phase left
    v8 = [r for r in detector.opened if r.opening.retriever == "v8"]
    assert len(v8) == 1  # one regression for the key, opened by the canary phase
    assert v8[0].opening.kind == "canary"
    assert key in detector.open


def test_a_deploy_to_several_segments_is_also_tested_pooled_over_them() -> None:
    """v8 replaces v7 in two segments: besides each segment's test, one stratified test
    over both (segment ``*``) has twice the evidence and opens first."""
    deploy = T0 + 30 * H  # a day of history: the same hours a day earlier
    windows: list[ClosedWindow] = []
    for seed, segment in ((1, "kb"), (3, "docs")):
        windows += traffic("v7", T0, 30, 0.85, 20, seed=seed, segment=segment)
        windows += traffic("v8", deploy, 4, 0.76, 20, seed=seed + 1, segment=segment)
    detector = run(windows)
    first = {r.opening.segment: r for r in detector.opened if r.opening.metric == "recall@5"}
    assert set(first) == {"kb", "docs", POOLED_SEGMENT}
    pooled = first[POOLED_SEGMENT].opening
    assert (pooled.kind, pooled.baseline) == ("deploy", "v7")
    segments = [first["kb"].evidence_end_ms, first["docs"].evidence_end_ms]
    assert first[POOLED_SEGMENT].evidence_end_ms < min(segments)
    # the primary share of the deploy's alpha, closed over the watched metrics
    assert pooled.family_alpha == pytest.approx(CONFIG.alpha * 3 / 4)
    assert pooled.level == pytest.approx(CONFIG.alpha * 3 / 4)
    own = first["kb"].opening  # a diagnosis test: its part of the rest
    assert own.family_alpha == pytest.approx(CONFIG.alpha / 4 / 2)
    # both segments' values: as many as both segments' v8 windows up to its evidence end
    n = sum(
        w.metrics["recall@5"].count
        for w in windows
        if w.retriever == "v8" and w.end_ms <= first[POOLED_SEGMENT].evidence_end_ms
    )
    assert pooled.n_candidate == n


def test_a_deploy_to_one_segment_has_no_pooled_test() -> None:
    deploy = T0 + 30 * H  # a day of history: the same hours a day earlier
    windows = traffic("v7", T0, 30, 0.85, 20, seed=1, segment="kb")
    windows += traffic("v7", T0, 34, 0.85, 20, seed=2, segment="docs")
    windows += traffic("v8", deploy, 4, 0.70, 20, seed=3, segment="kb")
    detector = run(windows)
    assert {k[1] for k in detector.latest if k[0] == "v8"} == {"kb"}
    assert [r.opening.segment for r in detector.opened] == ["kb"]
    # its pooled test would be this one: kb's test carries the primary share (three
    # quarters) besides its own diagnosis share (a quarter over v7's two segments)
    assert detector.opened[0].opening.family_alpha == pytest.approx(CONFIG.alpha * 7 / 8)


def test_a_segment_carries_the_primary_share_only_until_the_pooled_test_looks() -> None:
    """v8 replaces v7 in kb, two hours later in docs too: kb's test has the primary share
    while it is v8's only segment; once docs is compared too (the pooled test looks as
    soon as docs has values enough), kb's test has its diagnosis share only and the
    pooled test the primary share, never both at once."""
    deploy = T0 + 30 * H
    windows = traffic("v7", T0, 30, 0.85, 20, seed=1, segment="kb")
    windows += traffic("v7", T0, 32, 0.85, 20, seed=2, segment="docs")
    windows += traffic("v8", deploy, 6, 0.85, 20, seed=3, segment="kb")
    windows += traffic("v8", deploy + 2 * H, 4, 0.85, 20, seed=4, segment="docs")
    detector = Detector(CONFIG)
    detector.add(windows)
    kb: list[tuple[int, float]] = []
    pooled: list[tuple[int, float]] = []
    for boundary in range(deploy + W, deploy + 6 * H + W, W):
        detector.advance(boundary)
        for key, c in detector.latest.items():
            if key[0] == "v8" and key[2] == "recall@5":
                (pooled if key[1] == POOLED_SEGMENT else kb if key[1] == "kb" else []).append(
                    (boundary, c.family_alpha)
                )
    assert pooled, "the pooled test looked once docs had values"
    first_pooled = pooled[0][0]
    assert first_pooled > deploy + 2 * H
    switch = next(b for b, a in kb if a < CONFIG.alpha / 2)
    assert deploy + 2 * H < switch <= first_pooled
    before = [a for b, a in kb if b < switch]
    after = [a for b, a in kb if b >= switch]
    assert before == pytest.approx([CONFIG.alpha * 7 / 8] * len(before))
    assert after == pytest.approx([CONFIG.alpha / 8] * len(after))
    assert [a for _, a in pooled] == pytest.approx([CONFIG.alpha * 3 / 4] * len(pooled))


def test_the_pooled_test_weighs_each_segment_by_the_candidates_mix() -> None:
    """kb's recall is 0.9 and docs' 0.5 under both versions, but v8 serves mostly docs:
    the plain pooled means differ by 0.15, the stratified difference is about 0."""
    deploy = T0 + 30 * H  # a day of history: the same hours a day earlier
    windows: list[ClosedWindow] = []
    for seed, segment, p, after in ((1, "kb", 0.9, 10), (3, "docs", 0.5, 70)):
        windows += traffic("v7", T0, 30, p, 40, seed=seed, segment=segment)
        windows += traffic("v8", deploy, 4, p, after, seed=seed + 1, segment=segment)
    detector = run(windows)
    c = detector.latest["v8", POOLED_SEGMENT, "recall@5", "v7"]
    assert abs(c.delta) < 0.03
    # the baseline is v7 reweighted to v8's mix (1/8 kb, 7/8 docs), not v7's plain mean
    assert c.baseline_mean == pytest.approx(0.9 / 8 + 0.5 * 7 / 8, abs=0.02)
    plain = sum(w.metrics["recall@5"].sum_fx for w in windows if w.retriever == "v7") / sum(
        w.metrics["recall@5"].count for w in windows if w.retriever == "v7"
    )
    assert plain / SCALE == pytest.approx(0.7, abs=0.02)
    assert not [r for r in detector.opened if r.opening.retriever == "v8"]


def test_a_rolled_back_version_stops_being_compared_and_its_regression_closes() -> None:
    """After a rollback the new version's evidence ends; the previous version's same hours
    are not compared with it beyond that, and once it has served nothing for an hour it is
    not tested at all, so its regression closes after the hysteresis."""
    switch = T0 + 26 * H
    back = switch + 2 * H
    windows = _cycled("v7", T0, 26, seed=1) + _cycled("v8", switch, 2, seed=2, drop=0.3)
    windows += _cycled("v7", back, 6, seed=3)
    detector = run(windows)
    v8 = [r for r in detector.opened if r.opening.retriever == "v8"]
    assert v8
    assert all(r.evidence_end_ms <= back for r in v8)
    assert all(r.closed_ms is not None for r in v8)
    assert not [k for k in detector.open if k[0] == "v8"]


# -- the labelled share ----------------------------------------------------------------


def test_a_drop_in_find_rate_alone_opens_on_the_labelled_share() -> None:
    """The new version finds the answer less often: its misses leave no label, so recall
    over the labelled queries does not move, but the labelled share falls."""
    deploy = T0 + 30 * H  # a day of history: the same hours a day earlier
    windows = traffic("v7", T0, 30, 0.85, 60, seed=1, find=0.66)
    windows += traffic("v8", deploy, 4, 0.85, 60, seed=2, find=0.56)
    detector = run(windows)
    opened = [r for r in detector.opened if r.opening.retriever == "v8"]
    assert [r.opening.metric for r in opened] == [LABELLED_SHARE]
    r = opened[0].opening
    assert r.baseline_mean == pytest.approx(0.66, abs=0.02)
    # every finalised query, labelled or not, of v7's same hours one day earlier
    assert r.n_baseline == (opened[0].evidence_end_ms - deploy) // W * 60
    assert ("v8", "kb", "recall@5", "v7") in detector.latest  # tested, not regressed


def test_the_labelled_share_can_be_left_out() -> None:
    deploy = T0 + 6 * H
    windows = traffic("v7", T0, 6, 0.85, 60, seed=1, find=0.66)
    windows += traffic("v8", deploy, 4, 0.85, 60, seed=2, find=0.56)
    detector = run(windows, replace(CONFIG, labelled_share=False))
    assert not detector.opened


# -- drift ---------------------------------------------------------------------------------


def test_a_daily_cycle_is_not_drift() -> None:
    """Same hours one day earlier: the cycle cancels. Against the previous 24 h (today's
    rule before this detector) the afternoon-to-night swing alone is a 0.08 drop."""
    detector = run(_cycled("v7", T0, 72, seed=1))
    drift = [c for c in detector.latest.values() if c.kind == "drift"]
    assert drift  # tested
    assert all(c.baseline == "previous_day" for c in drift)
    assert not detector.opened


def test_drift_opens_against_the_same_hours_of_the_day_before() -> None:
    drop = T0 + 50 * H
    detector = run(_cycled("v7", T0, 56, seed=2, drop=0.10, drop_from=drop))
    assert [(r.opening.kind, r.opening.baseline) for r in detector.opened] == [
        ("drift", "previous_day")
    ]
    r = detector.opened[0]
    assert drop < r.evidence_end_ms <= drop + 6 * H  # night-time volume: about 300 an hour
    assert r.opening.family_alpha == pytest.approx(CONFIG.drift_budget * 6 / (30 * 24))


def test_drift_needs_a_day_of_history() -> None:
    detector = run(_cycled("v7", T0, 20, seed=3, drop=0.10, drop_from=T0 + 10 * H))
    assert not detector.opened
    assert not detector.latest


# -- multiple testing ----------------------------------------------------------------------


def test_the_drift_budget_is_split_over_the_slices_of_a_period() -> None:
    segments = [f"seg{s}" for s in range(4)]
    windows = [
        w
        for i, seg in enumerate(segments)
        for w in traffic("v7", T0, 40, 0.85, 20, seed=10 + i, segment=seg)
    ]
    detector = run(windows)
    drift = [c for c in detector.latest.values() if c.kind == "drift"]
    assert {c.segment for c in drift} == set(segments)
    for c in drift:  # Bonferroni over the slices, closed over each slice's two metrics
        assert c.level == pytest.approx(CONFIG.drift_alpha / len(segments))
        assert c.p_value >= min(1.0, len(segments) * math.exp(-c.closed_log_e)) - 1e-12


def test_the_p_value_is_the_smallest_so_far_and_family_adjusted() -> None:
    deploy = T0 + 30 * H  # a day of history: the same hours a day earlier
    windows = traffic("v7", T0, 30, 0.85, 40, seed=1) + traffic("v8", deploy, 3, 0.81, 40, seed=2)
    detector = Detector(CONFIG)
    detector.add(windows)
    key = ("v8", "kb", "recall@5", "v7")
    smallest = 1.0
    for boundary in range(deploy + W, deploy + 3 * H + 1, W):
        detector.advance(boundary)
        c = detector.latest.get(key)
        if c is None:
            continue
        v = c.ci_high - c.delta  # the radius; recompute the look from its parts
        assert v > 0
        smallest = min(smallest, math.exp(-c.closed_log_e))
        assert c.p_value == pytest.approx(min(1.0, smallest))  # one slice in its family
    assert smallest < 1.0


def test_the_e_value_is_the_mixture_ratio_of_the_sides() -> None:
    deploy = T0 + 30 * H  # a day of history: the same hours a day earlier
    windows = traffic("v7", T0, 30, 0.85, 40, seed=1) + traffic("v8", deploy, 2, 0.80, 40, seed=2)
    detector = run(windows)
    c = detector.latest["v8", "kb", "recall@5", "v7"]
    pb, pc = c.baseline_mean, c.candidate_mean
    nb, nc = c.n_baseline, c.n_candidate
    v = pb * (1 - pb) * nb / (nb - 1) / nb + pc * (1 - pc) * nc / (nc - 1) / nc
    assert c.log_e == pytest.approx(log_drop_ratio(pc - pb, v, CONFIG.tau), rel=1e-9)
    # closed with the labelled share's e-value: the smaller of its own and their mean
    share = detector.latest["v8", "kb", LABELLED_SHARE, "v7"]
    mean = (math.exp(c.log_e) + math.exp(share.log_e)) / 2
    assert c.closed_log_e == pytest.approx(math.log(min(math.exp(c.log_e), mean)), rel=1e-9)


# -- partitions, repeats and gaps ----------------------------------------------------------


def test_partitions_add_up_and_a_repeated_window_counts_once() -> None:
    deploy = T0 + 30 * H  # a day of history: the same hours a day earlier
    both = []
    for partition, seed in ((0, 1), (1, 2)):
        for w in traffic("v7", T0, 30, 0.85, 20, seed) + traffic("v8", deploy, 1, 0.8, 20, seed):
            both.append(replace(w, partition=partition))
    # v7's last hour of partition 0 and v8's first half hour delivered twice (at least once)
    detector = run(both + both[60:72] + both[72:78])
    c = detector.latest["v8", "kb", "recall@5", "v7"]
    assert c.n_candidate == 2 * 12 * 20  # both partitions, one hour, no repeats
    assert c.n_baseline == 2 * 12 * 20  # the hour before the switch: as long as v8's


def test_one_long_catch_up_equals_stepping_through() -> None:
    deploy = T0 + 6 * H
    windows = traffic("v7", T0, 6, 0.85, 40, seed=1) + traffic("v8", deploy, 2, 0.6, 40, seed=2)
    windows += traffic("v8", deploy + 2 * H, 42, 0.85, 40, seed=3)  # fixed again, 2 days on
    caught_up = run(windows)  # one advance over 50 hours
    stepped = Detector(CONFIG)
    for w in windows:
        stepped.add([w])
        stepped.advance(w.end_ms)
    records = [r.to_record() for r in stepped.opened]
    assert records
    assert [r.to_record() for r in caught_up.opened] == records


def test_a_gap_in_traffic_is_skipped_not_stepped_through() -> None:
    windows = traffic("v7", T0, 6, 0.85, 40, seed=1)
    windows += traffic("v7", T0 + 400 * 24 * H, 2, 0.85, 40, seed=2)  # back after 400 days
    detector = run(windows)
    assert detector.through_ms == windows[-1].end_ms
    assert not detector.opened


# -- the compare endpoint's statistics -----------------------------------------------------


def test_compare_verdicts() -> None:
    rng = np.random.default_rng(3)
    good = aggregate({"recall@5": (rng.random(2000) < 0.85).astype(float)})
    bad = aggregate({"recall@5": (rng.random(2000) < 0.75).astype(float)})
    same = aggregate({"recall@5": (rng.random(2000) < 0.85).astype(float)})
    few = aggregate({"recall@5": (rng.random(50) < 0.1).astype(float)})
    kw = {"min_labelled": 200, "min_effect": 0.02}
    assert compare_metrics(good, bad, **kw)[0]["verdict"] == "regression"
    assert compare_metrics(bad, good, **kw)[0]["verdict"] == "improvement"
    assert compare_metrics(good, same, **kw)[0]["verdict"] == "no_significant_difference"
    row = compare_metrics(good, few, **kw)[0]
    assert row["verdict"] == "insufficient_data"
    assert row["p_value"] is None


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="multiple of the window"):
        DetectorConfig(candidate_ms=H + 1)
    with pytest.raises(ValueError, match="alpha"):
        DetectorConfig(alpha=0.0)
    with pytest.raises(ValueError, match="drift_budget"):
        DetectorConfig(drift_budget=0.0)
    with pytest.raises(ValueError, match="at most a day"):
        DetectorConfig(drift_period_ms=2 * D)
