"""A query's chunk ids as the join keeps them: 64-bit hashes, packed as native int64
after the pending query's header (``join_state.HEADER``)."""

from __future__ import annotations

import struct
from collections.abc import Sequence

from service.stream.events import ScoredResult


def chunk_hashes(results: Sequence[str | ScoredResult]) -> list[int]:
    """The chunk ids' 64-bit hashes in rank order (the join only compares ids of one
    query)."""
    if results and type(results[0]) is str:
        try:  # chunk ids given as strings, hashed in one call (ScoredResult is not hashable)
            return list(map(hash, results))
        except TypeError:  # a ScoredResult further down
            pass
    return [hash(r) if type(r) is str else hash(r.chunk_id) for r in results]  # type: ignore[union-attr]


_LAYOUTS: dict[int, struct.Struct] = {}
"""A pending query's layouts by number of results (at most ``MAX_RESULTS + 1``)."""


def packed_query(head: int, context_k: int, hashes: list[int]) -> bytes:
    """A pending query as the join keeps it: ``HEADER`` (its first word, ``context_k``),
    then the hashes as native int64, in one ``struct`` call (an ``array`` of the hashes
    cost half as much again)."""
    layout = _LAYOUTS.get(len(hashes))
    if layout is None:
        layout = _LAYOUTS[len(hashes)] = struct.Struct(f"=qi{len(hashes)}q")
    return layout.pack(head, context_k, *hashes)
