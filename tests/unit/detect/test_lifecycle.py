"""A regression's life: open while its version serves; closed only as rolled_back,
superseded or recovered (never because its comparison stopped running)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.detect.detector import Detector
from service.detect.model import CloseReason, DetectorConfig
from service.detect.recovery import expected_values
from service.stream.windows import ClosedWindow
from tests.unit.detect.test_detector import CONFIG, DEFAULT_NO_HISTORY_WATCH, T0, D, H, W, traffic

KEY = ("v8", "kb", "recall@5", "v7")
ATTRIBUTION = CONFIG.attribution_ms


def detect(windows: list[ClosedWindow], through: int, config: DetectorConfig = CONFIG) -> Detector:
    detector = Detector(config)
    detector.add(windows)
    detector.advance(through)
    return detector


def test_a_bad_version_without_history_stays_open_while_it_serves() -> None:
    """6 hours of the previous version, then a bad version for 48 hours: its deploy
    comparison runs for the short watch only (2 h), and the regression stays open."""
    config = CONFIG.__class__(
        metrics=("recall@5",), window_ms=W, attribution_ms=ATTRIBUTION
    )  # the default no-history watch
    assert config.no_history_watch_ms == DEFAULT_NO_HISTORY_WATCH
    deploy = T0 + 6 * H
    windows = traffic("v7", T0, 6, 0.85, 40, seed=1) + traffic("v8", deploy, 48, 0.70, 40, seed=2)
    detector = detect(windows, deploy + 48 * H, config)
    assert KEY in detector.open
    assert detector.open[KEY].opening.kind == "deploy"
    assert detector.open[KEY].evidence_end_ms <= deploy + DEFAULT_NO_HISTORY_WATCH
    assert KEY not in detector.latest  # its comparison no longer runs
    assert not detector.closed


def test_a_bad_version_past_the_deploy_watch_stays_open() -> None:
    """A day of history, then a bad version for 40 hours: past the 24-hour watch."""
    deploy = T0 + 26 * H
    windows = traffic("v7", T0, 26, 0.85, 40, seed=1) + traffic("v8", deploy, 40, 0.70, 40, seed=2)
    detector = detect(windows, deploy + 40 * H)
    assert detector.open[KEY].opening.kind == "deploy"
    assert KEY not in detector.latest  # the watch (24 h) is over
    assert detector.open[KEY].recovery_log_e == 0.0  # no evidence of a recovery at all
    assert not detector.closed


def _rollout(then: str, seed: int) -> tuple[list[ClosedWindow], int]:
    deploy, back = T0 + 26 * H, T0 + 30 * H
    windows = traffic("v7", T0, 26, 0.85, 40, seed=1) + traffic("v8", deploy, 4, 0.70, 40, seed=2)
    windows += traffic(then, back, 6, 0.85, 40, seed=seed)
    return windows, back


def test_a_rollback_closes_it_as_rolled_back() -> None:
    windows, back = _rollout("v7", seed=3)
    detector = detect(windows, back + 6 * H)
    assert not detector.open
    [closed] = [r for r in detector.closed if r.key == KEY]
    assert closed.closed_reason == CloseReason.ROLLED_BACK
    # decided at the first boundary with no v8 query in the last candidate_ms (1 h)
    assert closed.closed_ms == back + CONFIG.candidate_ms + ATTRIBUTION
    assert closed.to_record()["closed_reason"] == "rolled_back"
    assert closed.to_record()["closed_at"] == "2026-12-02T07:30:00Z"


def test_a_newer_version_closes_it_as_superseded() -> None:
    windows, back = _rollout("v9", seed=3)
    detector = detect(windows, back + 6 * H)
    [closed] = [r for r in detector.closed if r.key == KEY]
    assert closed.closed_reason == CloseReason.SUPERSEDED
    assert closed.closed_ms == back + CONFIG.candidate_ms + ATTRIBUTION


def test_a_version_that_stops_while_nothing_else_serves_stays_open() -> None:
    """No traffic at all is no evidence of a rollback."""
    deploy = T0 + 26 * H
    windows = traffic("v7", T0, 26, 0.85, 40, seed=1) + traffic("v8", deploy, 4, 0.70, 40, seed=2)
    windows += traffic("other-segment", deploy + 4 * H, 6, 0.85, 40, seed=3, segment="billing")
    detector = detect(windows, deploy + 10 * H)
    assert KEY in detector.open


def test_a_version_fixed_in_place_closes_as_recovered_within_the_bound() -> None:
    """The same label, fixed 3 hours after the deploy: it closes as recovered within the
    stated bound (values to reach the threshold, plus close_after), and not before the
    fix."""
    deploy, fix = T0 + 26 * H, T0 + 29 * H
    windows = traffic("v7", T0, 26, 0.85, 40, seed=1) + traffic("v8", deploy, 3, 0.70, 40, seed=2)
    windows += traffic("v8", fix, 24, 0.85, 40, seed=3)
    detector = detect(windows, fix + 24 * H)
    [closed] = [r for r in detector.closed if r.key == KEY]
    assert closed.closed_reason == CloseReason.RECOVERED
    recovery = closed.recovery
    assert recovery is not None
    bound_values = expected_values(recovery, 0.85 * 0.15, W)
    bound_ms = math.ceil(bound_values / 40) * W + CONFIG.close_after_ms
    after_fix = closed.closed_ms - ATTRIBUTION - fix
    assert CONFIG.close_after_ms < after_fix <= 1.5 * bound_ms
    assert after_fix <= 6 * H  # about 5 h here: the bound docs/detection.md states
    assert KEY not in detector.open  # its deploy run, which saw the bad hours, is spent


@pytest.mark.parametrize("seed", range(5))
def test_a_version_that_stays_bad_by_half_its_drop_never_recovers(seed: int) -> None:
    """Partly fixed: the drop shrinks from 15 to 7 points (about half) for 3 days; the
    recovery test's null ("still bad by half the opening drop") holds, so it stays open."""
    deploy, fix = T0 + 26 * H, T0 + 29 * H
    windows = traffic("v7", T0, 26, 0.85, 40, seed=seed) + traffic(
        "v8", deploy, 3, 0.70, 40, seed=seed + 10
    )
    detector = Detector(CONFIG)
    detector.add(windows)
    detector.advance(fix)
    drop = detector.open[KEY].recovery.drop  # type: ignore[union-attr]
    windows = traffic("v8", fix, 72, 0.85 - drop, 40, seed=seed + 20)
    detector.add(windows)
    detector.advance(fix + 72 * H)
    assert KEY in detector.open
    assert detector.open[KEY].recovery_log_e < 0.5 * detector._life.threshold


def test_stepping_equals_one_advance_with_closings() -> None:
    windows, back = _rollout("v7", seed=3)
    stepped = Detector(CONFIG)
    stepped.add(windows)
    for boundary in range(T0 + W, back + 6 * H + W, W):
        stepped.advance(boundary)
    at_once = detect(windows, back + 6 * H)
    assert [r.to_record() for r in stepped.closed] == [r.to_record() for r in at_once.closed]
    assert stepped.closed


def test_each_window_e_value_has_expectation_at_most_one_at_the_floor() -> None:
    """Fan's bound: at the null's boundary (mean = floor) the mean of exp(log_e) over many
    windows is at most 1, for binary and for spread values."""
    from service.detect.recovery import Recovery
    from service.metrics.aggregates import aggregate

    rng = np.random.default_rng(7)
    floor = 0.6
    recovery = Recovery(0, tuple([floor] * 24), drop=0.1, margin=0.0, bet=0.4)
    for values in (
        (rng.random((20_000, 30)) < floor).astype(np.float64),
        rng.beta(3 * floor, 3 * (1 - floor), (20_000, 30)),
    ):
        es = []
        for row in values:
            m = aggregate({"recall@5": row})["recall@5"]
            es.append(math.exp(recovery.log_e(T0, m.count, m.sum_fx, m.sum_sq_fx) or 0.0))
        assert np.mean(es) <= 1.0 + 3 * np.std(es) / math.sqrt(len(es))
        assert np.mean(es) > 0.5  # not trivially small: the bound is nearly tight


def test_the_recovery_threshold_is_a_hundred_years_of_boundaries() -> None:
    from service.detect.recovery import recovery_threshold

    assert recovery_threshold(W) == pytest.approx(math.log(100 * 365 * 288))
    assert D == 288 * W
