"""What the processing loop and the HTTP side share: the monitor behind one lock, and health.

The loop (the Kafka edge, the demo feeder or a test) writes, under :attr:`ServiceState.lock`;
the HTTP handlers and the Prometheus collector read under the same lock and copy what they
need, so a slow client never holds the loop for longer than a copy.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from service.detect.detector import Detector
from service.monitor import Monitor, WindowView
from service.stream.pipeline import Pipeline


@dataclass(slots=True)
class SourceHealth:
    """What the Kafka edge (or the demo feeder) reports for exposition and readiness.

    Written under the state's lock.
    """

    lag: dict[tuple[str, int], int] = field(default_factory=dict)
    paused: set[tuple[str, int]] = field(default_factory=set)
    """Topic partitions paused by backpressure."""
    last_poll_ms: int | None = None
    assigned: int = 0
    deadletters: int = 0
    stopped: bool = False
    """The clean stop finished: nothing is consumed or published any more."""
    failed: str | None = None
    """A thread of the process died (its error): the process is not alive any more."""


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
