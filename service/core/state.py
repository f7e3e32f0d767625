"""What the processing loop and the HTTP side share: the monitor behind one lock, and health.

The loop (the Kafka edge, the demo feeder or a test) writes, under :attr:`ServiceState.lock`;
the HTTP handlers and the Prometheus collector read under the same lock and copy what they
need, so a slow client never holds the loop for longer than a copy.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from service.core.monitor import Monitor
from service.core.view import WindowView
from service.detect.detector import Detector
from service.stream.pipeline import Pipeline

BROKER_CALLS = ("poll", "commit", "rebuild", "lag")
"""The broker waits the consumer loop declares."""


@dataclass(frozen=True, slots=True)
class BrokerWait:
    """The broker call the loop is inside: what, since when and its bound (wall ms)."""

    what: str
    since_ms: int
    limit_ms: int


@dataclass(slots=True)
class SourceHealth:
    """What the Kafka edge (or the demo feeder) reports for exposition and readiness.

    Written under the state's lock.
    """

    lag: dict[tuple[str, int], int] = field(default_factory=dict)
    paused: set[tuple[str, int]] = field(default_factory=set)
    """Topic partitions paused by backpressure."""
    last_poll_ms: int | None = None
    commits: int = 0
    """Commits that succeeded (each a transaction with the input offsets)."""
    last_commit_ms: int | None = None
    """Wall time of the last commit that succeeded."""
    assigned: int = 0
    deadletters: int = 0
    stopped: bool = False
    """The clean stop finished: nothing is consumed or published any more."""
    failed: str | None = None
    """A thread of the process died (its error): the process is not alive any more."""
    broker_connected: bool | None = None
    """Whether a broker connection was up at the loop's last turn (None: no broker)."""
    unreachable_since_ms: int | None = None
    """Wall time since which no broker connection has been up (None: one is)."""
    wait: BrokerWait | None = None
    """The broker call the loop is inside now (liveness allows it its bound)."""
    waited_ms: dict[str, int] = field(default_factory=lambda: dict.fromkeys(BROKER_CALLS, 0))
    """Wall time spent in finished broker waits, per call (keys fixed: read unlocked)."""


@dataclass(slots=True)
class ServiceState:
    """Shared between the processing loop (writer) and the HTTP server (reader)."""

    monitor: Monitor
    wall_ms: Callable[[], int]
    lock: threading.Lock = field(default_factory=threading.Lock)
    """The one lock of the monitor and the health below."""
    health: SourceHealth = field(default_factory=SourceHealth)
    heartbeat_ms: int | None = None
    """Wall time of the last loop iteration (liveness)."""
    stale_after_ms: int = 30_000
    """The loop or the poll is stale when older than this."""
    needs_assignment: bool = True
    """False for the demo and replay, which own their single partition."""
    topic_names: tuple[str, str] = ("retrieval.queries", "retrieval.feedback")
    """The names of the queries and the feedback topic (indexed by ``Topic``)."""

    @property
    def pipeline(self) -> Pipeline:
        """The streaming core of the monitor."""
        return self.monitor.pipeline

    @property
    def view(self) -> WindowView:
        """The closed windows merged over partitions, with the detector (what the API reads)."""
        return self.monitor.view

    @property
    def detector(self) -> Detector:
        """The regression detector of the monitor."""
        return self.monitor.detector

    def beat(self) -> None:
        """The loop is alive."""
        self.heartbeat_ms = self.wall_ms()

    @contextmanager
    def waiting_on_broker(self, what: str, limit_ms: int) -> Iterator[None]:
        """Declare a broker call bounded by ``limit_ms``: the process is alive inside it
        for that long (see :mod:`service.http.health`). Nested calls count in the outer one."""
        health = self.health
        if health.wait is not None:
            yield
            return
        since = self.wall_ms()
        health.wait = BrokerWait(what, since, limit_ms)
        try:
            yield
        finally:
            health.wait = None
            now = self.wall_ms()
            health.waited_ms[what] = health.waited_ms.get(what, 0) + now - since
            self.heartbeat_ms = now

    def broker_seen(self, connected: bool) -> None:
        """Record whether a broker connection is up now."""
        health = self.health
        health.broker_connected = connected
        if connected:
            health.unreachable_since_ms = None
        elif health.unreachable_since_ms is None:
            health.unreachable_since_ms = self.wall_ms()
