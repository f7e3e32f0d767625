"""Offline evaluation of golden sets with the same metric code as the streaming service.

* :func:`evaluate`: metrics of one run over a golden set (means with 95% intervals).
* :func:`compare`: paired comparison of two runs over the same golden set.
* :func:`evaluate_retriever`: the Python API, which calls a retriever object directly.

Golden queries with no relevant chunk are *negative cases* (questions the corpus
cannot answer): they stay out of the means, and the share of them for which the run
returned nothing is reported as ``negative_decline_rate``. Labelled golden queries
missing from the run score 0 on every metric. Run queries that are not in the
golden set are ignored and counted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from service.errors import ConfigError
from service.metrics.aggregates import MetricAggregates, aggregate
from service.metrics.ir import (
    DEFAULT_KS,
    FloatArray,
    compute_metrics,
    judge_batch,
    metric_keys,
    validate_ks,
)
from service.metrics.stats import holm_adjust, paired_randomisation_test, sample_estimate
from service.offline.files import Judgments, Run


@dataclass(frozen=True)
class Evaluation:
    """One run evaluated on a golden set."""

    ks: tuple[int, ...]
    query_ids: list[str]
    """Labelled golden queries, in golden-set order; rows of ``values``."""
    values: dict[str, FloatArray]
    """Per-query metric values (NaN where a metric does not apply)."""
    aggregates: MetricAggregates
    n_relevant: np.ndarray
    queries: int
    negatives: int
    negatives_declined: int
    missing_from_run: int
    unjudged_run_queries: int
    duplicate_results: int

    @property
    def labelled(self) -> int:
        return len(self.query_ids)

    @property
    def negative_decline_rate(self) -> float | None:
        """Share of negative cases for which the run returned nothing (None if no negatives)."""
        return self.negatives_declined / self.negatives if self.negatives else None

    def mean(self, key: str) -> float | None:
        moments = self.aggregates.get(key)
        return None if moments is None else moments.mean

    def best_possible_recall(self, k: int) -> float | None:
        """Mean recall@k of a perfect ranking: min(k, |R|) / |R| averaged over queries."""
        if not self.query_ids:
            return None
        return float(np.mean(np.minimum(k, self.n_relevant) / self.n_relevant))

    def to_dict(self) -> dict[str, Any]:
        """The ``--format json`` object."""
        intervals = {}
        for key in metric_keys(self.ks):
            moments = self.aggregates.get(key)
            estimate = None if moments is None else moments.estimate()
            intervals[key] = None if estimate is None else estimate.to_dict()
        return {
            "queries": self.queries,
            "labelled": self.labelled,
            "negatives": self.negatives,
            "negative_decline_rate": self.negative_decline_rate,
            "ks": list(self.ks),
            "metrics": {key: self.mean(key) for key in metric_keys(self.ks)},
            "intervals": intervals,
            "missing_from_run": self.missing_from_run,
            "unjudged_run_queries": self.unjudged_run_queries,
            "duplicate_results": self.duplicate_results,
        }


def _is_labelled(grades: Mapping[str, int]) -> bool:
    return any(grade > 0 for grade in grades.values())


def evaluate(judgments: Judgments, run: Run, ks: Sequence[int] = DEFAULT_KS) -> Evaluation:
    """Evaluate ``run`` against ``judgments`` at cutoffs ``ks``."""
    cutoffs = validate_ks(ks)
    labelled_ids = [q for q, grades in judgments.items() if _is_labelled(grades)]
    negative_ids = [q for q, grades in judgments.items() if not _is_labelled(grades)]
    batch = judge_batch(
        [run.rankings.get(q, []) for q in labelled_ids],
        [judgments[q] for q in labelled_ids],
        [run.context_k.get(q) for q in labelled_ids],
        ideal_depth=cutoffs[-1],
    )
    values = compute_metrics(batch, cutoffs)
    return Evaluation(
        ks=cutoffs,
        query_ids=labelled_ids,
        values=values,
        aggregates=aggregate(values),
        n_relevant=batch.n_relevant,
        queries=len(judgments),
        negatives=len(negative_ids),
        negatives_declined=sum(1 for q in negative_ids if not run.rankings.get(q)),
        missing_from_run=sum(1 for q in labelled_ids if q not in run.rankings),
        unjudged_run_queries=sum(1 for q in run.rankings if q not in judgments),
        duplicate_results=run.duplicate_results,
    )


@dataclass(frozen=True)
class PairedMetric:
    """One metric of a paired comparison; ``delta`` is candidate minus baseline."""

    metric: str
    n: int
    baseline: float | None
    candidate: float | None
    delta: float | None
    ci_low: float | None
    ci_high: float | None
    p_value: float
    p_adjusted: float
    verdict: str


@dataclass(frozen=True)
class PairedComparison:
    """Paired comparison of two runs on the same labelled golden queries."""

    baseline_name: str
    candidate_name: str
    queries: int
    alpha: float
    metrics: list[PairedMetric]

    @property
    def verdict(self) -> str:
        worse = [m.metric for m in self.metrics if m.verdict == "worse"]
        better = [m.metric for m in self.metrics if m.verdict == "better"]
        a, b, n = self.baseline_name, self.candidate_name, self.queries
        basis = f"{n} labelled queries, Holm-adjusted p < {self.alpha:g}"
        if worse and better:
            return (
                f"mixed: {b} is worse than {a} on {', '.join(worse)} "
                f"and better on {', '.join(better)} ({basis})"
            )
        if worse:
            return f"{b} is WORSE than {a}: significant drops in {', '.join(worse)} ({basis})"
        if better:
            return f"{b} is better than {a}: significant gains in {', '.join(better)} ({basis})"
        return f"no significant difference between {a} and {b} ({n} labelled queries)"

    def to_dict(self) -> dict[str, Any]:
        return {
            "baseline": self.baseline_name,
            "candidate": self.candidate_name,
            "queries": self.queries,
            "alpha": self.alpha,
            "verdict": self.verdict,
            "metrics": {
                m.metric: {
                    "n": m.n,
                    "baseline": m.baseline,
                    "candidate": m.candidate,
                    "delta": m.delta,
                    "ci_low": m.ci_low,
                    "ci_high": m.ci_high,
                    "p_value": m.p_value,
                    "p_adjusted": m.p_adjusted,
                    "verdict": m.verdict,
                }
                for m in self.metrics
            },
        }


def compare(
    judgments: Judgments,
    baseline: Run,
    candidate: Run,
    ks: Sequence[int] = DEFAULT_KS,
    *,
    names: tuple[str, str] = ("A", "B"),
    n_resamples: int = 10_000,
    seed: int = 0,
    alpha: float = 0.05,
) -> PairedComparison:
    """Paired sign-flip randomisation test per metric, Holm-corrected across metrics."""
    if not 0.0 < alpha < 1.0:
        raise ConfigError(f"alpha must lie in (0, 1), got {alpha!r}")
    if n_resamples < 1:
        raise ConfigError(f"resamples must be a positive integer, got {n_resamples!r}")
    ev_a = evaluate(judgments, baseline, ks)
    ev_b = evaluate(judgments, candidate, ks)
    rows: list[tuple[str, int, float | None, float | None, float | None, Any, float]] = []
    for key in metric_keys(ev_a.ks):
        a, b = ev_a.values[key], ev_b.values[key]
        paired = ~(np.isnan(a) | np.isnan(b))
        a, b = a[paired], b[paired]
        if a.size == 0:
            rows.append((key, 0, None, None, None, None, 1.0))
            continue
        diff = sample_estimate(b - a, bounds=(-1.0, 1.0))
        p_value = paired_randomisation_test(a, b, n_resamples=n_resamples, seed=seed)
        rows.append((key, a.size, float(a.mean()), float(b.mean()), diff.mean, diff, p_value))
    adjusted = holm_adjust([row[6] for row in rows])
    metrics = []
    for (key, n, mean_a, mean_b, delta, diff, p_value), p_adj in zip(rows, adjusted, strict=True):
        verdict = "no difference"
        if delta is not None and p_adj < alpha and delta != 0.0:
            verdict = "better" if delta > 0 else "worse"
        metrics.append(
            PairedMetric(
                metric=key,
                n=n,
                baseline=mean_a,
                candidate=mean_b,
                delta=delta,
                ci_low=None if diff is None else diff.ci_low,
                ci_high=None if diff is None else diff.ci_high,
                p_value=p_value,
                p_adjusted=p_adj,
                verdict=verdict,
            )
        )
    return PairedComparison(names[0], names[1], ev_a.labelled, alpha, metrics)


class Retriever(Protocol):
    """Anything with ``search(query, top_k=...)`` returning hits that carry an ``id``."""

    def search(self, query: str, top_k: int) -> Sequence[Any]: ...


def _hit_id(hit: Any, where: str) -> str:
    if isinstance(hit, str):
        return hit
    if isinstance(hit, Mapping) and "id" in hit:
        return str(hit["id"])
    hit_id = getattr(hit, "id", None)
    if hit_id is None:
        raise ConfigError(f"{where}: a search hit has no 'id' (got {hit!r:.80})")
    return str(hit_id)


def evaluate_retriever(
    test_set: Sequence[Mapping[str, Any]],
    retriever: Retriever,
    ks: Sequence[int] = DEFAULT_KS,
) -> Evaluation:
    """Run every golden query through ``retriever.search`` and evaluate the results.

    ``test_set`` is a list of ``{"query": str, "relevant_chunk_ids": [...]}`` (an optional
    ``query_id``; otherwise the position is the id). Each search asks for ``max(ks)`` hits.
    """
    cutoffs = validate_ks(ks)
    judgments: Judgments = {}
    run = Run(rankings={})
    for index, item in enumerate(test_set):
        where = f"test_set[{index}]"
        if not isinstance(item, Mapping) or not isinstance(item.get("query"), str):
            raise ConfigError(f"{where}: needs a 'query' string and 'relevant_chunk_ids'")
        relevant = item.get("relevant_chunk_ids")
        if not isinstance(relevant, list | tuple) or not all(isinstance(c, str) for c in relevant):
            raise ConfigError(f"{where}: 'relevant_chunk_ids' must be a list of chunk id strings")
        query_id = str(item.get("query_id", index))
        if query_id in judgments:
            raise ConfigError(f"{where}: query_id {query_id!r} appears twice in the test set")
        judgments[query_id] = dict.fromkeys(relevant, 1)
        hits = retriever.search(item["query"], top_k=cutoffs[-1])
        run.rankings[query_id] = [_hit_id(hit, where) for hit in hits]
    return evaluate(judgments, run, cutoffs)
