"""Relevance grades from feedback signals (configurable, defaults from the contract)."""

from __future__ import annotations

from dataclasses import dataclass

from service.stream.events import FeedbackEvent, Signal

SOURCES: tuple[Signal, ...] = ("click", "citation", "judgment")
"""The label sources (the live feedback signals), in the order of their bits in a query's
source mask: windows count, per source, the finalised queries with a relevant label from it."""
SOURCE_BITS: dict[str, int] = {source: 1 << i for i, source in enumerate(SOURCES)}
"""A source's bit in a query's source mask (click 1, citation 2, judgment 4). A feedback
event gives its bit when its grade (the policy's) makes its chunk relevant (>= 1): a
judgment of grade 0, or a click the policy grades 0, labels no query."""


@dataclass(frozen=True, slots=True)
class LabelPolicy:
    """Grade of one feedback event; a (query, chunk) takes the maximum over its events.

    Defaults: a click is grade 1, a click with ``dwell_ms >= 30000`` (a long click)
    grade 2, a citation grade 2, a judgment its own ``grade``. Relevant means grade >= 1.
    """

    click: int = 1
    long_click: int = 2
    long_click_dwell_ms: int = 30_000
    citation: int = 2

    def grade(self, event: FeedbackEvent) -> int:
        """The grade this single event gives its chunk."""
        if event.signal == "click":
            if event.dwell_ms is not None and event.dwell_ms >= self.long_click_dwell_ms:
                return self.long_click
            return self.click
        if event.signal == "citation":
            return self.citation
        return event.grade if event.grade is not None else 0
