"""Relevance grades from feedback signals (configurable, defaults from the contract)."""

from __future__ import annotations

from dataclasses import dataclass

from service.stream.events import FeedbackEvent


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
