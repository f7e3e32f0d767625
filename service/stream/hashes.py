"""A query's chunk ids as the join keeps them: 64-bit hashes, packed as native int64
after the pending query's header (``join.HEADER``).

:func:`hashed_queries` hashes the chunk ids of a whole batch of queries at once: one
``hash`` over all the ids, the repeat check as a row sort in numpy, and each query's
hashes cut from one buffer. Per query that is about a third cheaper than hashing,
checking (a ``set``) and packing (a ``struct`` call) each query on its own, which is
still done for small batches, where numpy's fixed cost per call would not pay.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import chain
from operator import attrgetter
from typing import TypeVar

import numpy as np

from service.stream.events import ScoredResult

Results = Sequence[str | ScoredResult]
"""A query's results as decoded: chunk ids, or objects that name one."""

SMALL_BATCH = 16
"""Batches of fewer queries are hashed one query at a time."""

_CHUNK_ID = attrgetter("chunk_id")
_T = TypeVar("_T")


def _ids(results: Results) -> Iterable[str]:
    """A query's ids, if its results are all strings or all objects."""
    return results if not results or type(results[0]) is str else map(_CHUNK_ID, results)  # type: ignore[return-value]


def _chunk_id(result: str | ScoredResult) -> str:
    return result if type(result) is str else result.chunk_id  # type: ignore[union-attr]


def _hash_ids(batch: Sequence[Results], into: Callable[[Iterator[int]], _T]) -> _T:
    """``into`` applied to the hashes of every chunk id of the batch's queries, in order:
    in C calls when each query's results are all strings or all objects (ScoredResult
    is not hashable), else telling the two apart id by id."""
    try:
        return into(map(hash, chain.from_iterable(map(_ids, batch))))
    except (TypeError, AttributeError):  # strings and objects in one query
        return into(map(hash, map(_chunk_id, chain.from_iterable(batch))))


def chunk_hashes(results: Results) -> list[int]:
    """The chunk ids' 64-bit hashes in rank order (the join only compares ids of one
    query)."""
    return _hash_ids((results,), list)


_LAYOUTS: dict[int, struct.Struct] = {}
"""Hashes packed as native int64, by number of results (at most ``MAX_RESULTS + 1``)."""


def _packed(hashes: list[int]) -> bytes:
    layout = _LAYOUTS.get(len(hashes))
    if layout is None:
        layout = _LAYOUTS[len(hashes)] = struct.Struct(f"={len(hashes)}q")
    return layout.pack(*hashes)


def hashed_queries(batch: Sequence[Results]) -> tuple[list[bytes], set[int]]:
    """For each query of the batch its chunk ids' hashes packed as native int64 in rank
    order, and the positions of the queries in which two hashes are equal (a repeated
    chunk id, as the join sees it)."""
    if len(batch) < SMALL_BATCH:
        bodies: list[bytes] = []
        repeats: set[int] = set()
        for position, results in enumerate(batch):
            hashes = chunk_hashes(results)
            if len(set(hashes)) != len(hashes):
                repeats.add(position)
            bodies.append(_packed(hashes))
        return bodies, repeats
    lengths = np.fromiter(map(len, batch), np.int64, count=len(batch))
    total = int(lengths.sum())
    every = _hash_ids(batch, lambda hashes: np.fromiter(hashes, np.int64, count=total))
    ends = np.cumsum(lengths)
    starts = ends - lengths
    buffer = every.tobytes()
    bodies = [buffer[a:b] for a, b in zip((8 * starts).tolist(), (8 * ends).tolist(), strict=True)]
    return bodies, _repeats(every, starts, lengths)


def _repeats(hashes: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> set[int]:
    """Positions of the queries (rows ``hashes[start:start + length]``) with two equal
    hashes: the rows of each length are sorted together and neighbours compared."""
    found: set[int] = set()
    for length in np.unique(lengths).tolist():
        if length < 2:
            continue
        rows = np.flatnonzero(lengths == length)
        if len(rows) == len(lengths):  # (the usual case: every query has as many results)
            block = hashes.reshape(len(rows), length)
        else:
            block = hashes[starts[rows, None] + np.arange(length)]
        ordered = np.sort(block, axis=1)
        found.update(rows[(ordered[:, 1:] == ordered[:, :-1]).any(axis=1)].tolist())
    return found
