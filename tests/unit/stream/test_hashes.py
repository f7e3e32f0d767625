"""A query's chunk ids as the join keeps them: hashes of the ids, whatever their shape,
packed after the pending query's header."""

from __future__ import annotations

import random
import struct

import pytest

from service.stream import hashes as hashes_module
from service.stream.events import ScoredResult
from service.stream.hashes import Results, chunk_hashes, hashed_queries
from service.stream.join import HEAD, HEADER, packed_query

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
    [body], repeats = hashed_queries([IDS])
    assert repeats == {0}  # (doc-1#0 twice)
    packed = packed_query(7 * 300_000 + 1234, -1, body)
    assert packed == HEADER.pack(7 * 300_000 + 1234, -1) + struct.pack(f"={len(hashes)}q", *hashes)
    assert HEAD.unpack_from(packed)[0] == 7 * 300_000 + 1234
    assert len(packed) == HEADER.size + 8 * len(hashes)


def _random_batch(rng: random.Random, n: int) -> list[Results]:
    """Queries of mixed lengths (0 to 30 results; most of 20), some with a repeated id,
    some of objects or of strings and objects."""
    batch: list[Results] = []
    for _ in range(n):
        length = 20 if rng.random() < 0.6 else rng.randrange(0, 31)
        ids = [f"doc-{rng.randrange(40)}#{rng.randrange(3)}" for _ in range(length)]
        shape = rng.random()
        results: list[str | ScoredResult] = list(ids)
        if shape < 0.1:
            results = [ScoredResult(chunk_id=i) for i in ids]
        elif shape < 0.2 and ids:
            results[rng.randrange(len(ids))] = ScoredResult(chunk_id=ids[0], score=1.0)
        batch.append(results)
    return batch


def _id(result: str | ScoredResult) -> str:
    return result if isinstance(result, str) else result.chunk_id


def _expected(results: Results) -> bytes:
    """A query's hashes packed the plain way (not through the module's own helpers)."""
    return struct.pack(f"={len(results)}q", *(hash(_id(r)) for r in results))


def _shaped(rng: random.Random, seed: int) -> list[Results]:
    batch = _random_batch(rng, rng.randrange(1, 300))
    if seed == 0:  # every query of one length (the reshaped path)
        batch = [r for r in batch if len(r) == 20]
    if seed == 1:  # strings only
        batch = [r for r in batch if all(type(x) is str for x in r)]
    if seed == 2:  # queries of strings and queries of objects, none mixed (all in C calls)
        batch = [r for r in batch if len({type(x) for x in r}) < 2]
    if seed == 3:  # every query mixed, objects first or strings first
        plain = [[_id(x) for x in r] for r in batch if len(r) > 1]
        batch = [[*ids[1:], ScoredResult(chunk_id=ids[0])] for ids in plain]
        batch += [[ScoredResult(chunk_id=ids[0]), *ids[1:]] for ids in plain]
    if seed == 4:  # long rows (the contract's most: 1,000 results)
        batch = [[f"doc-{rng.randrange(5000)}" for _ in range(1000)] for _ in range(20)]
    # whatever the shape: a query with a repeated id and one without
    return [*batch, ["x", "y", "x"], [ScoredResult(chunk_id="x"), ScoredResult(chunk_id="z")]]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("small_batch", [1, 10_000])  # numpy over the batch; one at a time
def test_a_batch_hashes_each_query_as_it_would_alone(
    seed: int, small_batch: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whole batches (mixed lengths and shapes, some with every query of one length, some
    of strings only, some with every query mixed, some of 1,000 results) give each query
    its own hashes packed in rank order, and the repeat check a set of its ids would give."""
    monkeypatch.setattr(hashes_module, "SMALL_BATCH", small_batch)
    batch = _shaped(random.Random(seed), seed)
    bodies, repeats = hashed_queries(batch)
    assert bodies == [_expected(r) for r in batch]
    assert repeats == {i for i, r in enumerate(batch) if len({_id(x) for x in r}) < len(r)}
    assert len(batch) - 2 in repeats
    assert len(batch) - 1 not in repeats


@pytest.mark.parametrize("lengths", [[0] * 20, [1] * 20, [0, 1] * 10, [0] * 19 + [3]])
def test_batches_of_short_rows(lengths: list[int]) -> None:
    """Rows too short to repeat an id (and one of three that does), at exactly the size
    from which a batch is hashed in numpy."""
    batch: list[Results] = [["same"] * n for n in lengths][: hashes_module.SMALL_BATCH]
    assert len(batch) == hashes_module.SMALL_BATCH
    bodies, repeats = hashed_queries(batch)
    assert bodies == [_expected(r) for r in batch]
    assert repeats == {i for i, r in enumerate(batch) if len(r) > 1}


def test_an_empty_batch_has_no_queries() -> None:
    assert hashed_queries([]) == ([], set())
