"""What the HTTP layer reads: the pipeline behind its lock, health, and the registry."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from service.http.exporter import PipelineCollector, SourceHealth, build_registry
from service.stream.pipeline import Pipeline


@dataclass(slots=True)
class ServiceState:
    """Shared between the processing loop (writer) and the HTTP server (reader)."""

    pipeline: Pipeline
    wall_ms: Callable[[], int]
    lock: threading.Lock = field(default_factory=threading.Lock)
    health: SourceHealth = field(default_factory=SourceHealth)
    registry: CollectorRegistry | None = None
    heartbeat_ms: int | None = None
    """Wall time of the last loop iteration (liveness)."""
    stale_after_ms: int = 30_000
    """The loop or the poll is stale when older than this."""
    needs_assignment: bool = True
    """False for the demo and replay, which own their single partition."""
    topic_names: tuple[str, str] = ("retrieval.queries", "retrieval.feedback")
    """The names of the queries and the feedback topic (indexed by ``Topic``)."""

    def __post_init__(self) -> None:
        if self.registry is None:
            self.registry = build_registry(
                PipelineCollector(
                    self.pipeline,
                    self.lock,
                    self.topic_names,
                    self.health,
                )
            )

    def beat(self) -> None:
        """The loop is alive."""
        self.heartbeat_ms = self.wall_ms()
