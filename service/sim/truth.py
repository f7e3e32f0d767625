"""The true quality of simulated queries: what a perfect monitor would report.

The simulator knows each query's ground truth (``SimQuery.relevant``), so the true value of
every metric is known: the service's own metric code (:mod:`service.metrics.ir`) with R =
all of the query's truly relevant chunks, retrieved or not, and ranks from its results.
Live labels see less (only what was shown and looked at) and an audit judge may err; tests
and benchmarks compare what the monitor estimates against these values. Every simulated
query has 1..4 relevant chunks, so every one is labelled and answerable.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from service.errors import ConfigError
from service.metrics.ir import FloatArray, MetricKey, compute_metrics, judge_batch, metric_keys
from service.sim.simulator import SimQuery

ALL_SEGMENTS = "*"
"""The segment name of a retriever's queries over every segment (as in the contract)."""


def metric_cutoffs(keys: Iterable[MetricKey]) -> tuple[int, ...]:
    """The cutoffs k that ``keys`` name (``recall@5`` -> 5); ConfigError on an unknown key."""
    wanted = tuple(keys)
    ks: set[int] = set()
    for key in wanted:
        _, at, k = key.partition("@")
        if at:
            if not k.isdigit() or int(k) < 1:
                raise ConfigError(f"unknown metric key {key!r}: the cutoff must be k >= 1")
            ks.add(int(k))
    cutoffs = tuple(sorted(ks)) or (1,)  # the cutoff-free metrics need one to be computed
    unknown = [key for key in wanted if key not in metric_keys(cutoffs)]
    if unknown:
        raise ConfigError(f"unknown metric keys {unknown!r}; e.g. {metric_keys((5,))!r}")
    return cutoffs


def true_metrics(
    queries: Sequence[SimQuery], keys: Sequence[MetricKey]
) -> dict[MetricKey, FloatArray]:
    """Each query's true value of each metric key, one array per key in query order.

    R is the query's truly relevant chunks with their true grades; ``context_precision``
    is NaN for a query that logged ``context_k`` 0 (as in the service).
    """
    cutoffs = metric_cutoffs(keys)
    batch = judge_batch(
        [query.results for query in queries],
        [query.relevant for query in queries],
        [query.context_k for query in queries],
    )
    values = compute_metrics(batch, cutoffs)
    return {key: values[key] for key in keys}


@dataclass(frozen=True, slots=True)
class TrueQuality:
    """The true quality of one retriever in one segment (or ``*``) over simulated queries."""

    queries: int
    means: Mapping[MetricKey, float]
    """Metric key -> the mean true value over the queries where it applies (NaN if none)."""


def true_quality(
    queries: Iterable[SimQuery], keys: Sequence[MetricKey]
) -> dict[tuple[str, str], TrueQuality]:
    """(retriever, segment) -> the true mean of each metric key over its queries; each
    retriever also has ``(retriever, "*")`` over all its segments. The estimand that audited
    estimates aim at: every simulated query is answerable, so the mean is over all of them."""
    rows = list(queries)
    values = true_metrics(rows, keys)
    slices: dict[tuple[str, str], list[int]] = {}
    for index, query in enumerate(rows):
        slices.setdefault((query.retriever, query.segment), []).append(index)
        slices.setdefault((query.retriever, ALL_SEGMENTS), []).append(index)
    out: dict[tuple[str, str], TrueQuality] = {}
    for name, indices in sorted(slices.items()):
        means: dict[MetricKey, float] = {}
        for key in keys:
            applies = values[key][indices]
            applies = applies[~np.isnan(applies)]
            means[key] = float(applies.mean()) if applies.size else math.nan
        out[name] = TrueQuality(len(indices), means)
    return out


@dataclass(frozen=True, slots=True)
class QualitySummary:
    """True (ground-truth) quality of one retriever version over simulated queries."""

    queries: int
    hit_rate: float
    """Share of queries with a relevant chunk in the first k results."""
    recall: float
    """Mean over queries of relevant chunks in the first k / all relevant chunks."""


def summarize(queries: Iterable[SimQuery], k: int = 5) -> dict[str, QualitySummary]:
    """Ground-truth hit rate@k and recall@k per retriever version (what a monitor should see)."""
    totals: dict[str, list[float]] = {}
    for query in queries:
        found = sum(1 for chunk in query.results[:k] if chunk in query.relevant)
        row = totals.setdefault(query.retriever, [0, 0.0, 0.0])
        row[0] += 1
        row[1] += found > 0
        row[2] += found / len(query.relevant)
    return {
        name: QualitySummary(int(n), hits / n, recall / n)
        for name, (n, hits, recall) in totals.items()
    }
