"""Per-query retrieval metrics for a whole batch of queries at once (pure numpy).

Conventions (they match trec_eval when each result is scored ``-rank``):

* ranks are 1-based positions in the logged list; a chunk id that repeats keeps its
  first position and its later copies count as non-relevant results;
* a chunk is relevant when its grade is >= 1; ``R`` counts every relevant chunk of
  the query, retrieved or not;
* a query is *labelled* when ``|R| >= 1``; every metric of an unlabelled query is NaN
  ("no data is not zero"), so that it never enters a mean.

Layout. A batch is kept ragged (CSR-like) rather than as padded ``queries x ranks``
matrices: one flat entry per *relevant retrieved* result and one per ideal gain. All
metrics then come from a handful of ``bincount`` calls whose cost grows with the
number of relevant hits, not with the length of the result lists, and no Python loop
runs over results or over queries while computing them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from service.errors import ConfigError

MetricKey = str
"""The one name of a metric: ``recall@5``, ``hit_rate@10``, ``mrr``, ``context_precision``."""

AT_K_FAMILIES = ("hit_rate", "recall", "precision", "ndcg")
"""Metric families evaluated at each cutoff k."""

SINGLE_METRICS = ("mrr", "context_precision")
"""Metrics without a cutoff."""

DEFAULT_KS = (1, 3, 5, 10, 20)

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]


def validate_ks(ks: Sequence[int]) -> tuple[int, ...]:
    """Return the cutoffs sorted and de-duplicated; raise ConfigError on a bad one."""
    if len(ks) == 0:
        raise ConfigError("at least one cutoff k is needed, e.g. 1,3,5,10,20")
    for k in ks:
        if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
            raise ConfigError(f"k must be a positive integer, got {k!r}")
    return tuple(sorted({int(k) for k in ks}))


def metric_keys(ks: Sequence[int]) -> tuple[MetricKey, ...]:
    """All metric keys for these cutoffs, e.g. ``recall@5``, ``mrr``, in report order."""
    cutoffs = validate_ks(ks)
    return tuple(f"{family}@{k}" for family in AT_K_FAMILIES for k in cutoffs) + SINGLE_METRICS


@dataclass(frozen=True, slots=True)
class JudgedBatch:
    """Ranked results of a batch of queries joined with their relevance grades.

    ``hit_*`` hold one entry per relevant retrieved result, sorted by (query, rank);
    ``ideal_*`` hold each query's relevant grades sorted descending, truncated at
    ``ideal_depth``; ``context_k`` is -1 where the query did not log one.
    """

    n_queries: int
    hit_query: IntArray
    hit_rank: IntArray  # 0-based position of the first occurrence
    hit_gain: FloatArray
    n_relevant: IntArray
    ideal_query: IntArray
    ideal_pos: IntArray
    ideal_gain: FloatArray
    ideal_depth: int
    context_k: IntArray

    @property
    def labelled(self) -> NDArray[np.bool_]:
        """True for queries with at least one relevant chunk."""
        return self.n_relevant > 0


def judge_batch(
    rankings: Sequence[Sequence[str]],
    judgments: Sequence[Mapping[str, int]],
    context_ks: Sequence[int | None] | None = None,
    ideal_depth: int = 1000,
) -> JudgedBatch:
    """Join each ranked list with its grades (chunk id -> grade; grades <= 0 are not relevant).

    The loop runs once per query over its *relevant* chunks only: the first position
    of each is found with ``list.index`` (a C-level scan), or through a position map
    when a query has many relevant chunks.
    """
    n = len(rankings)
    if len(judgments) != n:
        raise ValueError(f"{n} rankings but {len(judgments)} judgment sets")
    if context_ks is not None and len(context_ks) != n:
        raise ValueError(f"{n} rankings but {len(context_ks)} context_k values")
    hit_q: list[int] = []
    hit_r: list[int] = []
    hit_g: list[int] = []
    ideal_q: list[int] = []
    ideal_p: list[int] = []
    ideal_g: list[int] = []
    n_relevant = np.zeros(n, dtype=np.int64)
    for qi in range(n):
        relevant = [(chunk, grade) for chunk, grade in judgments[qi].items() if grade > 0]
        if not relevant:
            continue
        n_relevant[qi] = len(relevant)
        gains = sorted((grade for _, grade in relevant), reverse=True)[:ideal_depth]
        ideal_q.extend([qi] * len(gains))
        ideal_p.extend(range(len(gains)))
        ideal_g.extend(gains)
        docs = rankings[qi]
        if len(relevant) * 8 <= len(docs):
            for chunk, grade in relevant:
                try:
                    rank = docs.index(chunk)
                except ValueError:
                    continue
                hit_q.append(qi)
                hit_r.append(rank)
                hit_g.append(grade)
        else:
            # reversed, so that the first occurrence of a repeated id wins
            first = dict(zip(reversed(docs), range(len(docs) - 1, -1, -1), strict=True))
            for chunk, grade in relevant:
                rank_or_none = first.get(chunk)
                if rank_or_none is not None:
                    hit_q.append(qi)
                    hit_r.append(rank_or_none)
                    hit_g.append(grade)
    hq = np.asarray(hit_q, dtype=np.int64)
    hr = np.asarray(hit_r, dtype=np.int64)
    order = np.lexsort((hr, hq))  # canonical order: sums do not depend on label arrival order
    if context_ks is None:
        ctx = np.full(n, -1, dtype=np.int64)
    else:
        ctx = np.fromiter((-1 if c is None else c for c in context_ks), dtype=np.int64, count=n)
    return JudgedBatch(
        n_queries=n,
        hit_query=hq[order],
        hit_rank=hr[order],
        hit_gain=np.asarray(hit_g, dtype=np.float64)[order],
        n_relevant=n_relevant,
        ideal_query=np.asarray(ideal_q, dtype=np.int64),
        ideal_pos=np.asarray(ideal_p, dtype=np.int64),
        ideal_gain=np.asarray(ideal_g, dtype=np.float64),
        ideal_depth=ideal_depth,
        context_k=ctx,
    )


def _discount(rank0: IntArray) -> FloatArray:
    """Position discount 1/log2(rank + 1) for 1-based ranks, i.e. 1/log2(rank0 + 2)."""
    return 1.0 / np.log2(rank0.astype(np.float64) + 2.0)


def compute_metrics(batch: JudgedBatch, ks: Sequence[int]) -> dict[str, FloatArray]:
    """Every metric for every query of the batch: key -> float array of length n_queries.

    Definitions (per labelled query; NaN for unlabelled ones):

    * ``hit_rate@k``: Success@k, 1 if any relevant chunk is in the first k results.
    * ``recall@k``: relevant chunks in the first k results / |R|.
    * ``precision@k``: relevant chunks in the first k results / k, also when fewer
      than k results were returned (trec_eval ``P.k``).
    * ``ndcg@k``: DCG@k with linear gain (gain = grade) and discount 1/log2(rank+1),
      over the ideal DCG@k of *all* the query's relevant grades sorted descending
      (trec_eval ``ndcg_cut.k``; not the 2^g-1 gain, not a retrieved-only ideal).
    * ``mrr``: reciprocal rank, 1/rank of the first relevant result, 0 if none.
    * ``context_precision``: relevant among the first ``context_k`` results /
      ``context_k``; NaN when the query logged no ``context_k`` or 0.
    """
    cutoffs = validate_ks(ks)
    if cutoffs[-1] > batch.ideal_depth:
        raise ConfigError(f"k={cutoffs[-1]} exceeds the batch's ideal depth {batch.ideal_depth}")
    n = batch.n_queries
    labelled = batch.labelled
    n_rel = batch.n_relevant.astype(np.float64)
    hit_disc = batch.hit_gain * _discount(batch.hit_rank)
    ideal_disc = batch.ideal_gain * _discount(batch.ideal_pos)
    out: dict[str, FloatArray] = {}
    hits_at: dict[int, FloatArray] = {}
    for k in cutoffs:
        in_k = batch.hit_rank < k
        hits = np.bincount(batch.hit_query[in_k], minlength=n).astype(np.float64)
        hits_at[k] = hits
        dcg = np.bincount(batch.hit_query[in_k], weights=hit_disc[in_k], minlength=n)
        ideal_in_k = batch.ideal_pos < k
        idcg = np.bincount(
            batch.ideal_query[ideal_in_k], weights=ideal_disc[ideal_in_k], minlength=n
        )
        with np.errstate(divide="ignore", invalid="ignore"):
            out[f"recall@{k}"] = np.where(labelled, hits / n_rel, np.nan)
            out[f"ndcg@{k}"] = np.where(labelled, dcg / idcg, np.nan)
        out[f"hit_rate@{k}"] = np.where(labelled, (hits > 0).astype(np.float64), np.nan)
        out[f"precision@{k}"] = np.where(labelled, hits / k, np.nan)
    rr = np.zeros(n, dtype=np.float64)
    if batch.hit_query.size:
        first = np.ones(batch.hit_query.size, dtype=bool)
        first[1:] = batch.hit_query[1:] != batch.hit_query[:-1]
        rr[batch.hit_query[first]] = 1.0 / (batch.hit_rank[first] + 1.0)
    out["mrr"] = np.where(labelled, rr, np.nan)
    ctx = batch.context_k
    in_ctx = batch.hit_rank < ctx[batch.hit_query]
    ctx_hits = np.bincount(batch.hit_query[in_ctx], minlength=n).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        out["context_precision"] = np.where(labelled & (ctx > 0), ctx_hits / ctx, np.nan)
    return {key: out[key] for key in metric_keys(cutoffs)}
