"""The bound of every broker wait the consumer loop makes, for liveness.

While the broker is away a turn of the loop may wait as long as these; ``/healthz``
stays 200 inside a declared wait for its bound plus the staleness allowance
(:mod:`service.http.health`), and the Kubernetes liveness probe need only allow that
allowance (a test holds ``deploy/kubernetes`` against :func:`longest_wait_ms`).
"""

from __future__ import annotations

from service.broker.commits import COMMITTED_WAIT_MS
from service.broker.hanging import LAST_COMMITTED_WAIT_MS
from service.broker.transport import PRODUCER_MAX_BLOCK_MS, REPLACE_WAIT_S, TRANSACTION_WAIT_MS
from service.config import Settings

POLL_ALLOWANCE_MS = 120_000
"""What a poll may take beyond its timeout: kafka-python's poll joins the group and
refreshes metadata inside it, without a hard limit (about 50 s seen with the broker
killed); the allowance is generous so that liveness never fails during an outage."""

LAG_WAIT_MS = 1_000
"""The bound of one partition's position lookup for the lag."""

METADATA_WAIT_MS = 30_000
"""The bound of a topic's partition lookup (at start, and the follower's first look)."""


def commit_limit_ms() -> int:
    """A commit cycle: the offsets and the commit (one transactional wait each), then
    an abort (one more) or a producer replaced (retried for ``REPLACE_WAIT_S``, each try
    bounded by the producer's ``max_block_ms``)."""
    return 3 * TRANSACTION_WAIT_MS + int(REPLACE_WAIT_S * 1000) + PRODUCER_MAX_BLOCK_MS


def poll_limit_ms(settings: Settings) -> int:
    """One poll."""
    return settings.poll_timeout_ms + POLL_ALLOWANCE_MS


def rebuild_limit_ms() -> int:
    """The committed offsets of every assigned partition fetched (one budget for all);
    when they stay unstable, the last committed ones fetched and committed again
    (:mod:`service.broker.hanging`)."""
    settle = LAST_COMMITTED_WAIT_MS + commit_limit_ms()
    return COMMITTED_WAIT_MS + settle + LAG_WAIT_MS  # (+ a margin for the last overrun)


def lag_limit_ms(partitions: int) -> int:
    """Positions looked up for ``partitions`` topic partitions."""
    return max(1, partitions) * LAG_WAIT_MS


def longest_wait_ms(settings: Settings, partitions: int) -> int:
    """The longest wait of one step of the loop with ``partitions`` topic partitions."""
    return max(
        poll_limit_ms(settings),
        commit_limit_ms(),
        rebuild_limit_ms(),
        lag_limit_ms(partitions),
    )
