"""Golden sets mined from the labels output: a simulated day replayed with
``--labels-out``, turned into a set by ``golden-set``, evaluates with ``evaluate`` to the
means of the monitor's own windows for the same queries; its version is stable and is
the one ``evaluate`` and ``compare`` print."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from service.commands.cli import main
from service.metrics.aggregates import merge
from service.offline.mine import Labelled, mine, normalise, set_version
from service.stream.windows import ClosedWindow
from tests import foreign_shapes as shapes

METRICS = ["hit_rate@1", "hit_rate@5", "recall@5", "recall@20", "precision@3", "ndcg@10", "mrr"]


def _day(tmp: Path) -> Path:
    events = tmp / "day.jsonl"
    start = "2026-12-01T00:00:00Z"
    assert main(["simulate", "--jsonl", str(events), "--start", start, "--hours", "6h",
                 "--queries-per-hour", "900", "--deploy-at", "3h", "--seed", "4"]) == 0  # fmt: skip
    return events


def _json(capsys: pytest.CaptureFixture[str]) -> Any:
    return json.loads(capsys.readouterr().out)


def test_a_mined_set_evaluates_to_the_means_of_the_windows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = _day(tmp_path)
    windows, labels = tmp_path / "windows.jsonl", tmp_path / "labels.jsonl"
    assert main(["replay", str(events), "--windows-out", str(windows),
                 "--labels-out", str(labels)]) == 0  # fmt: skip
    capsys.readouterr()
    published = [ClosedWindow.from_record(json.loads(line)) for line in windows.open()]
    records = [json.loads(line) for line in labels.open()]
    assert len(records) == sum(w.labelled for w in published) > 1000
    for retriever in ("hybrid-v7", "hybrid-v8"):
        out = tmp_path / retriever
        assert main(["golden-set", str(labels), "--out", str(out), "--retriever", retriever,
                     "--format", "json"]) == 0  # fmt: skip
        mined = _json(capsys)
        assert mined["queries"] == sum(w.labelled for w in published if w.retriever == retriever)
        assert main(["evaluate", "--qrels", mined["qrels"], "--run", mined["run"],
                     "--format", "json"]) == 0  # fmt: skip
        report = _json(capsys)
        assert report["golden_set_version"] == mined["version"]
        assert Path(mined["qrels"]).name == f"golden-{mined['version']}.jsonl"
        merged = merge(w.metrics for w in published if w.retriever == retriever)
        assert report["labelled"] == merged["mrr"].count
        for key in METRICS:
            assert report["metrics"][key] == pytest.approx(merged[key].mean, abs=1e-12), key


def test_the_version_is_stable_and_names_the_content(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = _day(tmp_path)
    labels = tmp_path / "labels.jsonl"
    versions = []
    for attempt in range(2):  # two replays and two minings of the same input
        assert main(["replay", str(events), "--labels-out", str(labels)]) == 0
        out = str(tmp_path / f"set{attempt}")
        args = ["golden-set", str(labels), "--out", out, "--min-grade", "2",
                "--per-segment", "40", "--seed", "3", "--format", "json"]  # fmt: skip
        capsys.readouterr()
        assert main(args) == 0
        versions.append(_json(capsys)["version"])
    assert versions[0] == versions[1]
    qrels = tmp_path / "set0" / f"golden-{versions[0]}.jsonl"
    assert set_version(qrels.read_bytes()) == versions[0]
    lines = [json.loads(line) for line in qrels.open()]
    per_segment: dict[str, int] = {}
    for line in lines:
        per_segment[line["segment"]] = per_segment.get(line["segment"], 0) + 1
        assert min(line["relevant"].values()) >= 2
    assert max(per_segment.values()) == 40
    assert main(["golden-set", str(labels), "--out", str(tmp_path / "other"), "--min-grade",
                 "2", "--per-segment", "40", "--seed", "4", "--format", "json"]) == 0  # fmt: skip
    assert _json(capsys)["version"] != versions[0]  # another sample, another version
    run = tmp_path / "set0" / f"logged-run-{versions[0]}.jsonl"
    assert main(["compare", "--qrels", str(qrels), str(run), str(run), "--resamples", "100"]) == 0
    assert f"golden set {qrels}, version {versions[0]}" in capsys.readouterr().out


def _labelled(query_id: str, query: str | None, segment: str = "kb", grade: int = 2) -> Labelled:
    return Labelled(query_id, segment, "v1", ["a", "b"], {"a": grade, "z": 1}, query)


def test_queries_are_deduplicated_by_normalised_text() -> None:
    assert normalise("  How do I\tconfigure  Feature 5?") == "how do i configure feature 5"
    assert normalise("ＨＯＷ do I configure feature 5!!") == "how do i configure feature 5"
    records = [
        _labelled("q1", "How do I configure feature 5?"),
        _labelled("q2", "how do i  CONFIGURE feature 5"),
        _labelled("q3", "reset password"),
        _labelled("q4", None),
        _labelled("q5", None),
        _labelled("q6", "weak only", grade=1),
    ]
    mined = mine(records, min_grade=2)
    lines = [json.loads(line) for line in mined.qrels.splitlines()]
    ids = sorted(line["query_id"] for line in lines)
    assert len(ids) == 4  # one of q1/q2, q3, q4, q5; q6 has no label of grade 2
    assert {"q3", "q4", "q5"} <= set(ids)
    assert all(line["relevant"] == {"a": 2} for line in lines)
    assert mine(reversed(records), min_grade=2).qrels == mined.qrels  # order of input: same set


def test_a_bad_labels_line_names_the_file_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "labels.jsonl"
    path.write_text(json.dumps({"query_id": "q", "segment": "s", "retriever": "r",
                                "results": ["a"], "labels": {"a": "high"}}) + "\n")  # fmt: skip
    assert main(["golden-set", str(path), "--out", str(tmp_path / "o")]) == 2
    assert f"{path}:1: field 'labels'" in capsys.readouterr().err


def test_query_text_is_in_the_labels_output_only_when_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from service.sim.simulator import SimulationConfig, generate, write_jsonl
    from service.times import HOUR_MS

    day = list(generate(SimulationConfig(seed=2, duration_ms=2 * HOUR_MS, queries_per_hour=600)))
    foreign, _ = shapes.to_ubi(day)
    events = tmp_path / "ubi.jsonl"
    write_jsonl(foreign, events)
    texts = []
    for flags in ([], ["--labels-query-text", "true"]):
        labels = tmp_path / "labels.jsonl"
        assert main(["replay", str(events), "--input-mapping", "ubi", "--labels-out",
                     str(labels), *flags]) == 0  # fmt: skip
        texts.append({json.loads(line).get("query") for line in labels.open()})
    assert texts[0] == {None}
    assert None not in texts[1]
    assert len(texts[1]) > 3
    capsys.readouterr()
