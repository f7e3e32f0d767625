"""The ledger of the detector's decisions: a restarted replica that reads back only the
recent windows takes the older decisions from it and ends up holding exactly what a
replica that never restarted holds."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from functools import cache
from typing import Any

import pytest

from service.core.monitor import Monitor, MonitorConfig
from service.detect.codec import decode_regression, decode_test, encode_regression, encode_test
from service.detect.detector import Detector
from service.detect.ledger import (
    CLOSED_KEPT_MS,
    THROUGH_KEY,
    Ledger,
    Record,
    Recorder,
    regression_id,
)
from service.detect.lifecycle import Lifecycle
from service.detect.model import CloseReason, Regression
from service.stream.windows import ClosedWindow
from tests.unit.detect.test_detector import CONFIG as DETECTOR_CONFIG
from tests.unit.detect.test_detector import T0, H, traffic

HOURS = 96
CONFIG = replace(DETECTOR_CONFIG, baseline_days=1)
"""One previous day of baseline: the history read back at a restart (a day and the
watch) is then shorter than these four days, which is the case this file is about."""
KB = ("v8", "kb", "recall@5", "v7")
NEWS = ("v10", "news", "recall@5", "v7")
DOCS = ("v11", "docs", "recall@5", "v7")
BILLING = ("v9", "billing", "recall@5", "v7")
FAQ = ("v7", "faq", "recall@5", "previous_day")


def _windows() -> list[ClosedWindow]:
    """Four days of five segments (40 values a window, recall 0.85 when good):

    * kb: v8, 15 points worse, deployed at hour 26 and never rolled back;
    * news: v10 deployed bad at hour 30, fixed in place 3 hours later (recovers);
    * docs: v11 deployed bad at hour 50, fixed in place at hour 80 (recovers at 84);
    * billing: v9 deployed bad at hour 60, rolled back to v7 at hour 64;
    * faq: v7 drifts 13 points down at hour 84.
    """
    w = traffic("v7", T0, 26, 0.85, 40, seed=1) + traffic("v8", T0 + 26 * H, 70, 0.70, 40, seed=2)
    w += traffic("v7", T0, 60, 0.85, 40, seed=3, segment="billing")
    w += traffic("v9", T0 + 60 * H, 4, 0.70, 40, seed=4, segment="billing")
    w += traffic("v7", T0 + 64 * H, 32, 0.85, 40, seed=5, segment="billing")
    w += traffic("v7", T0, 30, 0.85, 40, seed=6, segment="news")
    w += traffic("v10", T0 + 30 * H, 3, 0.70, 40, seed=7, segment="news")
    w += traffic("v10", T0 + 33 * H, 63, 0.85, 40, seed=8, segment="news")
    w += traffic("v7", T0, 50, 0.85, 40, seed=9, segment="docs")
    w += traffic("v11", T0 + 50 * H, 30, 0.70, 40, seed=10, segment="docs")
    w += traffic("v11", T0 + 80 * H, 16, 0.85, 40, seed=11, segment="docs")
    w += traffic("v7", T0, 84, 0.85, 40, seed=12, segment="faq")
    w += traffic("v7", T0 + 84 * H, 12, 0.72, 40, seed=13, segment="faq")
    return w


WINDOWS = _windows()
HISTORY_MS = Monitor(MonitorConfig(detector=CONFIG), lambda: 0).history_ms


def _step(detector: Detector, hour: int) -> list[Record]:
    """One hour more of windows, as the follower gives them; the records written."""
    hi = T0 + hour * H
    detector.add([w for w in WINDOWS if hi - H <= w.start_ms < hi])
    detector.advance(hi)
    return detector.recorder.take() if detector.recorder else []


def _shown(detector: Detector) -> tuple[Any, ...]:
    """What the API and the regression series show: open and closed regressions (with
    their latest looks and recovery statistics) and the exposition snapshot."""
    regressions = [*detector.open.values(), *detector.closed]
    return (
        [(r.to_record(), r.latest, r.recovery_log_e) for r in regressions],
        detector.snapshot(),
    )


@cache
def _never_restarted() -> tuple[Detector, tuple[Record, ...], dict[int, int]]:
    """Detector N, stepped hour by hour over the four days: its records, and how many it
    had written by each hour."""
    detector = Detector(CONFIG, recorder=Recorder())
    records: list[Record] = []
    written = {}
    for hour in range(1, HOURS + 1):
        records += _step(detector, hour)
        written[hour] = len(records)
        SHOWN[hour] = _shown(detector)
    return detector, tuple(records), written


SHOWN: dict[int, tuple[Any, ...]] = {}
"""What N showed at each hour."""


def _restart_hour() -> int:
    """The hour at which docs' recovery test has shown the drop gone, but not for long
    enough to close (a restart in the middle of a recovery)."""
    n, _, _ = _never_restarted()
    [docs] = [r for r in n.opened if r.key == DOCS]
    assert docs.closed_reason == CloseReason.RECOVERED
    closed_hour = (docs.closed_ms or 0) - CONFIG.attribution_ms - T0
    return closed_hour // H  # (close_after is one hour: the hour before its close)


def _read_back(records: tuple[Record, ...]) -> Ledger:
    """The ledger as a compacted topic gives it, written twice (two replicas)."""
    ledger = Ledger()
    last = dict(records + records)  # compaction: the last record of each key, in its order
    for key, value in last.items():
        ledger.apply(key, value)
    return ledger


def _restarted(
    ledger: Ledger | None, restart: int, shown: dict[int, tuple[Any, ...]] | None = None
) -> tuple[Detector, list[Record], list[Record]]:
    """Detector R started at ``restart`` hours: it reads the windows of the last
    ``history_ms`` (as the follower does) and, given one, the ledger; then follows to the
    end. Returns it, what it wrote while catching up, and what it wrote after."""
    detector = Detector(CONFIG, recorder=Recorder())
    at = T0 + restart * H
    detector.add([w for w in WINDOWS if at - HISTORY_MS <= w.start_ms < at])
    if ledger is not None:
        detector.restore(ledger)
    detector.advance(at)
    assert detector.recorder is not None
    caught_up = detector.recorder.take()
    if shown is not None:
        shown[restart] = _shown(detector)
    after: list[Record] = []
    for hour in range(restart + 1, HOURS + 1):
        after += _step(detector, hour)
    return detector, caught_up, after


def _without_since(r: Regression) -> Regression:
    return replace(r, since_ms=0)


def _decoded(records: list[Record]) -> list[tuple[str, Any]]:
    """Records with the values decoded and a drift regression's ``since_ms`` left out
    (see test_a_restarted_replica_holds_what_a_replica_that_never_restarted_holds)."""
    out = []
    for key, value in records:
        decoded = None if value is None else json.loads(value)
        if decoded is not None and "regression" in decoded:
            decoded["regression"]["since_ms"] = 0
        out.append((key, decoded))
    return out


def test_a_restarted_replica_holds_what_a_replica_that_never_restarted_holds() -> None:
    n, records, written = _never_restarted()
    restart = _restart_hour()
    at = T0 + restart * H
    # the scenario: kb's and news' regressions opened before the windows read back begin
    opened = {r.key: r for r in n.opened}
    assert opened[KB].evidence_end_ms < at - HISTORY_MS
    assert opened[NEWS].evidence_end_ms < at - HISTORY_MS
    assert opened[BILLING].closed_reason == CloseReason.ROLLED_BACK
    assert set(n.open) == {KB, FAQ}
    assert [r.key for r in n.closed] == [NEWS, BILLING, DOCS]

    ledger = _read_back(records[: written[restart]])
    assert ledger.through_ms == at
    shown: dict[int, tuple[Any, ...]] = {}
    r, caught_up, after = _restarted(ledger, restart, shown)
    # its own decisions up to the ledger's last boundary were scratch: nothing written
    # but how far it evaluated; and it shows what N showed then, at once
    assert caught_up == [(THROUGH_KEY, f'{{"boundary_ms":{at}}}'.encode())]
    assert shown[restart] == SHOWN[restart]
    # docs was mid-recovery at the restart: its run of recovered boundaries came back
    # from the windows (without it, it would close an hour later: see below)
    assert set(r.open) == set(n.open)
    for key, regression in n.open.items():
        assert r.open[key].to_record() == regression.to_record()
        assert r.open[key].latest == regression.latest
        assert r.open[key].recovery_log_e == regression.recovery_log_e
    assert [c.to_record() for c in r.closed] == [c.to_record() for c in n.closed]
    assert list(r.closed) == list(n.closed)  # whole state: latest, recovery statistic
    assert [o.to_record() for o in r.opened] == [o.to_record() for o in n.opened]
    assert r.latest == n.latest
    assert r.snapshot() == n.snapshot()
    # equal up to the drift regression that opened after the restart: its since_ms is its
    # slice's first window as each detector saw it (docs/detection.md, "Restarts")
    assert r.open[KB] == n.open[KB]
    assert _without_since(r.open[FAQ]) == _without_since(n.open[FAQ])
    assert opened[FAQ].evidence_end_ms > at
    # and from then on it writes what N wrote
    assert _decoded(after) == _decoded(list(records[written[restart] :]))

    # without the ledger: kb's open regression and news' closed one are lost, and billing
    # (its deploy seen without a day of history) is not the same regression
    r0, _, _ = _restarted(None, restart)
    assert KB not in r0.open
    assert NEWS not in {c.key for c in r0.closed}
    assert [c.to_record() for c in r0.closed] != [c.to_record() for c in n.closed]
    assert r0.snapshot() != n.snapshot()


def test_without_the_recovery_statistic_from_the_windows_a_recovery_closes_late(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The restart falls inside docs' run of recovered boundaries: installing its
    regression with that run forgotten closes it later than N does."""
    n, records, written = _never_restarted()
    restart = _restart_hour()
    monkeypatch.setattr(Lifecycle, "resume", lambda self, regression, boundary: None)
    r, _, _ = _restarted(_read_back(records[: written[restart]]), restart)
    [late] = [c for c in r.closed if c.key == DOCS]
    [on_time] = [c for c in n.closed if c.key == DOCS]
    assert late.closed_ms is not None
    assert on_time.closed_ms is not None
    assert late.closed_ms > on_time.closed_ms


def test_a_restart_after_an_old_ledger_installs_it_at_once() -> None:
    """A ledger whose last boundary is before the first window read back (every replica
    was down): its decisions are installed before the first boundary evaluated, and the
    regression it holds open stays open."""
    n, records, written = _never_restarted()
    ledger = _read_back(records[: written[30]])
    r, caught_up, _ = _restarted(ledger, 90)
    assert caught_up  # it decided from its first boundary on
    assert KB in r.open
    assert r.open[KB].to_record() == n.open[KB].to_record()


def test_a_restart_without_any_window_installs_the_ledger() -> None:
    """No window read back at all (a quiet week, or the windows topic emptied): the
    ledger's regressions show once the boundary reaches its last one, and none before."""
    n, records, _ = _never_restarted()
    r = Detector(CONFIG, recorder=Recorder())
    r.restore(_read_back(records))
    r.advance(T0 + HOURS * H - CONFIG.window_ms)
    assert not r.open
    r.advance(T0 + HOURS * H)
    assert set(r.open) == set(n.open)
    assert [o.to_record() for o in r.open.values()] == [o.to_record() for o in n.open.values()]
    assert list(r.closed) == list(n.closed)
    assert r.through_ms is None  # nothing was evaluated


def test_regressions_and_looks_round_trip_exactly() -> None:
    n, _, _ = _never_restarted()
    for regression in [*n.opened, *n.open.values()]:
        encoded = json.loads(json.dumps(encode_regression(regression), allow_nan=False))
        assert decode_regression(encoded) == regression
    look = replace(n.open[KB].latest, closed_log_e=-math.inf, log_e=1e-300)
    encoded = json.loads(json.dumps(encode_test(look), allow_nan=False))
    assert encoded["closed_log_e"] == "-inf"
    assert decode_test(encoded) == look


def test_the_ledger_keeps_the_last_value_of_each_key_and_a_close_over_an_open() -> None:
    n, records, _ = _never_restarted()
    in_order = Ledger()
    for key, value in records:
        in_order.apply(key, value)
    # a lagging replica writes an old "open" record after the "closed" one: closed wins
    [news] = [r for r in n.closed if r.key == NEWS]
    opening = next(v for k, v in records if k == f"{regression_id(news)}|open")
    in_order.apply(f"{regression_id(news)}|open", opening)
    decisions = in_order.decisions({})
    assert [r.key for r in decisions.closed] == [NEWS, BILLING, DOCS]
    assert {r.key for r in decisions.open} == {KB, FAQ}
    assert in_order.through_ms == T0 + HOURS * H
    # a record that is not a ledger record is counted and refused
    with pytest.raises(ValueError, match="not a ledger record"):
        in_order.apply("x|open", b"{not json")
    assert in_order.bad_records == 1


def test_closed_regressions_are_forgotten_a_week_after_they_closed() -> None:
    n, _, _ = _never_restarted()
    recorder = Recorder()
    [news, billing, docs] = n.closed
    assert billing.closed_ms is not None
    through = billing.closed_ms + CLOSED_KEPT_MS + 1  # news and billing are a week old
    closed, opened = recorder.advanced(through, n.closed, n.opened)
    assert list(closed) == [docs]
    assert [r.key for r in opened] == [KB, DOCS, FAQ]
    out = recorder.take()
    tombstones = {key for key, value in out if value is None}
    assert tombstones == {
        f"{regression_id(r)}|{part}" for r in (news, billing) for part in ("open", "closed", "look")
    }
    assert out[-1] == (
        THROUGH_KEY,
        json.dumps({"boundary_ms": through}).encode().replace(b" ", b""),
    )
    # the detector's own deques are left alone (it takes the returned ones)
    assert len(n.closed) == 3


def test_replay_and_demo_keep_no_outbox() -> None:
    detector = Detector(CONFIG)
    detector.add(WINDOWS[:500])
    detector.advance(T0 + 10 * H)
    assert detector.recorder is None
    with pytest.raises(ValueError, match="records its decisions"):
        detector.restore(Ledger())
