"""Plain counters of what the pipeline saw and did, read by the Prometheus collector.

The pure core only adds to these; ``exporter.py`` turns them into series at each scrape.
Counters keyed by topic use :class:`~service.stream.topics.Topic`; the exporter maps
it to the configured topic names.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from service.metrics.aggregates import MetricAggregates, merge_into
from service.stream.topics import Topic


@dataclass(slots=True)
class Counts:
    """Cumulative counts since the process started (only records not counted before)."""

    events: Counter[Topic] = field(default_factory=Counter)
    invalid: Counter[tuple[Topic, str]] = field(default_factory=Counter)
    ignored: Counter[Topic] = field(default_factory=Counter)
    """Records an input mapping skips (feedback actions it ignores): not events."""
    unmatched: Counter[str] = field(default_factory=Counter)
    late: Counter[Topic] = field(default_factory=Counter)
    duplicates: Counter[Topic] = field(default_factory=Counter)
    duplicate_results: int = 0
    evicted: Counter[str] = field(default_factory=Counter)
    queries: Counter[tuple[str, str]] = field(default_factory=Counter)
    label_overflow: Counter[str] = field(default_factory=Counter)
    finalized: Counter[tuple[str, str, bool]] = field(default_factory=Counter)
    windows_published: int = 0
    published: dict[tuple[str, str], MetricAggregates] = field(default_factory=dict)
    first_seen_ms: dict[str, int] = field(default_factory=dict)
    audit_outcomes: Counter[str] = field(default_factory=Counter)
    """Audits by outcome at their window's close: counted, replaced, outside_sample,
    no_query, too_late, other_judge (a window closed again after a restart counts again)."""

    def add_published(self, retriever: str, segment: str, metrics: MetricAggregates) -> None:
        """Fold a published window's aggregates into the cumulative summaries."""
        merge_into(self.published.setdefault((retriever, segment), {}), metrics)


OTHER = "other"
"""What a label value beyond the cap becomes."""


class LabelCap:
    """Keeps at most ``limit`` distinct values of a label; later ones become ``other``."""

    def __init__(self, name: str, limit: int, counts: Counts) -> None:
        self.name = name
        self.limit = limit
        self.counts = counts
        self.values: set[str] = set()

    def __call__(self, value: str) -> str:
        if value in self.values:
            return value
        if len(self.values) < self.limit:
            self.values.add(value)
            return value
        self.counts.label_overflow[self.name] += 1
        return OTHER
