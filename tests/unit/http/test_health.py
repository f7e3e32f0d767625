"""Liveness about the process, readiness about the broker (service/http/health.py), through
the HTTP routes with an injected clock."""

from __future__ import annotations

from fastapi.testclient import TestClient

from service.core.monitor import Monitor, MonitorConfig
from service.core.state import BrokerWait, ServiceState
from service.http.app import create_app
from service.http.health import SLOW_WAIT_MS, broker_unready, liveness

T0 = 1_800_000_000_000
STALE = 30_000


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


def _service() -> tuple[ServiceState, Clock, TestClient]:
    clock = Clock()
    state = ServiceState(Monitor(MonitorConfig(), clock), clock, stale_after_ms=STALE)
    state.health.assigned = 2
    state.health.last_poll_ms = T0
    state.beat()
    return state, clock, TestClient(create_app(state))


def test_a_loop_inside_a_bounded_broker_wait_stays_alive_for_the_whole_bound() -> None:
    state, clock, client = _service()
    limit = 450_000
    with state.waiting_on_broker("commit", limit):
        for waited in (0, STALE + 1, limit, limit + STALE):
            clock.now = T0 + waited
            response = client.get("/healthz")
            assert response.status_code == 200, (waited, response.json())
            assert response.json()["waiting_on_broker"] == "commit"
        clock.now = T0 + limit + STALE + 1  # past its bound: stuck, a restart may help
        response = client.get("/healthz")
        assert response.status_code == 503
        assert "stuck in commit" in response.json()["reason"]
    # the wait ended: the loop beat, and a loop that then stops turning is stale again
    assert client.get("/healthz").status_code == 200
    clock.now += STALE + 1
    assert client.get("/healthz").json() == {"status": "stalled", "reason": "the loop has not run"}
    assert state.health.waited_ms["commit"] == limit + STALE + 1


def test_without_a_declared_wait_a_loop_that_stops_turning_is_not_alive() -> None:
    state, clock, client = _service()
    clock.now = T0 + STALE
    assert client.get("/healthz").status_code == 200
    clock.now = T0 + STALE + 1
    assert client.get("/healthz").status_code == 503
    state.health.failed = "the follower thread died: boom"
    state.beat()
    assert client.get("/healthz").json()["reason"] == "the follower thread died: boom"


def test_nested_waits_count_in_the_outer_one() -> None:
    state, clock, _ = _service()
    with state.waiting_on_broker("commit", 1000):
        with state.waiting_on_broker("rebuild", 5):
            assert state.health.wait == BrokerWait("commit", T0, 1000)
            clock.now += 10
        assert state.health.wait is not None
    assert state.health.wait is None
    assert state.health.waited_ms["commit"] == 10
    assert state.health.waited_ms["rebuild"] == 0


def test_readiness_says_since_when_the_broker_is_unreachable() -> None:
    state, clock, client = _service()
    assert client.get("/readyz").json() == {"ready": True, "partitions": 2}
    state.broker_seen(False)
    clock.now += 7_000
    state.broker_seen(False)  # still down: the first time counts
    state.health.last_poll_ms = clock.now
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["reason"] == "broker unreachable since 2027-01-15T08:00:00Z"
    # meanwhile the process is alive
    state.beat()
    assert client.get("/healthz").status_code == 200
    state.broker_seen(True)
    assert client.get("/readyz").status_code == 200


def test_a_transactional_wait_longer_than_a_few_seconds_makes_the_replica_unready() -> None:
    wait = BrokerWait("commit", T0, 450_000)
    assert broker_unready(T0 + SLOW_WAIT_MS, wait, None) is None
    reason = broker_unready(T0 + SLOW_WAIT_MS + 1, wait, None)
    assert reason == "broker unreachable since 2027-01-15T08:00:00Z (waiting in commit)"
    # a long poll is a rebalance as often as an outage: connectivity decides there
    assert broker_unready(T0 + 60_000, BrokerWait("poll", T0, 120_200), None) is None
    # the earlier of the two starts
    assert broker_unready(T0 + 10_000, wait, T0 - 1000) == (
        "broker unreachable since 2027-01-15T07:59:59Z (waiting in commit)"
    )


def test_liveness_is_a_pure_function_of_its_inputs() -> None:
    assert liveness(T0, None, None, STALE, None)[0] is False
    assert liveness(T0, T0, None, STALE, None) == (True, {"status": "ok"})
    alive, body = liveness(T0 + 5_000, None, BrokerWait("poll", T0, 1_000), STALE, None)
    assert alive
    assert body["for_s"] == 5.0
