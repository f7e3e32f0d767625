"""Label shifts (service/detect/label_shift.py): a drop of one label source while the
slice's other sources hold is a change of the labels, not of retrieval."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from service.core.monitor import Monitor, MonitorConfig
from service.detect.detector import Detector
from service.detect.label_shift import LabelShifts
from service.detect.ledger import Ledger, Record, Recorder
from service.detect.model import LABELLED_SHARE, DetectorConfig
from service.metrics.aggregates import aggregate
from service.stream.windows import ClosedWindow

W = 300_000
H = 3_600_000
D = 24 * H
T0 = 1_796_083_200_000  # 2026-12-01T00:00:00Z
CONFIG = DetectorConfig(metrics=("recall@5",), window_ms=W, attribution_ms=30 * 60_000)
PER_WINDOW = 100
CITATION = "source_labelled_share:citation"


def labelled_traffic(
    hours: int,
    seed: int,
    *,
    at: float | None = None,
    find: tuple[float, float] = (0.8, 0.8),
    click: tuple[float, float] = (0.5, 0.5),
    cite: tuple[float, float] = (0.6, 0.6),
    judge: float = 0.0,
    good: tuple[float, float] = (0.9, 0.9),
    segment: str = "kb",
) -> list[ClosedWindow]:
    """Windows of one version: each query finds the answer with probability ``find``;
    a query that did is clicked with ``click`` and cited with ``cite`` (independently),
    and its recall@5 is 1 with probability ``good`` (0.9) when clicked, else 0.6 (the sources see
    different queries: a change of their mix moves recall). Each pair: before and from
    ``at`` on (the hour ``at`` after T0; None: no change). ``judge``: the share of
    the queries that found it that are judged relevant too (a minor source)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(hours * 12):
        start = T0 + i * W
        after = at is not None and start >= T0 + at * H
        f, pc, pt, p = (pair[after] for pair in (find, click, cite, good))
        found = rng.random(PER_WINDOW) < f
        clicked = found & (rng.random(PER_WINDOW) < pc)
        cited = found & (rng.random(PER_WINDOW) < pt)
        judged = found & (rng.random(PER_WINDOW) < judge)
        labelled = clicked | cited | judged
        recall = rng.random(PER_WINDOW) < np.where(clicked, p, 0.6)
        values = recall[labelled].astype(np.float64)
        out.append(
            ClosedWindow(
                "v7",
                segment,
                0,
                start,
                start + W,
                PER_WINDOW,
                int(labelled.sum()),
                aggregate({"recall@5": values}),
                sources={
                    "click": int(clicked.sum()),
                    "citation": int(cited.sum()),
                    "judgment": int(judged.sum()),
                },
            )
        )
    return out


def run(windows: list[ClosedWindow], config: DetectorConfig = CONFIG) -> Detector:
    detector = Detector(config, keep_opened=None)
    detector.add(windows)
    detector.advance(max(w.end_ms for w in windows))
    return detector


def test_citations_halving_opens_a_label_shift_and_no_retrieval_regression() -> None:
    detector = run(labelled_traffic(56, seed=1, at=50, cite=(0.6, 0.3)))
    assert [(r.opening.kind, r.opening.metric) for r in detector.opened] == [
        ("label_shift", CITATION)
    ]
    shift = detector.opened[0]
    assert shift.key == ("v7", "kb", CITATION, "previous_day")
    assert T0 + 50 * H < shift.evidence_end_ms <= T0 + 52 * H
    # the period (48 h to 54 h) since it began: two hours before the change, then 0.24 less
    assert 0.8 * (0.3 - 0.6) < shift.opening.delta < -CONFIG.min_effect
    assert shift.opening.family_alpha == pytest.approx(CONFIG.label_shift_alpha)
    assert shift.opening.level == pytest.approx(CONFIG.label_shift_alpha / 2)  # click, citation
    # the labelled share fell by 0.8 * 0.5 * 0.3 = 0.12: a drift regression on its own,
    # but its e-value is the smaller of the sources' (the clicks' held)
    share = detector.latest["v7", "kb", LABELLED_SHARE, "previous_day"]
    clicks = detector.latest["v7", "kb", "source_labelled_share:click", "previous_day"]
    assert share.delta < -0.08
    assert share.log_e <= clicks.log_e < -math.log(share.level)
    assert not share.regressed


def test_a_drop_of_clicks_that_moves_recall_opens_only_the_label_shift() -> None:
    """Fewer clicks: more of the labelled queries are cited only, whose recall is lower,
    so recall over the labelled ones falls by about 0.09 with retrieval unchanged. Its
    drift test regresses, and is held back by the open label shift."""
    detector = run(labelled_traffic(60, seed=2, at=50, click=(0.6, 0.3), cite=(0.5, 0.5)))
    assert [(r.opening.kind, r.opening.metric) for r in detector.opened] == [
        ("label_shift", "source_labelled_share:click")
    ]
    recall = detector.latest["v7", "kb", "recall@5", "previous_day"]
    assert recall.kind == "drift"
    assert recall.regressed  # held back, not opened
    assert recall.delta < -0.05


def test_a_retrieval_drop_lowers_every_source_and_opens_no_label_shift() -> None:
    detector = run(labelled_traffic(56, seed=3, at=50, find=(0.8, 0.55)))
    kinds = {(r.opening.kind, r.opening.metric) for r in detector.opened}
    assert ("drift", LABELLED_SHARE) in kinds
    assert not [k for k in kinds if k[0] == "label_shift"]


def test_a_minor_source_does_not_slow_the_labelled_shares_test() -> None:
    """A few judgments (2.4% of the queries) beside clicks and citations: under a real
    drop their share falls by 0.7 points, too little to gather evidence in hours. The
    intersection-union test takes the major sources only, so the labelled share still
    opens, and as early as without judgments."""
    with_judgments = run(labelled_traffic(56, seed=3, at=50, find=(0.8, 0.55), judge=0.03))
    without = run(labelled_traffic(56, seed=3, at=50, find=(0.8, 0.55)))
    opened = {
        d: [r for r in det.opened if r.opening.metric == LABELLED_SHARE]
        for d, det in (("with", with_judgments), ("without", without))
    }
    assert opened["with"]
    assert opened["without"]
    judged = with_judgments.latest["v7", "kb", "source_labelled_share:judgment", "previous_day"]
    share = with_judgments.latest["v7", "kb", LABELLED_SHARE, "previous_day"]
    assert judged.log_e < share.log_e  # (it would have capped the labelled share)
    assert opened["with"][0].evidence_end_ms <= opened["without"][0].evidence_end_ms + H


def test_no_label_shift_opens_while_a_regression_of_retrieval_is_open() -> None:
    """Recall falls at hour 50 (a drift regression opens); clicks halve at hour 52. A
    drop of the answers found lowers clicks more than citations (which also reach chunks
    retrieval missed), so with retrieval known to have changed the sources' moving apart
    is no label shift."""
    before = labelled_traffic(60, seed=9, at=50, good=(0.9, 0.6))
    after = labelled_traffic(60, seed=9, at=50, good=(0.9, 0.6), click=(0.5, 0.25))
    windows = [b if b.start_ms < T0 + 52 * H else a for b, a in zip(before, after, strict=True)]
    detector = run(windows)
    kinds = [r.opening.kind for r in detector.opened]
    assert kinds
    assert "label_shift" not in kinds
    clicks = detector.latest["v7", "kb", "source_labelled_share:click", "previous_day"]
    assert clicks.regressed  # it would have opened


def test_a_source_alone_in_its_slice_is_no_label_shift() -> None:
    """Without another source to hold, a drop of the only one cannot be told from a
    retrieval drop: it is tested as the labelled share (which then opens)."""
    detector = run(labelled_traffic(56, seed=4, at=50, click=(0.0, 0.0), cite=(0.6, 0.3)))
    assert [(r.opening.kind, r.opening.metric) for r in detector.opened] == [
        ("drift", LABELLED_SHARE)
    ]


def test_nothing_changes_nothing_opens() -> None:
    detector = run(labelled_traffic(72, seed=5))
    assert any(c.kind == "label_shift" for c in detector.latest.values())  # tested
    assert not detector.opened


def test_a_lasting_shift_closes_once_the_day_before_has_the_new_level() -> None:
    detector = run(labelled_traffic(84, seed=6, at=40, cite=(0.6, 0.3)))
    shifts = [r for r in detector.opened if r.opening.kind == "label_shift"]
    assert len(shifts) == 1
    shift = shifts[0]
    assert shift.closed_reason == "recovered"
    assert shift.closed_ms is not None
    # the last hour against a day earlier: caught up once that day-before hour is after
    # the change, for close_after_ms; the evidence is complete attribution_ms later
    closed_boundary = shift.closed_ms - CONFIG.attribution_ms
    assert T0 + (40 + 24) * H <= closed_boundary <= T0 + (40 + 24) * H + 3 * H
    # later drift periods compare the new level with itself: nothing more opens
    assert list(detector.opened) == [shift]


@pytest.mark.parametrize("at", [38, 40, 43])
def test_a_closed_label_shift_does_not_open_again_in_its_period(at: int) -> None:
    """It closes about 25 h after the change, in a drift period whose baseline (a day
    before the period) may still hold hours before the change: that period's run would
    find the drop again. It opens nothing more, in that period or later."""
    detector = run(labelled_traffic(90, seed=8, at=at, cite=(0.6, 0.3)))
    assert len(detector.opened) == 1
    assert detector.opened[0].closed_reason == "recovered"


def test_a_source_that_comes_back_closes_the_label_shift_sooner() -> None:
    windows = labelled_traffic(56, seed=7, at=44, cite=(0.6, 0.3))
    back = labelled_traffic(56, seed=7)
    windows = [w if w.start_ms < T0 + 48 * H else back[i] for i, w in enumerate(windows)]
    detector = run(windows)
    (shift,) = [r for r in detector.opened if r.opening.kind == "label_shift"]
    assert shift.closed_reason == "recovered"
    assert shift.closed_ms is not None
    assert shift.closed_ms - CONFIG.attribution_ms <= T0 + 48 * H + 3 * H


def test_a_restored_replica_closes_the_label_shift_where_the_others_do() -> None:
    """A replica that takes an open label shift from the ledger finds its closing run
    from the windows alone (LabelShifts.resume): it closes at the same boundary."""
    windows = labelled_traffic(84, seed=6, at=40, cite=(0.6, 0.3))
    whole = run(windows)
    (shift,) = [r for r in whole.opened if r.opening.kind == "label_shift"]
    assert shift.closed_ms is not None
    closed_boundary = shift.closed_ms - CONFIG.attribution_ms
    # a detector stepped to a boundary inside the closing run, its label shift resumed
    middle = closed_boundary - CONFIG.close_after_ms // 2
    early = Detector(CONFIG, keep_opened=None)
    early.add(windows)
    early.advance(middle)
    (open_shift,) = [r for r in early.open.values() if r.opening.kind == "label_shift"]
    expected = open_shift.recovered_since_ms
    assert expected is not None
    open_shift.recovered_since_ms = None
    shifts = LabelShifts(CONFIG)
    for w in windows:
        shifts.add(w)
    shifts.resume(open_shift, middle)
    assert open_shift.recovered_since_ms == expected


def test_the_ledger_brings_back_what_label_shifts_hold() -> None:
    windows = labelled_traffic(60, seed=2, at=50, click=(0.6, 0.3), cite=(0.5, 0.5))
    whole = run(windows)
    shifts = LabelShifts(CONFIG)
    (shift,) = whole.opened
    shifts.install([*whole.open.values(), *whole.closed])
    period = CONFIG.drift_period_start(T0 + 60 * H)
    assert shifts.held(("v7", "kb"), period)
    assert not shifts.held(("v7", "other"), period)
    assert not shifts.held(("v7", "kb"), CONFIG.drift_period_start(shift.evidence_end_ms) - D)


def test_the_label_shift_budget_is_its_own_and_checked() -> None:
    assert CONFIG.label_shift_alpha == pytest.approx(0.2 * 6 / (30 * 24))
    with pytest.raises(ValueError, match="label_shift_budget"):
        DetectorConfig(label_shift_budget=0.0)
    with pytest.raises(ValueError, match="label_shift_budget"):
        DetectorConfig(label_shift_budget=120.0)
    assert replace(CONFIG, label_shift_budget=1.0).label_shift_alpha == pytest.approx(6 / (30 * 24))


@pytest.mark.parametrize("restart", [45, 62, 64])
def test_a_restarted_replica_holds_the_label_shifts_a_replica_that_never_restarted_holds(
    restart: int,
) -> None:
    """Restarted (reading back the recent windows and the ledger, written twice, as a
    compacted topic gives it) while the label shift is open (45 h), a day after the
    change (62 h, its window of evidence no longer read back) and inside its closing run
    (64 h; it closes at 64 h 25 min): it opens, holds and closes what a replica that
    never restarted does, at the same boundaries, and writes the same records after."""
    windows = labelled_traffic(90, seed=8, at=38.5, cite=(0.6, 0.3))
    history_ms = Monitor(MonitorConfig(detector=CONFIG), lambda: 0).history_ms

    def step(detector: Detector, hour: int) -> list[Record]:
        hi = T0 + hour * H
        detector.add([w for w in windows if hi - H <= w.start_ms < hi])
        detector.advance(hi)
        assert detector.recorder is not None
        return detector.recorder.take()

    never = Detector(CONFIG, recorder=Recorder())
    records: list[Record] = []
    written = {}
    for hour in range(1, 91):
        records += step(never, hour)
        written[hour] = len(records)
    (shift,) = never.opened
    assert shift.opening.kind == "label_shift"
    assert shift.closed_ms is not None
    assert shift.recovered_since_ms is not None
    assert shift.recovered_since_ms < T0 + 64 * H < shift.closed_ms - CONFIG.attribution_ms

    ledger = Ledger()
    for key, value in dict(records[: written[restart]] * 2).items():
        ledger.apply(key, value)
    again = Detector(CONFIG, recorder=Recorder())
    at = T0 + restart * H
    again.add([w for w in windows if at - history_ms <= w.start_ms < at])
    again.restore(ledger)
    again.advance(at)
    assert again.recorder is not None
    again.recorder.take()
    after: list[Record] = []
    for hour in range(restart + 1, 91):
        after += step(again, hour)
    assert [r.to_record() for r in again.opened] == [r.to_record() for r in never.opened]
    assert [r.to_record() for r in again.closed] == [r.to_record() for r in never.closed]
    assert after == list(records[written[restart] :])
