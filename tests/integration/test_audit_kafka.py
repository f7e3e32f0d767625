"""The audit join through the real broker: a kill -9 mid-stream and every record delivered
twice, and the audit sums on the windows topic still equal the offline computation of the
events; the audit state topic carries the held requests across the restart.

Every record is produced twice in a row (a producer retrying): a repeated query is ignored,
repeated feedback changes no grade, and a repeated audit is the same judge's later audit
with the same grades (it replaces the first, so nothing changes). The service is killed
once it has read part of the input and restarted: the audits that come after the restart
grade queries finalised before it, which only the audit state topic still holds.
"""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path

import pytest

from service.audit.estimate import AuditSums
from service.sim.audit import JudgeModel
from service.sim.simulator import HYBRID_V7, HYBRID_V8, SimulationConfig, generate
from service.stream.events import audit_from, feedback_from, query_from
from service.stream.reference import audit_totals
from service.times import HOUR_MS
from tests.integration.kafka_helpers import (
    FAST,
    ServiceProcess,
    Topics,
    expected_windows,
    produce,
    published_windows,
    total,
)

pytestmark = [pytest.mark.integration, pytest.mark.faults, pytest.mark.slow]
RATE = 0.05
JUDGE = JudgeModel("human:careful", delay_ms=(HOUR_MS, 3 * HOUR_MS))
"""Audits 1 to 3 hours after their query: most of those read after the kill grade queries
finalised (and their windows committed) before it."""


def _sums(topics: Topics) -> tuple[dict[tuple[str, str], dict[str, AuditSums]], int]:
    windows, _ = published_windows(topics)
    out: dict[tuple[str, str], dict[str, AuditSums]] = {}
    audited = 0
    for w in windows.values():
        audited += w.audited
        for key, sums in w.audit.items():
            slot = out.setdefault((w.retriever, w.segment), {})
            slot[key] = slot[key] + sums if key in slot else sums
    return out, audited


def test_audits_count_once_through_a_kill_9_and_every_record_twice(
    topics: Topics, tmp_path: Path
) -> None:
    now = int(time.time() * 1000)
    # (ends 4 h ago: the last audits, up to 3 h after their queries, are older than an audit
    # window and the attribution window, so idleness closes them without waiting)
    start = now - 7 * HOUR_MS
    config = SimulationConfig(
        seed=53,
        start_ms=start,
        duration_ms=3 * HOUR_MS,
        queries_per_hour=2400,
        before=HYBRID_V7,
        after=HYBRID_V8,
        switch_at_ms=start + 2 * HOUR_MS,
        audit_rate=RATE,
        judges=(JUDGE,),
        id_prefix=f"au{random.Random(now).randrange(10**6)}-",
    )
    events = list(generate(config))
    queries = [query_from(e.event) for e in events if e.topic == "queries"]
    feedback = [e.event for e in events if e.topic == "feedback"]
    audits = [audit_from(f) for f in feedback if f.get("signal") == "audit"]
    live = [feedback_from(f) for f in feedback if f.get("signal") != "audit"]
    expected = audit_totals(queries, live, audits, rate=RATE)  # type: ignore[arg-type]
    assert len(audits) > 200
    produce(topics, [e for e in events for _ in range(2)])  # every record twice in a row

    replica = {
        **FAST,
        "audit_rate": str(RATE),
        "commit_interval": "300ms",
        "transactional_id": f"{topics.group}-r0",  # (a restart fences its killed predecessor)
    }
    first = ServiceProcess(topics, tmp_path / "first.log", **replica)
    first.wait_ready()
    # killed once it has committed windows of the first half of the run (their queries'
    # requests are on the audit state topic; the audits of most come after the kill)
    half = len(expected_windows(events)) // 2
    first.wait_progressing(
        lambda: total(first.samples(), "retrieval_windows_published_total") >= half,
        f"{half} windows committed",
    )
    first.process.send_signal(signal.SIGKILL)
    first.process.wait()

    second = ServiceProcess(topics, tmp_path / "second.log", **replica)
    second.wait_ready()

    def lost() -> float:  # audits whose request the restart did not hold
        return total(second.samples(), "retrieval_audits_total", outcome="no_query")

    second.wait_progressing(
        lambda: (
            lost() > 0
            or (
                _sums(topics)[1] >= len(audits)
                and total(second.samples(), "retrieval_pending_queries") == 0
            )
        ),
        f"{len(audits)} audits counted on the windows topic",
    )
    assert lost() == 0, "a request held before the kill was not read back"
    assert total(second.samples(), "retrieval_audits_total", outcome="counted") > 0
    got, audited = _sums(topics)
    assert audited == len(audits)
    assert got == expected
    assert second.stop() == 0, second.tail()
