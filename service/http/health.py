"""Liveness is about the process, readiness about the broker.

The processing loop stamps a heartbeat every turn. A turn may wait on the broker (a
poll, a transactional request, a producer replaced, committed offsets fetched), and
while the broker is away such a wait lasts as long as its bound. A liveness probe that
failed then would restart every replica during one broker outage, which turns one
incident into two. So every broker wait the loop makes is declared with its bound
(:class:`~service.core.state.BrokerWait`): while a declared wait is within its bound
(plus the staleness allowance) the process is alive; past it, the loop is stuck (a bug:
restart). Readiness says whether this replica can do its work: 503 ``broker unreachable
since ...`` while no broker connection is up or a wait has lasted longer than
:data:`SLOW_WAIT_MS`.

Pure functions of the state and a clock, so that the rules are tested without a broker.
"""

from __future__ import annotations

from service.core.state import BrokerWait
from service.times import rfc3339

SLOW_WAIT_MS = 5_000
"""A broker wait longer than this makes the replica unready (the broker is not
answering), although the process stays alive for the wait's whole bound."""


def liveness(
    now_ms: int,
    heartbeat_ms: int | None,
    wait: BrokerWait | None,
    stale_after_ms: int,
    failed: str | None,
) -> tuple[bool, dict[str, object]]:
    """``(alive, body)`` of ``/healthz``."""
    if failed is not None:
        return False, {"status": "failed", "reason": failed}
    if wait is not None:
        waited = now_ms - wait.since_ms
        if waited <= wait.limit_ms + stale_after_ms:
            return True, {"status": "ok", "waiting_on_broker": wait.what, "for_s": waited / 1000}
        reason = (
            f"stuck in {wait.what} for {waited / 1000:.0f} s, longer than its bound of "
            f"{wait.limit_ms / 1000:.0f} s"
        )
        return False, {"status": "stalled", "reason": reason}
    if heartbeat_ms is None or now_ms - heartbeat_ms > stale_after_ms:
        return False, {"status": "stalled", "reason": "the loop has not run"}
    return True, {"status": "ok"}


def broker_unready(
    now_ms: int, wait: BrokerWait | None, unreachable_since_ms: int | None
) -> str | None:
    """The reason to be unready because of the broker, or None."""
    since = unreachable_since_ms
    # (a poll may take long for a rebalance; the connectivity says whether the broker is away)
    if wait is not None and wait.what != "poll" and now_ms - wait.since_ms > SLOW_WAIT_MS:
        since = wait.since_ms if since is None else min(since, wait.since_ms)
    if since is None:
        return None
    waiting = f" (waiting in {wait.what})" if wait is not None else ""
    return f"broker unreachable since {rfc3339(since)}{waiting}"
