"""The two input topics of a partition: one enum, used as an index and as a counter key."""

from __future__ import annotations

from enum import IntEnum
from typing import Final


class Topic(IntEnum):
    """Which input topic a record came from (an index into per-topic pairs)."""

    QUERIES = 0
    FEEDBACK = 1

    @property
    def label(self) -> str:
        """``queries`` or ``feedback``: the kind named in configuration and replay files."""
        return "queries" if self is Topic.QUERIES else "feedback"


QUERIES: Final = Topic.QUERIES
FEEDBACK: Final = Topic.FEEDBACK
TOPICS: Final = (QUERIES, FEEDBACK)
