"""Property 13 (broker faults): the broker restarted cleanly, then killed with -9, mid-stream.

A private broker (the shared one serves the other tests) holds the input. The service
works through the backlog; a third of the way in the broker is stopped cleanly and
started again, two thirds of the way in it is killed with SIGKILL and kept down for
longer than a transactional request may wait, then started again (its logs are
recovered). The service process lives through both: it reconnects, its open
transaction is aborted (or, with a request unanswered, its producer replaced, which
makes the broker abort it) and it rebuilds from the last commit. The oracle:
the windows equal the offline evaluation, each key once, and the counter totals of the
one process lifetime equal it too. Meanwhile ``/healthz`` and ``/readyz`` are read
twice a second: the process stays alive through both outages (never 503 for more than
30 s in a row), and is unready with ``broker unreachable since ...`` while the broker is
away.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from kafka.admin import KafkaAdminClient

from service.broker.transport import TRANSACTION_WAIT_MS
from tests.integration.conftest import create_topics
from tests.integration.kafka_helpers import (
    FAST,
    Probes,
    ServiceProcess,
    check_counts,
    check_windows,
    expected_windows,
    produce,
    report_figures,
    stop_and_scrape,
    total,
    traffic,
    wait_all_published,
)
from tests.integration.private_broker import PrivateBroker

pytestmark = [pytest.mark.integration, pytest.mark.faults, pytest.mark.slow]


@pytest.fixture
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateBroker]:
    broker = PrivateBroker(tmp_path_factory.mktemp("broker"))
    broker.up()
    yield broker
    broker.down(wipe=True)


def test_broker_restart_and_kill_9_mid_stream(broker: PrivateBroker, tmp_path: Path) -> None:
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, client_id="tests-admin")
    topics = replace(create_topics(admin), bootstrap=broker.bootstrap)
    admin.close()
    events = traffic(seed=71, hours=4.0)
    expected = expected_windows(events)
    produce(topics, events)
    n = len(events)
    settings = {
        **FAST,
        "max_poll_records": "20",  # slow enough that both faults land mid-stream
        "commit_interval": "200ms",
        "shutdown_grace": "60s",
        "transactional_id": f"{topics.group}-r0",
    }
    service = ServiceProcess(topics, tmp_path / "service.log", **settings)
    service.wait_ready()
    probes = Probes(service)
    outages, spans = [], []
    for fraction, fault in ((1 / 3, "restart"), (2 / 3, "kill -9")):
        service.wait_progressing(
            lambda f=fraction: total(service.samples(), "retrieval_events_total") >= f * n,
            f"{fraction:.0%} of the records read",
        )
        unread = n - total(service.samples(), "retrieval_events_total")  # counted once each
        started = time.monotonic()
        if fault == "restart":
            broker.down()
            time.sleep(3)  # the service polls a broker that is not there
        else:
            broker.kill9()
            # Longer than a transactional request may wait (TRANSACTION_WAIT_MS): a
            # commit in flight goes unanswered, and the producer must be replaced so
            # that the broker aborts what it left open (else the group's committed
            # offsets stay unstable and the rebuild waits for them for ever).
            time.sleep(TRANSACTION_WAIT_MS / 1000 + 5)
        assert service.process.poll() is None, service.tail()
        down_until = time.monotonic()
        broker.up()
        up = time.monotonic()
        service.wait_until(lambda: service.get("/readyz")[0] == 200, 240, "ready again")
        spans.append((started, down_until, round(time.monotonic() - up, 1)))
        outages.append((fault, round(down_until - started, 1), unread))

    wait_all_published(service, topics, len(expected))
    probes.stop()
    final = stop_and_scrape(service)
    unhealthy = probes.longest_unhealthy_s()
    print(
        f"\n/healthz: longest run of non-200 answers {unhealthy:.1f} s; "
        f"ready again {[ready for _, _, ready in spans]} s after the broker was started"
    )
    assert unhealthy <= 30, "the liveness probe would restart the pod during the outage"
    # the kill -9 outage (the clean restart's is a few seconds, shorter than a turn may be)
    start, end, _ = spans[1]
    seen = probes.during(start + 2, end)
    reasons = [r for _, _, ready, r in seen if ready == 503]
    assert any(r.startswith("broker unreachable since ") for r in reasons), seen
    print(
        f"\nbroker faults {outages} (fault, seconds down, records unread then): "
        f"{n} records in, {len(expected)} windows expected"
    )
    assert all(unread > 0 for _, _, unread in outages), "a fault landed after the stream ended"
    # Usually a commit is in flight when the broker dies (then the producer is replaced);
    # sometimes the loop waits inside poll() for the whole outage instead.
    replaced = service.log_path.read_text(errors="replace").count("replacing the producer")
    print(f"producer replaced {replaced} times")
    check_windows(topics, expected)
    check_counts([final], expected)
    report_figures("broker faults", "1 clean restart, 1 kill -9", n, topics, expected)
