"""``check-input``: a sample with five kinds of mapping problem, each reported with its
count and an example; the exit status says whether anything maps."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from service.commands.cli import main
from service.mapping.check import check_records
from service.mapping.spec import load_mapping
from service.stream.topics import FEEDBACK, QUERIES

GOOD_QUERY = {
    "query_id": "q0",
    "timestamp": "2026-12-02T08:00:00Z",
    "query_response_hit_ids": ["a", "b", "c"],
    "query_attributes": {"retriever": "bm25"},
    "user_query": "toner",
}
GOOD_CLICK = {
    "action_name": "click",
    "query_id": "q0",
    "timestamp": "2026-12-02T08:00:04Z",
    "event_attributes": {"object": {"object_id": "b"}, "position": {"ordinal": {"index": 2}}},
}

# (topic, record changes, how many) -> the problem each gives (reason, path)
PROBLEMS = [
    (QUERIES, {"query_attributes": {}}, 7, ("missing_retriever", "query_attributes.retriever")),
    (QUERIES, {"query_attributes": "bm25"}, 3, ("invalid_retriever", "query_attributes.retriever")),
    (QUERIES, {"timestamp": "2026-13-02T08:00:00Z"}, 4, ("invalid_timestamp", "timestamp")),
    (
        QUERIES,
        {"query_response_hit_ids": ["a", 2.5]},
        2,
        ("invalid_results", "query_response_hit_ids"),
    ),
    (
        FEEDBACK,
        {"event_attributes": {"position": {}}},
        5,
        ("missing_chunk_id", "event_attributes.object.object_id"),
    ),
]


def sample() -> list[tuple[Any, str, Any]]:
    records: list[tuple[Any, str, Any]] = []
    for n in range(20):
        records.append((QUERIES, f"good-q{n}", {**GOOD_QUERY, "query_id": f"q{n}"}))
    for n in range(12):  # 8 of them join a query of the sample
        records.append(
            (FEEDBACK, f"good-f{n}", {**GOOD_CLICK, "query_id": f"q{n if n < 8 else 100 + n}"})
        )
    for n in range(6):
        records.append((FEEDBACK, f"view{n}", {**GOOD_CLICK, "action_name": "view"}))
    for topic, change, count, _ in PROBLEMS:
        base = GOOD_QUERY if topic == QUERIES else GOOD_CLICK
        for n in range(count):
            records.append((topic, f"bad-{n}", {**base, **change}))
    records.append((QUERIES, "raw", b"{not json"))
    return records


def test_every_problem_is_reported_with_its_count_and_an_example() -> None:
    report = check_records(sample(), load_mapping("ubi"))
    queries, feedback = report.topics[QUERIES], report.topics[FEEDBACK]
    assert (queries.read, queries.mapped, queries.skipped) == (20 + 7 + 3 + 4 + 2 + 1, 20, 0)
    assert (feedback.read, feedback.mapped, feedback.skipped) == (12 + 6 + 5, 12, 6)
    found = {(p.reason, p.path): p.count for t in (queries, feedback) for p in t.problems.values()}
    expected = {problem: count for _, _, count, problem in PROBLEMS}
    expected["invalid_json", ""] = 1
    assert found == expected
    example = queries.problems["missing_retriever", "query_attributes.retriever"]
    assert example.example_at == "bad-0"
    assert "nothing at 'query_attributes.retriever'" in example.example
    assert report.join_share == pytest.approx(8 / 12)
    text = report.render(("ubi_queries", "ubi_events"))
    assert "ubi_queries (queries): 37 records read, 20 map cleanly (54.1%)" in text
    assert "      7  missing_retriever at 'query_attributes.retriever' (18.9%)" in text
    assert "feedback whose query is in the sample: 66.7%" in text


def _write(path: Path, records: list[tuple[Any, str, Any]]) -> None:
    with path.open("w") as out:
        for topic, _, record in records:
            if isinstance(record, bytes):
                continue
            name = "queries" if topic == QUERIES else "feedback"
            out.write(json.dumps({"topic": name, "event": record}) + "\n")


def test_the_command_prints_json_and_exits_by_whether_anything_maps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "sample.jsonl"
    _write(path, sample())
    code = main(["check-input", "--input-mapping", "ubi", "--format", "json", str(path)])
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert report["maps"] is True
    assert report["topics"]["retrieval.queries"]["mapped"] == 20
    problems = report["topics"]["retrieval.feedback"]["problems"]
    assert [(p["reason"], p["count"]) for p in problems] == [("missing_chunk_id", 5)]
    # the contract's shapes (no mapping): nothing of this sample maps
    code = main(["check-input", str(path)])
    out = capsys.readouterr().out
    assert code == 2
    assert "nothing maps" in out
    assert "missing_retriever" in out


def test_the_sample_size_bounds_what_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "sample.jsonl"
    _write(path, sample())
    assert (
        main(
            [
                "check-input",
                "--input-mapping",
                "ubi",
                "--sample",
                "5",
                "--format",
                "json",
                str(path),
            ]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["topics"]["retrieval.queries"]["read"] == 5
    assert report["topics"]["retrieval.feedback"]["read"] == 5


def test_raw_records_are_told_apart_by_the_fields_they_have(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Lines that are the user's records as they are (not the replay format): each is
    read as a query or a feedback record by which mapping finds more of its fields."""
    path = tmp_path / "raw.jsonl"
    records = [
        GOOD_QUERY,
        {**GOOD_QUERY, "query_id": "q1", "query_attributes": {}},  # a query, still
        GOOD_CLICK,
        {**GOOD_CLICK, "action_name": "view"},
        {**GOOD_CLICK, "event_attributes": {}},  # a click without its object
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + "{broken\n")
    assert main(["check-input", "--input-mapping", "ubi", "--format", "json", str(path)]) == 0
    report = json.loads(capsys.readouterr().out)
    queries = report["topics"]["retrieval.queries"]
    feedback = report["topics"]["retrieval.feedback"]
    assert (queries["read"], queries["mapped"]) == (3, 1)
    assert sorted(p["reason"] for p in queries["problems"]) == ["invalid_json", "missing_retriever"]
    assert (feedback["read"], feedback["mapped"], feedback["skipped"]) == (3, 1, 1)
    assert [p["reason"] for p in feedback["problems"]] == ["missing_chunk_id"]
    assert main(["check-input", "--input-mapping", "ubi"]) == 2  # neither --kafka nor files


def test_records_are_read_as_the_service_reads_them() -> None:
    """A score of NaN (Python's json.dumps writes one) is valid to run and replay: the
    check counts such a record as mapping cleanly, not as bad JSON."""
    raw = json.dumps({**GOOD_QUERY, "query_response_hit_ids": ["a"], "score": float("nan")})
    assert "NaN" in raw
    report = check_records(
        [(QUERIES, "nan", raw.encode()), (QUERIES, "bad", b"{x")], load_mapping("ubi")
    )
    queries = report.topics[QUERIES]
    assert (queries.read, queries.mapped) == (2, 1)
    assert list(queries.problems) == [("invalid_json", "")]
