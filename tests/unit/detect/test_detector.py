"""The regression detector on hand-built closed windows (no pipeline, no clock)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from service.detect.compare import compare_metrics
from service.detect.detector import Detector
from service.detect.model import DetectorConfig
from service.metrics.aggregates import aggregate
from service.metrics.stats import holm_adjust, t_sf, welch_test
from service.stream.windows import ClosedWindow

W = 300_000
H = 3_600_000
T0 = 1_796_083_200_000  # 2026-12-01T00:00:00Z, a multiple of the window
CONFIG = DetectorConfig(metrics=("recall@5",), window_ms=W, attribution_ms=30 * 60_000)


def window(
    retriever: str, start: int, rng: np.random.Generator, p: float, n: int, segment: str = "kb"
) -> ClosedWindow:
    """A closed window of n labelled queries whose recall@5 is 1 with probability p."""
    values = (rng.random(n) < p).astype(np.float64)
    return ClosedWindow(
        retriever, segment, 0, start, start + W, n, n, aggregate({"recall@5": values})
    )


def traffic(
    retriever: str, start: int, hours: float, p: float, per_window: int, seed: int, **kw: str
) -> list[ClosedWindow]:
    rng = np.random.default_rng(seed)
    n = round(hours * H / W)
    return [window(retriever, start + i * W, rng, p, per_window, **kw) for i in range(n)]


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
    record = r.to_record()
    assert set(record) >= {"retriever", "segment", "metric", "baseline", "delta", "p_value"}
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
    windows = traffic("v7", T0, 6, 0.900, 4000, seed=1) + traffic("v8", deploy, 3, 0.895, 4000, 2)
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
    assert all(c.kind == "drift" for c in detector.latest.values())
    assert not [r for r in detector.opened if r.opening.kind == "deploy"]


def test_hysteresis_keeps_it_open_then_closes_it() -> None:
    config = DetectorConfig(metrics=("recall@5",), deploy_watch_ms=H, close_after_ms=H)
    deploy = T0 + 6 * H
    windows = traffic("v7", T0, 6, 0.85, 40, seed=1)
    windows += traffic("v8", deploy, 1, 0.6, 40, seed=2)  # bad first hour
    windows += traffic("v8", deploy + H, 8, 0.85, 40, seed=3)  # then fine
    detector = Detector(config)
    detector.add(windows)
    detector.advance(deploy + H)
    key = ("v8", "kb", "recall@5", "v7")
    assert key in detector.open
    detector.advance(deploy + H + W)  # the deploy watch is over: not tested any more ...
    assert key in detector.open  # ... but it stays open for close_after
    detector.advance(deploy + 2 * H + W)
    assert key not in detector.open
    closed = detector.opened[0]
    assert closed.closed_ms is not None
    assert closed.closed_ms > closed.opened_ms
    assert len(detector.opened) == 1


# -- drift ---------------------------------------------------------------------------------


def test_drift_of_the_same_version_opens_against_its_own_past() -> None:
    windows = traffic("v7", T0, 10, 0.85, 40, seed=1) + traffic("v7", T0 + 10 * H, 2, 0.65, 40, 2)
    detector = run(windows)
    assert [(r.opening.kind, r.opening.baseline) for r in detector.opened] == [
        ("drift", "previous_24h")
    ]
    assert detector.opened[0].evidence_end_ms > T0 + 10 * H


# -- multiple testing ----------------------------------------------------------------------


def test_holm_corrects_within_each_family() -> None:
    base = traffic("v7", T0, 4, 0.85, 40, seed=1)
    bump = traffic("v7", T0 + 4 * H, 1, 0.80, 40, seed=2)
    others = [
        w for s in range(9) for w in traffic("v7", T0, 5, 0.85, 40, seed=10 + s, segment=f"seg{s}")
    ]
    one = run(base + bump)
    many = run(base + bump + others)
    key = ("v7", "kb", "recall@5", "previous_24h")
    raw = one.latest[key].p_raw
    assert one.latest[key].p_value == pytest.approx(raw)  # a family of one
    assert many.latest[key].p_raw == pytest.approx(raw)
    drift = [c for c in many.latest.values() if c.kind == "drift"]
    assert len(drift) == 10
    expected = holm_adjust([c.p_raw for c in drift])
    assert [c.p_value for c in drift] == pytest.approx(expected)
    assert many.latest[key].p_value > raw


def test_deploy_and_drift_are_separate_families() -> None:
    deploy = T0 + 6 * H
    windows = traffic("v7", T0, 8, 0.85, 40, seed=1) + traffic("v8", deploy, 2, 0.85, 40, seed=2)
    detector = run(windows)
    for kind in ("deploy", "drift"):
        family = [c for c in detector.latest.values() if c.kind == kind]
        assert family
        assert [c.p_value for c in family] == pytest.approx(holm_adjust([c.p_raw for c in family]))


# -- partitions, repeats and gaps ----------------------------------------------------------


def test_partitions_add_up_and_a_repeated_window_counts_once() -> None:
    deploy = T0 + 6 * H
    both = []
    for partition, seed in ((0, 1), (1, 2)):
        for w in traffic("v7", T0, 6, 0.85, 20, seed) + traffic("v8", deploy, 1, 0.8, 20, seed):
            both.append(replace(w, partition=partition))
    detector = run(both + both[:50])  # 50 windows delivered twice (at least once)
    c = detector.latest["v8", "kb", "recall@5", "v7"]
    assert c.n_candidate == 2 * 12 * 20  # both partitions, one hour, no repeats
    assert c.n_baseline == 2 * 72 * 20


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
