"""A restart keeps the rolling views and the open regressions (read back from the windows
topic, and from the regressions topic: the detector's ledger)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from kafka.admin import KafkaAdminClient, NewTopic

from service.sim.simulator import generate
from service.stream.windows import ClosedWindow
from service.times import rfc3339
from tests.integration.kafka_helpers import (
    STALL_S,
    ServiceProcess,
    Topics,
    deploy_traffic,
    produce,
    read_all,
)


def _regressions(service: ServiceProcess) -> dict[str, Any]:
    status, body = service.get("/api/v1/regressions")
    assert status == 200, body
    result: dict[str, Any] = json.loads(body)
    return result


def _opened(service: ServiceProcess) -> set[tuple[str, str, str, str, str]]:
    return {
        (r["retriever"], r["segment"], r["metric"], r["baseline"], r["opened_at"])
        for r in _regressions(service)["regressions"]
    }


def _evaluated_through(service: ServiceProcess, through_at_least: str) -> bool:
    """The detector has evaluated the boundaries up to ``through_at_least`` (RFC 3339)."""
    through = _regressions(service)["evaluated_through"]
    return through is not None and through >= through_at_least


def _rolling(service: ServiceProcess) -> dict[tuple[str, str], tuple[int, int]]:
    body = json.loads(service.get("/api/v1/rolling?window=24h")[1])
    return {(s["retriever"], s["segment"]): (s["queries"], s["labelled"]) for s in body["slices"]}


@pytest.mark.slow
def test_a_restart_keeps_rolling_views_and_open_regressions(topics: Topics, tmp_path: Path) -> None:
    sim = deploy_traffic(bad=True, seed=21)
    produce(topics, generate(sim))
    tested_from = rfc3339((sim.switch_at_ms or 0) + 90 * 60_000)

    def caught_up(service: ServiceProcess) -> bool:
        return _evaluated_through(service, tested_from)

    first = ServiceProcess(topics, tmp_path / "first.log")
    first.wait_ready()
    first.wait_progressing(lambda: caught_up(first), "the detector to test the deploy")
    opened, rolling = _opened(first), _rolling(first)
    assert opened, first.tail()
    assert {r[0] for r in opened} == {"hybrid-v8"}
    assert first.stop() == 0

    second = ServiceProcess(topics, tmp_path / "second.log")
    second.wait_ready()
    second.wait_progressing(lambda: caught_up(second), "the detector to catch up again")
    # every input record was committed: nothing is re-read, all of it comes back from
    # the windows topic, and the detector reaches the same verdicts at the same times
    assert _opened(second) >= opened
    assert _rolling(second) == rolling
    assert second.stop() == 0


@pytest.mark.slow
def test_open_regressions_survive_a_restart_whose_windows_miss_the_opening(
    topics: Topics, admin: KafkaAdminClient, tmp_path: Path
) -> None:
    """The only replica opens a regression, writes it to the regressions topic and stops;
    it restarts on a windows topic of its own, empty at first (the windows read back no
    longer cover the opening: it sees only those of the queries still pending at the
    stop, hours after the switch, so hybrid-v8 is no deploy to it and without the ledger
    nothing could open), with the same group and regressions topic. The regression comes
    back from the ledger."""
    sim = deploy_traffic(bad=True, seed=22)
    produce(topics, generate(sim))
    # the detector (at the label age, 5 minutes) past 2 h 25 min after the switch: the final
    # windows (25 minutes later) are then published through 2 hours after it
    tested_from = rfc3339((sim.switch_at_ms or 0) + 145 * 60_000)

    def caught_up(service: ServiceProcess) -> bool:
        return _evaluated_through(service, tested_from)

    first = ServiceProcess(topics, tmp_path / "first.log")
    first.wait_ready()
    first.wait_progressing(lambda: caught_up(first), "the detector to test the deploy")
    before = _regressions(first)["regressions"]
    assert before, first.tail()
    opened = {
        (r["retriever"], r["segment"], r["metric"], r["baseline"], r["opened_at"]) for r in before
    }

    def written() -> bool:
        keys = {r.key.decode() for r in read_all(topics.regressions, timeout_s=5)}
        return all(f"{'|'.join(key)}|open" in keys for key in opened)

    # (nothing counts up meanwhile, so no progress to wait on: the stall bound instead)
    first.wait_until(written, STALL_S, "the open regressions to reach the regressions topic")
    assert first.stop() == 0

    # a windows topic of its own: only the ledger can bring the regression back
    empty = replace(topics, windows=f"{topics.windows}.empty")
    admin.create_topics([NewTopic(empty.windows, num_partitions=1, replication_factor=1)])
    second = ServiceProcess(empty, tmp_path / "second.log", regressions_topic=topics.regressions)
    try:
        _restarted(second, empty, opened, before, sim.switch_at_ms or 0)
    finally:
        if second.process.poll() is None:  # (else its follower would create it again)
            second.process.kill()
            second.process.wait(timeout=30)
        admin.delete_topics([empty.windows])


def _restarted(
    second: ServiceProcess,
    empty: Topics,
    opened: set[tuple[str, str, str, str, str]],
    before: list[dict[str, Any]],
    switch_at_ms: int,
) -> None:
    second.wait_ready()
    second.wait_until(lambda: _opened(second) == opened, STALL_S, "the ledger to be installed")
    after = _regressions(second)
    # as it opened (its latest look and recovery statistic need windows to be brought up
    # to date: a restart that reads some back recomputes them, see tests/unit/detect)
    fields = ("kind", "opened_at", "evidence_end", "state", "closed_at", "alpha", "level")
    assert [{f: r[f] for f in fields} for r in after["regressions"]] == [
        {f: r[f] for f in fields} for r in before
    ]
    seen = [ClosedWindow.from_json(r.value) for r in read_all(empty.windows, timeout_s=5)]
    assert all(w.start_ms >= switch_at_ms + 2 * 3_600_000 for w in seen), seen
    assert second.stop() == 0
