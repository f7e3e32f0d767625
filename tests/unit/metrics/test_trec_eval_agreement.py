"""Every metric agrees with trec_eval (pytrec_eval) to 1e-9 on randomised data."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import pytrec_eval

from service.metrics.ir import compute_metrics, judge_batch
from service.offline.files import Run, load_judgments, load_run
from service.offline.golden import evaluate

KS = (1, 3, 5, 10, 20)
TREC_NAMES = {"hit_rate": "success", "recall": "recall", "precision": "P", "ndcg": "ndcg_cut"}
MEASURES = {f"{name}.{','.join(map(str, KS))}" for name in TREC_NAMES.values()} | {"recip_rank"}


def random_golden_set(
    seed: int, n_queries: int = 400
) -> tuple[dict[str, dict[str, int]], dict[str, list[str]]]:
    """Graded labels 0..3 (and a few negative grades), relevant chunks never retrieved,
    result lists shorter than k, empty result lists, unlabelled queries."""
    rng = random.Random(seed)
    judgments: dict[str, dict[str, int]] = {}
    rankings: dict[str, list[str]] = {}
    for q in range(n_queries):
        pool = [f"doc-{i}#{rng.randint(0, 3)}" for i in rng.sample(range(300), 120)]
        judged = rng.sample(pool, rng.randint(1, 25))
        judgments[f"q{q}"] = {c: rng.choice([0, 0, 1, 1, 2, 3, -1]) for c in judged}
        length = rng.choice([0, 1, 2, 4, 7, 15, 19, 25, 60, 100])
        rankings[f"q{q}"] = rng.sample(pool, length)
    return judgments, rankings


def trec_eval(
    judgments: dict[str, dict[str, int]], rankings: dict[str, list[str]]
) -> dict[str, dict[str, float]]:
    run = {
        q: {c: -float(rank) for rank, c in enumerate(docs, start=1)} for q, docs in rankings.items()
    }
    result: dict[str, dict[str, float]] = pytrec_eval.RelevanceEvaluator(
        judgments, MEASURES
    ).evaluate(run)
    return result


def assert_agrees(
    ours: dict[str, np.ndarray], ids: list[str], theirs: dict[str, dict[str, float]]
) -> int:
    compared = 0
    for row, query_id in enumerate(ids):
        reference = theirs[query_id]
        for family, trec_name in TREC_NAMES.items():
            for k in KS:
                assert ours[f"{family}@{k}"][row] == pytest.approx(
                    reference[f"{trec_name}_{k}"], abs=1e-9
                ), (query_id, family, k)
                compared += 1
        assert ours["mrr"][row] == pytest.approx(reference["recip_rank"], abs=1e-9)
    return compared


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_metric_core_matches_trec_eval(seed: int) -> None:
    judgments, rankings = random_golden_set(seed)
    ids = [q for q, grades in judgments.items() if any(g > 0 for g in grades.values())]
    assert 250 < len(ids) < len(judgments), "the data must mix labelled and unlabelled queries"
    batch = judge_batch(
        [rankings[q] for q in ids], [judgments[q] for q in ids], ideal_depth=max(KS)
    )
    ours = compute_metrics(batch, KS)
    compared = assert_agrees(ours, ids, trec_eval(judgments, rankings))
    assert compared == len(ids) * 20
    # the data exercises what it claims to: unretrieved relevant chunks, short lists, graded gains
    recall20 = ours["recall@20"]
    assert np.nanmin(recall20) == 0.0
    assert np.nanmax(recall20) == 1.0
    assert ((recall20 > 0) & (recall20 < 1)).any()
    assert (ours["ndcg@10"] != ours["ndcg@10"].round(0)).any()


def test_unlabelled_queries_have_no_value() -> None:
    judgments, rankings = random_golden_set(5, n_queries=200)
    ids = list(judgments)
    batch = judge_batch([rankings[q] for q in ids], [judgments[q] for q in ids])
    ours = compute_metrics(batch, KS)
    unlabelled = [i for i, q in enumerate(ids) if not any(g > 0 for g in judgments[q].values())]
    assert unlabelled
    for values in ours.values():
        assert np.isnan(values[unlabelled]).all()


def test_files_read_in_trec_eval_order_agree(tmp_path: Path) -> None:
    """TREC files with shuffled lines and tied scores: our loader orders as trec_eval does."""
    rng = random.Random(11)
    judgments, rankings = random_golden_set(9, n_queries=300)
    qrels_lines = [f"{q} 0 {c} {g}" for q, grades in judgments.items() for c, g in grades.items()]
    scores: dict[str, dict[str, float]] = {}
    run_lines = []
    for q, docs in rankings.items():
        scores[q] = {}
        for rank, c in enumerate(docs, start=1):
            score = float(rng.randint(0, 12)) / 4  # many ties, broken by chunk id like trec_eval
            scores[q][c] = score
            run_lines.append(f"{q} Q0 {c} {rank} {score} tag")
    rng.shuffle(run_lines)
    (tmp_path / "qrels.txt").write_text("\n".join(qrels_lines) + "\n")
    (tmp_path / "run.txt").write_text("\n".join(run_lines) + "\n")
    judged = load_judgments(tmp_path / "qrels.txt")
    run = load_run(tmp_path / "run.txt")
    assert judged == judgments
    ev = evaluate(judged, run, KS)
    theirs = pytrec_eval.RelevanceEvaluator(judgments, MEASURES).evaluate(scores)
    assert assert_agrees(ev.values, ev.query_ids, theirs) > 0


def test_labelled_query_missing_from_run_scores_zero() -> None:
    judgments = {"a": {"x": 1}, "b": {"y": 2}}
    ev = evaluate(judgments, Run(rankings={"a": ["x"]}), KS)
    assert ev.values["recall@5"].tolist() == [1.0, 0.0]
    assert ev.missing_from_run == 1
    assert ev.mean("recall@5") == 0.5
