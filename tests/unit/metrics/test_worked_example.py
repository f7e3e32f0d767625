"""The worked example of docs/metrics.md: [no, yes, no, yes, yes, no, no, no, yes, no], |R| = 6."""

from __future__ import annotations

from math import log2

import pytest

from service.offline.files import Run
from service.offline.golden import evaluate

PATTERN = [False, True, False, True, True, False, False, False, True, False]
KS = (1, 2, 3, 5, 10)


@pytest.fixture(scope="module")
def metrics() -> dict[str, float | None]:
    ranking = [f"{'rel' if rel else 'non'}-{i}" for i, rel in enumerate(PATTERN)]
    relevant = {c: 1 for c in ranking if c.startswith("rel")}
    relevant |= {"rel-unretrieved-a": 1, "rel-unretrieved-b": 1}  # 6 relevant in the corpus
    ev = evaluate({"q": relevant}, Run(rankings={"q": ranking}), KS)
    return ev.to_dict()["metrics"]


def dcg(gains: list[int]) -> float:
    return sum(g / log2(rank + 1) for rank, g in enumerate(gains, start=1))


@pytest.mark.parametrize(
    ("k", "hit", "recall", "precision"),
    [
        (1, 0, 0, 0),
        (2, 1, 1 / 6, 1 / 2),
        (3, 1, 1 / 6, 1 / 3),
        (5, 1, 3 / 6, 3 / 5),
        (10, 1, 4 / 6, 4 / 10),
    ],
)
def test_cutoff_metrics(
    metrics: dict[str, float | None], k: int, hit: float, recall: float, precision: float
) -> None:
    assert metrics[f"hit_rate@{k}"] == hit
    assert metrics[f"recall@{k}"] == pytest.approx(recall, abs=1e-12)
    assert metrics[f"precision@{k}"] == pytest.approx(precision, abs=1e-12)


@pytest.mark.parametrize("k", KS)
def test_ndcg_uses_all_six_relevant_chunks_in_the_ideal(
    metrics: dict[str, float | None], k: int
) -> None:
    gains = [int(rel) for rel in PATTERN]
    expected = dcg(gains[:k]) / dcg([1] * min(k, 6))
    assert metrics[f"ndcg@{k}"] == pytest.approx(expected, abs=1e-12)


def test_ndcg5_values_quoted_in_the_docs(metrics: dict[str, float | None]) -> None:
    gains = [int(rel) for rel in PATTERN]
    ours = metrics["ndcg@5"]
    assert ours == pytest.approx(0.4913, abs=5e-5)
    # an ideal built from the retrieved list only (its own top 5 re-sorted) would say 0.6797
    retrieved_only = dcg(gains[:5]) / dcg(sorted(gains[:5], reverse=True))
    assert retrieved_only == pytest.approx(0.6797, abs=5e-5)
    assert ours < retrieved_only


def test_mrr(metrics: dict[str, float | None]) -> None:
    assert metrics["mrr"] == 0.5
