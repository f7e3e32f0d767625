"""The true metric values of simulated queries: the service's metric code on the ground truth."""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.errors import ConfigError
from service.metrics.ir import metric_keys
from service.sim.simulator import HYBRID_V8, SimQuery, SimulationConfig, simulate_queries
from service.sim.truth import ALL_SEGMENTS, metric_cutoffs, summarize, true_metrics, true_quality
from service.times import HOUR_MS

RUN = SimulationConfig(duration_ms=HOUR_MS, after=HYBRID_V8, quality_drop=0.1)
KEYS = metric_keys((1, 5, 10))


@pytest.fixture(scope="module")
def queries() -> list[SimQuery]:
    return list(simulate_queries(RUN))


def test_each_querys_true_values_follow_the_definitions(queries: list[SimQuery]) -> None:
    values = true_metrics(queries, KEYS)
    assert set(values) == set(KEYS)
    for i, query in enumerate(queries[:300]):
        rel = query.relevant
        in_5 = sum(chunk in rel for chunk in query.results[:5])
        assert values["recall@5"][i] == pytest.approx(in_5 / len(rel))
        assert values["hit_rate@5"][i] == (in_5 > 0)
        assert values["precision@5"][i] == pytest.approx(in_5 / 5)
        ranks = [r for r, chunk in enumerate(query.results, 1) if chunk in rel]
        assert values["mrr"][i] == pytest.approx(1 / ranks[0] if ranks else 0.0)
        in_ctx = sum(chunk in rel for chunk in query.results[: query.context_k])
        assert values["context_precision"][i] == pytest.approx(in_ctx / query.context_k)
        dcg = sum(
            rel[c] / math.log2(r + 1) for r, c in enumerate(query.results[:10], 1) if c in rel
        )
        ideal = sorted(rel.values(), reverse=True)[:10]
        idcg = sum(g / math.log2(r + 1) for r, g in enumerate(ideal, 1))
        assert values["ndcg@10"][i] == pytest.approx(dcg / idcg)
    assert not any(np.isnan(v).any() for v in values.values())  # every query is labelled


def test_true_quality_per_retriever_and_segment(queries: list[SimQuery]) -> None:
    quality = true_quality(queries, ("recall@5", "hit_rate@5", "mrr"))
    summary = summarize(queries, k=5)
    for retriever, truth in summary.items():
        pooled = quality[retriever, ALL_SEGMENTS]
        assert pooled.queries == truth.queries
        assert pooled.means["recall@5"] == pytest.approx(truth.recall)
        assert pooled.means["hit_rate@5"] == pytest.approx(truth.hit_rate)
        segments = {s: q for (r, s), q in quality.items() if r == retriever and s != ALL_SEGMENTS}
        assert set(segments) == {"support-kb", "docs", "billing"}
        assert sum(q.queries for q in segments.values()) == truth.queries
        weighted = sum(q.means["mrr"] * q.queries for q in segments.values()) / truth.queries
        assert weighted == pytest.approx(pooled.means["mrr"])
    before, after = (quality[p.name, ALL_SEGMENTS] for p in (RUN.before, HYBRID_V8))
    assert after.means["recall@5"] < before.means["recall@5"] - 0.05  # the 10-point drop


def test_context_precision_is_nan_without_a_context() -> None:
    config = SimulationConfig(duration_ms=HOUR_MS // 12, context_k=0)
    quality = true_quality(simulate_queries(config), ("context_precision", "recall@1"))
    pooled = quality[config.before.name, ALL_SEGMENTS]
    assert math.isnan(pooled.means["context_precision"])
    assert 0.0 < pooled.means["recall@1"] < 1.0


def test_metric_keys_are_checked() -> None:
    assert metric_cutoffs(["recall@5", "ndcg@10", "mrr"]) == (5, 10)
    assert metric_cutoffs(["mrr"]) == (1,)
    for bad in ("recall@0", "recall@x", "recall", "map@5", "hit_rate@05"):
        with pytest.raises(ConfigError, match="unknown metric key"):
            metric_cutoffs([bad])
