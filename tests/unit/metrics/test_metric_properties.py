"""Invariants of the metric core and of aggregate merging (hypothesis)."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from service.metrics.aggregates import Moments, aggregate, aggregate_groups, merge
from service.metrics.ir import compute_metrics, judge_batch

KS = (1, 2, 3, 5, 8, 13)
CHUNKS = [f"c{i}" for i in range(15)]

query = st.tuples(
    st.lists(st.sampled_from(CHUNKS), max_size=20),  # results, repeats allowed
    st.dictionaries(st.sampled_from(CHUNKS), st.integers(0, 3), max_size=10),
    st.one_of(st.none(), st.integers(0, 12)),  # context_k
)


def metrics_of(
    queries: list[tuple[list[str], dict[str, int], int | None]],
) -> dict[str, np.ndarray]:
    batch = judge_batch([q[0] for q in queries], [q[1] for q in queries], [q[2] for q in queries])
    return compute_metrics(batch, KS)


@settings(max_examples=300, deadline=None)
@given(st.lists(query, min_size=1, max_size=12))
def test_per_query_invariants(queries: list[tuple[list[str], dict[str, int], int | None]]) -> None:
    m = metrics_of(queries)
    for row, (results, grades, _) in enumerate(queries):
        labelled = any(g > 0 for g in grades.values())
        values = {key: float(v[row]) for key, v in m.items()}
        if not labelled:
            assert all(np.isnan(v) for v in values.values())
            continue
        for key, value in values.items():
            if not np.isnan(value):
                assert 0.0 <= value <= 1.0, key
        for small, large in pairwise(KS):
            assert values[f"recall@{small}"] <= values[f"recall@{large}"]
            assert values[f"hit_rate@{small}"] <= values[f"hit_rate@{large}"]
        for k in KS:
            assert values[f"recall@{k}"] <= values[f"hit_rate@{k}"]
            assert values[f"precision@{k}"] <= values[f"hit_rate@{k}"]
            assert values[f"ndcg@{k}"] <= values[f"hit_rate@{k}"]
        found_anywhere = any(grades.get(c, 0) > 0 for c in results)
        assert (values["mrr"] > 0) == found_anywhere
        assert (values["mrr"] == 1.0) == (values["hit_rate@1"] == 1.0)


@settings(max_examples=200, deadline=None)
@given(st.lists(query, min_size=1, max_size=8))
def test_repeated_chunk_keeps_its_first_position(
    queries: list[tuple[list[str], dict[str, int], int | None]],
) -> None:
    """Copies of already-listed chunks, appended after the originals, change no metric."""
    base = metrics_of(queries)
    padded = [(r + r, g, c) for r, g, c in queries]  # copies come after every original
    again = metrics_of(padded)
    for k in KS:
        for family in ("recall", "hit_rate", "precision", "ndcg"):
            np.testing.assert_array_equal(base[f"{family}@{k}"], again[f"{family}@{k}"])
    np.testing.assert_array_equal(base["mrr"], again["mrr"])


values_strategy = st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=0, max_size=40)


def agg(values: list[float]) -> dict[str, Moments]:
    return aggregate({"m": np.asarray(values, dtype=np.float64)})


@settings(max_examples=300, deadline=None)
@given(values_strategy, values_strategy, values_strategy)
def test_merge_is_associative_and_equals_the_concatenation(
    a: list[float], b: list[float], c: list[float]
) -> None:
    left = merge([merge([agg(a), agg(b)]), agg(c)])
    right = merge([agg(a), merge([agg(b), agg(c)])])
    assert left == right
    assert merge([agg(c), agg(a), agg(b)]) == left
    assert agg(a + b + c) == left
    if a + b + c:
        whole = left["m"]
        assert whole.count == len(a + b + c)
        assert whole.mean is not None
        assert abs(whole.mean - float(np.mean(a + b + c))) < 1e-12


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.floats(0.0, 1.0)), max_size=60))
def test_grouped_aggregation_equals_one_aggregate_per_group(pairs: list[tuple[int, float]]) -> None:
    groups = np.asarray([g for g, _ in pairs], dtype=np.int64)
    values = np.asarray([v for _, v in pairs], dtype=np.float64)
    grouped = aggregate_groups({"m": values}, groups, 5)
    for g in range(5):
        assert grouped[g] == agg([v for gg, v in pairs if gg == g])
