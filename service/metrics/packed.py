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
    label_q: list[int] = []
    label_chunk: list[int] = []
    label_grade: list[int] = []
    for qi, grades in enumerate(labels):
        if grades:
            label_q += [qi] * len(grades)
            label_chunk += grades.keys()
            label_grade += grades.values()
    lq = np.asarray(label_q, dtype=np.int64)
    lg = np.asarray(label_grade, dtype=np.int64)
    relevant = lg > 0
    lq, lg = lq[relevant], lg[relevant]
    lc = np.asarray(label_chunk, dtype=np.int64)[relevant]
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
    lengths = (sizes - skip) // 8
    raw = np.frombuffer(b"".join(blobs), dtype=np.uint8)
    # every 8 bytes from every position (a view): an id is read at its byte offset, the
    # rankings left as they are (a memoryview of each, past ``skip``, cost more than this)
    words = np.lib.stride_tricks.as_strided(raw, shape=(max(len(raw) - 7, 0), 8), strides=(1, 1))
    starts = np.cumsum(sizes) - sizes + skip  # byte offset of each ranking's first id
    slot = np.searchsorted(judged, lq)  # each label's query among the judged ones
    span = lengths[slot]
    label = np.repeat(np.arange(len(lq)), span)
    position = np.arange(len(label), dtype=np.int64) - np.repeat(np.cumsum(span) - span, span)
    ids = words[starts[slot][label] + 8 * position].view(np.int64).reshape(-1)
    matched = np.flatnonzero(ids == lc[label])
    first = np.ones(len(matched), dtype=bool)  # (positions ascend within a label)
    first[1:] = label[matched[1:]] != label[matched[:-1]]
    matched = matched[first]
    which = label[matched]
    hit_q, hit_rank, hit_gain = lq[which], position[matched], lg[which]
    canonical = np.lexsort((hit_rank, hit_q))
    return hit_q[canonical], hit_rank[canonical], hit_gain[canonical]
