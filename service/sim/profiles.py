"""Retriever versions as the simulator sees them: how well each finds relevant chunks,
how high it ranks them, and how soon its users act."""

from __future__ import annotations

from dataclasses import dataclass

from service.errors import ConfigError
from service.sim.clicks import check_rate


@dataclass(frozen=True, slots=True)
class RetrieverProfile:
    """How well one retriever version finds relevant chunks, and how high it ranks them."""

    name: str
    """The version label emitted as ``retriever``."""
    find_rate: float = 0.85
    """Probability that a relevant chunk appears anywhere in the results."""
    rank_decay: float = 0.5
    """Ratio of a truncated geometric rank distribution; 0 puts found chunks at rank 1."""
    empty_rate: float = 0.0
    """Share of queries for which the retriever returns nothing."""
    feedback_delay: float = 1.0
    """Multiplies the delay of every feedback event of its queries (its users act later
    or sooner, however good its results)."""

    def __post_init__(self) -> None:
        if not 1 <= len(self.name) <= 100:
            raise ConfigError(f"retriever name must have 1..100 characters, got {self.name!r}")
        for name in ("find_rate", "empty_rate"):
            check_rate(name, getattr(self, name))
        if not 0.0 <= self.rank_decay < 1.0:
            raise ConfigError(f"rank_decay must be in [0, 1), got {self.rank_decay!r}")
        if not self.feedback_delay > 0:
            raise ConfigError(f"feedback_delay must be positive, got {self.feedback_delay!r}")


HYBRID_V7 = RetrieverProfile("hybrid-v7", find_rate=0.85, rank_decay=0.5, empty_rate=0.002)
HYBRID_V8 = RetrieverProfile("hybrid-v8", find_rate=0.87, rank_decay=0.45, empty_rate=0.002)
