"""A query's chunk ids as the join keeps them: hashes of the ids, whatever their shape,
packed after the pending query's header."""

from __future__ import annotations

import struct

import pytest

from service.stream.events import ScoredResult
from service.stream.hashes import chunk_hashes, packed_query
from service.stream.join_state import HEAD, HEADER

IDS = ["doc-1#0", "doc-2#3", "doc-1#0", "doc-9#1"]


@pytest.mark.parametrize(
    "shape",
    [
        "strings",
        "objects",
        "strings, then an object",  # the one-call path refused part-way
        "an object, then strings",
        "empty",
    ],
)
def test_every_shape_of_results_hashes_to_the_ids_hashes(shape: str) -> None:
    ids = [] if shape == "empty" else IDS
    results: list[str | ScoredResult] = list(ids)
    if shape == "objects":
        results = [ScoredResult(chunk_id=i, score=0.5) for i in ids]
    elif shape == "strings, then an object":
        results[-1] = ScoredResult(chunk_id=ids[-1])
    elif shape == "an object, then strings":
        results[0] = ScoredResult(chunk_id=ids[0], score=None)
    assert chunk_hashes(results) == [hash(i) for i in ids]


def test_a_pending_query_is_its_header_then_the_hashes_as_native_int64() -> None:
    hashes = [hash(i) for i in IDS]
    packed = packed_query(7 * 300_000 + 1234, -1, hashes)
    assert packed == HEADER.pack(7 * 300_000 + 1234, -1) + struct.pack(f"={len(hashes)}q", *hashes)
    assert HEAD.unpack_from(packed)[0] == 7 * 300_000 + 1234
    assert len(packed) == HEADER.size + 8 * len(hashes)
