"""A short Jepsen-style run in the suite (the long schedule: ``make fault-schedule``):
four broker faults of mixed kinds and one service kill -9 during a live paced stream."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.broker.commits import COMMITTED_WAIT_MS
from service.broker.hanging import SETTLE_AFTER_S
from tests.integration.fault_schedule import run, schedule

pytestmark = [pytest.mark.integration, pytest.mark.faults, pytest.mark.slow]


def test_the_schedule_is_drawn_from_the_seed_and_mixes_every_kind() -> None:
    plan = schedule(7, faults=8, service_kills=2)
    assert plan == schedule(7, faults=8, service_kills=2)
    assert plan != schedule(8, faults=8, service_kills=2)
    kinds = [f.kind for f in plan]
    assert len(kinds) == 10
    assert kinds.count("service kill -9") == 2
    assert {"kill -9", "pause", "restart"} <= set(kinds)  # every kind at least once
    mixes = {tuple(sorted(f.kind for f in schedule(s, 8, 0))) for s in range(1, 21)}
    assert len(mixes) > 3  # the mix itself is drawn, not fixed


def test_a_short_fault_schedule_loses_and_repeats_nothing(tmp_path: Path) -> None:
    outcome = run(seed=3, workdir=tmp_path, faults=4, service_kills=1)
    print("\n" + outcome.line())
    assert outcome.expected > 0
    assert outcome.lost == 0, outcome.line()
    assert outcome.different == 0, outcome.line()
    assert outcome.late == 0, outcome.line()
    assert outcome.longest_unhealthy_s <= 30, outcome.line()
    assert all(outcome.unready_seen), outcome.line()
    resumed = [r for r in outcome.resumed_s if r is not None]
    assert resumed, outcome.line()  # back at work by itself after the broker faults
    # the transaction wait (30 s) and a rebuild; after a marker the broker skipped, the
    # wait until the offsets are settled too (the stable fetches that fail meanwhile)
    limit = 60 + (SETTLE_AFTER_S + 2 * COMMITTED_WAIT_MS / 1000 if outcome.settled else 0)
    assert max(resumed) < limit, outcome.line()
