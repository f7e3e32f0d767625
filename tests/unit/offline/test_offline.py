"""evaluate / compare on the shipped example, negatives, the Python API, the command line."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from service.commands.cli import main
from service.errors import ConfigError
from service.offline.files import Run, load_judgments, load_run
from service.offline.golden import compare, evaluate, evaluate_retriever
from service.offline.report import find_vs_rank

GOLDEN = Path(__file__).resolve().parents[3] / "examples" / "golden"
QRELS = GOLDEN / "qrels.jsonl"
RUN_A = GOLDEN / "run_hybrid_v7.jsonl"
RUN_B = GOLDEN / "run_dense_v8.jsonl"


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main([*args, "--format", "json"]) == 0
    result: dict[str, Any] = json.loads(capsys.readouterr().out)
    return result


def test_evaluate_json_reports_negatives_as_the_contract_says(
    capsys: pytest.CaptureFixture[str],
) -> None:
    report = run_json(capsys, "evaluate", "--qrels", str(QRELS), "--run", str(RUN_A))
    golden = [json.loads(line) for line in QRELS.read_text().splitlines()]
    run = {r["query_id"]: r["results"] for r in map(json.loads, RUN_A.read_text().splitlines())}
    negatives = [g["query_id"] for g in golden if not g["relevant_chunk_ids"]]
    declined = [q for q in negatives if not run.get(q)]
    assert report["queries"] == len(golden)
    assert report["negatives"] == len(negatives) > 0
    assert report["labelled"] == len(golden) - len(negatives)
    assert report["negative_decline_rate"] == pytest.approx(len(declined) / len(negatives))
    # hit_rate@20 recomputed by hand from the files
    labelled = [g for g in golden if g["relevant_chunk_ids"]]
    hits = [
        any(c in run.get(g["query_id"], [])[:20] for c in g["relevant_chunk_ids"]) for g in labelled
    ]
    assert report["metrics"]["hit_rate@20"] == pytest.approx(sum(hits) / len(hits), abs=1e-15)
    assert set(report["metrics"]) >= {"hit_rate@5", "recall@5", "precision@5", "ndcg@5", "mrr"}
    interval = report["intervals"]["recall@5"]
    assert interval["ci_low"] < report["metrics"]["recall@5"] < interval["ci_high"]
    assert report["reading"]["kind"] == "ranking"


def test_trec_and_jsonl_forms_give_the_same_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    jsonl = run_json(capsys, "evaluate", "--qrels", str(QRELS), "--run", str(RUN_A))
    trec = run_json(
        capsys,
        "evaluate",
        "--qrels",
        str(GOLDEN / "qrels.txt"),
        "--run",
        str(GOLDEN / "run_hybrid_v7.txt"),
    )
    for key in ("hit_rate@5", "recall@10", "ndcg@20", "mrr"):
        assert trec["metrics"][key] == jsonl["metrics"][key]
    assert trec["negatives"] == 0  # TREC qrels cannot list a question with no judged chunk


def test_table_reads_metrics_down_and_k_across(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["evaluate", "--qrels", str(QRELS), "--run", str(RUN_A), "-k", "1,5,20"]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("metric"))
    assert header.split() == ["metric", "@1", "@5", "@20"]
    recall_row = next(line for line in out.splitlines() if line.startswith("recall "))
    ev = evaluate(load_judgments(QRELS), load_run(RUN_A), (1, 5, 20))
    assert f"{ev.mean('recall@20'):.3f}" in recall_row
    assert "ranking problem" in out
    assert "negative cases" in out


def test_reading_says_finding_problem_when_recall_is_low_everywhere() -> None:
    judgments = {f"q{i}": {f"rel{i}-{j}": 1 for j in range(2)} for i in range(50)}
    run = Run(rankings={f"q{i}": [f"rel{i}-0"] if i % 5 == 0 else ["noise"] for i in range(50)})
    reading = find_vs_rank(evaluate(judgments, run))
    assert reading.kind == "finding"
    assert "chunking" in reading.text


def test_compare_detects_the_worse_run_and_not_an_identical_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    result = run_json(
        capsys, "compare", "--qrels", str(QRELS), str(RUN_A), str(RUN_B), "--resamples", "2000"
    )
    assert "WORSE" in result["verdict"]
    recall = result["metrics"]["recall@20"]
    assert recall["delta"] == pytest.approx(recall["candidate"] - recall["baseline"])
    assert recall["verdict"] == "worse"
    assert recall["p_adjusted"] >= recall["p_value"]
    assert recall["ci_high"] < 0
    same = run_json(
        capsys, "compare", "--qrels", str(QRELS), str(RUN_A), str(RUN_A), "--resamples", "500"
    )
    assert same["verdict"].startswith("no significant difference")
    assert all(m["p_value"] == 1.0 and m["delta"] == 0.0 for m in same["metrics"].values())


def test_compare_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["compare", "--qrels", str(QRELS), str(RUN_A), str(RUN_B), "--resamples", "500"]) == 0
    )
    out = capsys.readouterr().out
    assert "Holm-corrected over 22 metrics" in out
    assert out.strip().splitlines()[-1].startswith("Verdict:")


def test_compare_rejects_bad_parameters() -> None:
    judgments = load_judgments(QRELS)
    run = load_run(RUN_A)
    with pytest.raises(ConfigError, match="alpha"):
        compare(judgments, run, run, alpha=1.5)


@dataclass
class Hit:
    id: str
    score: float


class KeywordRetriever:
    """A real (tiny) retriever: ranks chunks by words shared with the query."""

    def __init__(self, corpus: dict[str, str]) -> None:
        self.corpus = corpus
        self.calls: list[int] = []

    def search(self, query: str, top_k: int) -> list[Hit]:
        self.calls.append(top_k)
        words = set(query.lower().split())
        scored = [
            (len(words & set(text.lower().split())), cid) for cid, text in self.corpus.items()
        ]
        ranked = sorted((s, cid) for s, cid in scored if s > 0)[::-1]
        return [Hit(cid, float(s)) for s, cid in ranked[:top_k]]


CORPUS = {
    "kb-1#0": "reset your password from the login page",
    "kb-1#1": "password rules and expiry",
    "kb-2#0": "download an invoice as pdf",
    "kb-3#0": "api rate limits per token",
    "kb-4#0": "export data to csv",
}
TEST_SET = [
    {"query": "how to reset password", "relevant_chunk_ids": ["kb-1#0"]},
    {"query": "invoice download", "relevant_chunk_ids": ["kb-2#0"]},
    {"query": "rate limits for the api", "relevant_chunk_ids": ["kb-3#0", "kb-9#9"]},
    {"query": "quantum teleportation", "relevant_chunk_ids": []},
]


def test_evaluate_retriever_python_api() -> None:
    retriever = KeywordRetriever(CORPUS)
    ev = evaluate_retriever(TEST_SET, retriever, ks=(1, 3))
    assert retriever.calls == [3, 3, 3, 3]
    assert (ev.labelled, ev.negatives, ev.negative_decline_rate) == (3, 1, 1.0)
    assert ev.mean("hit_rate@1") == 1.0
    assert ev.mean("recall@3") == pytest.approx((1 + 1 + 0.5) / 3)
    # the same results written as a run give the same numbers
    rankings = {
        str(i): [h.id for h in retriever.search(t["query"], 3)] for i, t in enumerate(TEST_SET)
    }
    judgments = {str(i): dict.fromkeys(t["relevant_chunk_ids"], 1) for i, t in enumerate(TEST_SET)}
    assert evaluate(judgments, Run(rankings), (1, 3)).aggregates == ev.aggregates


def test_evaluate_retriever_accepts_dict_hits_and_rejects_bad_items() -> None:
    class DictRetriever:
        def search(self, query: str, top_k: int) -> list[dict[str, str]]:
            return [{"id": "kb-1#0"}][:top_k]

    ev = evaluate_retriever([{"query": "x", "relevant_chunk_ids": ["kb-1#0"]}], DictRetriever())
    assert ev.mean("mrr") == 1.0
    with pytest.raises(ConfigError, match=r"test_set\[0\].*relevant_chunk_ids"):
        evaluate_retriever([{"query": "x", "relevant_chunk_ids": "kb-1#0"}], DictRetriever())
    with pytest.raises(ConfigError, match=r"test_set\[1\].*query"):
        evaluate_retriever([{"query": "x", "relevant_chunk_ids": []}, {"q": "y"}], DictRetriever())


def test_module_entry_point_and_exit_codes(tmp_path: Path) -> None:
    ok = subprocess.run(
        [
            sys.executable,
            "-m",
            "service",
            "evaluate",
            "--qrels",
            str(QRELS),
            "--run",
            str(RUN_A),
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert ok.returncode == 0
    assert json.loads(ok.stdout)["labelled"] > 0
    bad = tmp_path / "bad.txt"
    bad.write_text("q1 0 a\n")
    failed = subprocess.run(
        [sys.executable, "-m", "service", "evaluate", "--qrels", str(bad), "--run", str(RUN_A)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert failed.returncode == 2
    assert f"{bad}:1:" in failed.stderr
    assert "Traceback" not in failed.stderr
