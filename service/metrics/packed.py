"""Judging a batch of queries whose chunk ids are packed 64-bit integers, without a loop
over results or queries.

The streaming core keeps each pending query's ranking as the native bytes of its chunk
ids' 64-bit hashes, and its labels as ``{hash: grade}``. :func:`judge_packed` joins a
whole batch of them at once: every ranking is concatenated into one array, every
relevant label into another, and each label is compared with its query's ranking in
one vectorised step, keeping the first position where its chunk was retrieved.
The result is the same :class:`~service.metrics.ir.JudgedBatch` that
:func:`~service.metrics.ir.judge_batch` builds from lists (the unit tests hold the two
equal), so every metric is computed by the same code.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import chain

import numpy as np

from service.metrics.ir import IntArray, JudgedBatch

_EMPTY = np.zeros(0, dtype=np.int64)


def judge_packed(
    rankings: Sequence[bytes],
    labels: Sequence[Mapping[int, int] | None],
    context_ks: Sequence[int],
    ideal_depth: int = 1000,
    skip: int = 0,
) -> JudgedBatch:
    """Join each packed ranking (native int64 chunk ids, rank order, after ``skip``
    bytes of something else) with its grades (chunk id -> grade, or None for none;
    grades <= 0 are not relevant); ``context_ks`` holds -1 where a query logged none."""
    n = len(rankings)
    if len(labels) != n or len(context_ks) != n:
        raise ValueError(f"{n} rankings, {len(labels)} label sets, {len(context_ks)} context_k")
    # every label in three flat arrays (query, chunk, grade), in a few C-level passes
    judged = [qi for qi, grades in enumerate(labels) if grades]
    present: list[Mapping[int, int]] = [labels[qi] for qi in judged]  # type: ignore[misc]
    lq = np.repeat(np.asarray(judged, dtype=np.int64), list(map(len, present)))
    lc = np.array(list(chain.from_iterable(present)), dtype=np.int64)
    lg = np.array([g for grades in present for g in grades.values()], dtype=np.int64)
    relevant = lg > 0
    lq, lg, lc = lq[relevant], lg[relevant], lc[relevant]
    n_relevant = np.bincount(lq, minlength=n).astype(np.int64)
    ideal_q, ideal_pos, ideal_gain = _ideal(lq, lg, ideal_depth)
    hit_q, hit_rank, hit_gain = _hits(rankings, n_relevant, lq, lc, lg, skip=skip)
    return JudgedBatch(
        n_queries=n,
        hit_query=hit_q,
        hit_rank=hit_rank,
        hit_gain=hit_gain.astype(np.float64),
        n_relevant=n_relevant,
        ideal_query=ideal_q,
        ideal_pos=ideal_pos,
        ideal_gain=ideal_gain.astype(np.float64),
        ideal_depth=ideal_depth,
        context_k=np.asarray(context_ks, dtype=np.int64).reshape(n),
    )


def _ideal(lq: IntArray, lg: IntArray, depth: int) -> tuple[IntArray, IntArray, IntArray]:
    """Each query's relevant grades, highest first, at positions 0.. (cut at ``depth``)."""
    order = np.lexsort((-lg, lq))
    q, g = lq[order], lg[order]
    pos = np.arange(len(q), dtype=np.int64) - np.searchsorted(q, q, side="left")
    keep = pos < depth
    return q[keep], pos[keep], g[keep]


def _hits(
    rankings: Sequence[bytes],
    n_relevant: IntArray,
    lq: IntArray,
    lc: IntArray,
    lg: IntArray,
    *,
    skip: int,
) -> tuple[IntArray, IntArray, IntArray]:
    """(query, first position, grade) of every relevant chunk that was retrieved, sorted
    by query then position.

    Each relevant label is compared with every entry of its query's ranking (a handful
    of labels per query: cheaper than sorting the rankings), and keeps its first match.
    """
    judged = np.flatnonzero(n_relevant)
    if len(judged) == 0:
        return _EMPTY, _EMPTY, _EMPTY
    blobs = [rankings[i] for i in judged.tolist()]
    sizes = np.fromiter(map(len, blobs), dtype=np.int64, count=len(blobs))
    lengths, odd = np.divmod(sizes - skip, 8)
    if odd.any():
        raise ValueError(f"a packed ranking is not {skip} bytes and whole int64 ids")
    # joined with ``pad`` bytes between rankings, every id is at the same alignment, so
    # that one int64 view of the whole reads them all (no copy of each ranking)
    pad = -skip % 8
    joined = bytes(pad).join(blobs)
    align = skip % 8
    words = np.frombuffer(joined, dtype=np.int64, count=(len(joined) - align) // 8, offset=align)
    first_word = (np.cumsum(sizes + pad) - (sizes + pad) + skip - align) // 8
    slot = np.searchsorted(judged, lq)  # each label's query among the judged ones
    span = lengths[slot]
    label = np.repeat(np.arange(len(lq)), span)
    position = np.arange(len(label), dtype=np.int64) - np.repeat(np.cumsum(span) - span, span)
    ids = words[first_word[slot][label] + position]
    matched = np.flatnonzero(ids == lc[label])
    first = np.ones(len(matched), dtype=bool)  # (positions ascend within a label)
    first[1:] = label[matched[1:]] != label[matched[:-1]]
    matched = matched[first]
    which = label[matched]
    hit_q, hit_rank, hit_gain = lq[which], position[matched], lg[which]
    canonical = np.lexsort((hit_rank, hit_q))
    return hit_q[canonical], hit_rank[canonical], hit_gain[canonical]
