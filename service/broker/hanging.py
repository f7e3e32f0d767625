"""Committed offsets that stay unstable for ever: a transaction marker the broker skipped.

A transaction that commits consumer offsets is complete on the offsets partition only
once the transaction coordinator writes its marker there. A single broker shutting down
while it completes a transaction can skip that marker (its log: ``Couldn't find leader
endpoint for partitions Set(__consumer_offsets-N) while trying to send transaction
markers ... can be skipped``). The transaction is complete for the coordinator, but its
offsets stay pending in the group for ever, and every stable fetch of them (what a
``read_committed`` consumer makes) answers ``UNSTABLE_OFFSET_COMMIT``: the rebuild after
the outage would wait for ever (seen in the fault schedule, docs/reliability.md).

A new producer of the same transactional id does not end it (there is nothing open to
abort). A marker for the producer id on that offsets partition does: the group then
completes every pending offset of that producer id. So once the stable fetch has failed,
with the broker answering the plain fetch, for longer than any live transaction may last
(the producer's transaction timeout), the service commits the last committed offsets of
its partitions again, in a transaction of its own: its marker settles the pending
offsets, and the partitions restart from what was last committed (windows of the
transaction, if it committed, are published again with identical values).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kafka.errors import KafkaError, KafkaTimeoutError
from kafka.structs import OffsetAndMetadata

SETTLE_AFTER_S = 90.0
"""How long stable fetches must keep failing, with the broker answering, before the
offsets are settled: longer than a live transaction may stay open (the producer's
``transaction_timeout_ms``, 60 s, after which the coordinator aborts it)."""
LAST_COMMITTED_WAIT_MS = 5_000
"""The bound of the plain (not stable) fetch of the last committed offsets."""

LastCommitted = Callable[[set[Any], int], Mapping[Any, Any]]
"""Fetches the last committed offsets without waiting for pending transactions
(:func:`service.broker.compat.last_committed`)."""


class HangingOffsets:
    """Tells a hanging transaction's offsets apart from a broker away, and what to commit."""

    def __init__(self, last_committed: LastCommitted, clock: Callable[[], float] = time.monotonic):
        self._last_committed = last_committed
        self._clock = clock
        self.unstable_since: float | None = None
        """Since when stable fetches fail while plain fetches are answered."""

    def now(self) -> float:
        """The clock (taken when a stable fetch starts)."""
        return self._clock()

    def to_settle(
        self, tps: Iterable[Any], error: Exception, started: float
    ) -> dict[Any, OffsetAndMetadata]:
        """The stable fetch of ``tps``, begun at ``started``, failed with ``error``: the
        offsets to commit again when they have been unstable for longer than
        ``SETTLE_AFTER_S`` (counted from the start of the first fetch that failed so),
        else nothing."""
        if not isinstance(error, KafkaTimeoutError):
            self.unstable_since = None
            return {}
        try:
            last = self._last_committed(set(tps), LAST_COMMITTED_WAIT_MS)
        except KafkaError:  # the broker (or its coordinator) is away: not a hanging marker
            self.unstable_since = None
            return {}
        now = self._clock()
        if self.unstable_since is None:
            self.unstable_since = started
        if now - self.unstable_since <= SETTLE_AFTER_S:
            return {}
        return {
            tp: OffsetAndMetadata(m.offset, m.metadata, -1)
            for tp, m in last.items()
            if m is not None and m.offset is not None and m.offset >= 0
        }

    def settled(self) -> None:
        """Stable fetches succeed (again)."""
        self.unstable_since = None
