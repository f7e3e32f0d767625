"""Malformed input files: an error naming file, line and field, and a non-zero exit."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.commands.cli import EXIT_BAD_INPUT, main

GOOD_QRELS = (
    '{"query_id": "q1", "relevant": {"a": 2}}\n{"query_id": "q2", "relevant_chunk_ids": ["b"]}\n'
)
GOOD_RUN = '{"query_id": "q1", "results": ["a", "x"]}\n{"query_id": "q2", "results": ["b"]}\n'
GOOD_TREC_QRELS = "q1 0 a 2\nq2 0 b 1\n"
GOOD_TREC_RUN = "q1 Q0 a 1 2.0 t\nq1 Q0 x 2 1.0 t\nq2 Q0 b 1 5 t\n"

# (which file is bad, its content, the line, the field, a fragment of the explanation)
CASES = [
    ("qrels", "q1 0 a 2\nq2 0 b\n", 2, "(line)", "expected 4 columns"),
    ("qrels", "q1 0 a 2\nq2 0 b high\n", 2, "grade", "expected an integer, got 'high'"),
    (
        "qrels",
        "q1 0 a 2\nq1 0 a 1\n",
        2,
        "chunk_id",
        "judged twice for query 'q1' (first at line 1)",
    ),
    (
        "qrels",
        '{"query_id": "q1", "relevant": {"a": 2}}\n{"query_id": "q2"\n',
        2,
        "(line)",
        "not valid JSON",
    ),
    (
        "qrels",
        '{"query_id": "q1", "relevant": {"a": 2}}\n["q2", "b"]\n',
        2,
        "(line)",
        "JSON object",
    ),
    ("qrels", '{"relevant": {"a": 2}}\n', 1, "query_id", "Field required"),
    ("qrels", '{"query_id": "q1", "relevant": {"a": "high"}}\n', 1, "relevant.a", "valid integer"),
    ("qrels", '{"query_id": "q1"}\n', 1, "relevant", "exactly one of"),
    (
        "qrels",
        '{"query_id": "q1", "relevant_chunk_ids": "a"}\n',
        1,
        "relevant_chunk_ids",
        "valid array",
    ),
    (
        "qrels",
        GOOD_QRELS + '{"query_id": "q1", "relevant_chunk_ids": ["c"]}\n',
        3,
        "query_id",
        "already appeared at line 1",
    ),
    ("run", "q1 Q0 a 1 2.0\n", 1, "(line)", "expected 6 columns"),
    ("run", "q1 Q0 a 1 2.0 t\nq1 Q0 b first 1.0 t\n", 2, "rank", "expected an integer"),
    ("run", "q1 Q0 a 1 2.0 t\nq1 Q0 b 2 nan t\n", 2, "score", "finite number"),
    ("run", "q1 Q0 a 1 2.0 t\nq1 Q0 b 2 much t\n", 2, "score", "finite number"),
    ("run", '{"query_id": "q1", "results": "a b"}\n', 1, "results", "valid array"),
    ("run", '{"query_id": "q1", "results": ["a", 7]}\n', 1, "results.1", "string"),
    ("run", '{"query_id": "q1", "results": [""]}\n', 1, "results.0", "at least 1 character"),
    (
        "run",
        '{"query_id": "q1", "results": ["a"], "context_k": -2}\n',
        1,
        "context_k",
        "greater than or equal to 0",
    ),
    ("run", '{"query_id": ["q1"], "results": ["a"]}\n', 1, "query_id", "string"),
]


def write(tmp_path: Path, name: str, content: str | bytes) -> Path:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


@pytest.mark.parametrize(("bad", "content", "line", "field", "fragment"), CASES)
def test_bad_line_is_named(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    bad: str,
    content: str,
    line: int,
    field: str,
    fragment: str,
) -> None:
    jsonl = content.lstrip().startswith("{") or content.lstrip().startswith("[")
    qrels = write(tmp_path, "qrels.in", content if bad == "qrels" else GOOD_TREC_QRELS)
    run = write(
        tmp_path, "run.in", content if bad == "run" else (GOOD_RUN if jsonl else GOOD_TREC_RUN)
    )
    code = main(["evaluate", "--qrels", str(qrels), "--run", str(run)])
    err = capsys.readouterr().err
    assert code == EXIT_BAD_INPUT
    bad_path = qrels if bad == "qrels" else run
    assert f"{bad_path}:{line}: field {field!r}:" in err
    assert fragment in err


def test_not_utf8_names_the_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    qrels = write(tmp_path, "qrels.txt", b"q1 0 a 1\nq2 0 \xff\xfe 1\n")
    run = write(tmp_path, "run.txt", GOOD_TREC_RUN)
    assert main(["evaluate", "--qrels", str(qrels), "--run", str(run)]) == EXIT_BAD_INPUT
    assert f"{qrels}:2: field '(line)': not valid UTF-8" in capsys.readouterr().err


@pytest.mark.parametrize("content", ["", "\n  \n"])
def test_empty_file(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str) -> None:
    qrels = write(tmp_path, "qrels.txt", content)
    run = write(tmp_path, "run.txt", GOOD_TREC_RUN)
    assert main(["evaluate", "--qrels", str(qrels), "--run", str(run)]) == EXIT_BAD_INPUT
    assert "the file is empty" in capsys.readouterr().err


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = write(tmp_path, "run.txt", GOOD_TREC_RUN)
    code = main(["evaluate", "--qrels", str(tmp_path / "nope.txt"), "--run", str(run)])
    assert code == EXIT_BAD_INPUT
    assert "nope.txt: field '(file)': cannot read it: No such file" in capsys.readouterr().err


@pytest.mark.parametrize("ks", ["-1", "0", "1,x", "", "3,,5"])
def test_bad_cutoffs_are_rejected(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], ks: str
) -> None:
    qrels = write(tmp_path, "qrels.txt", GOOD_TREC_QRELS)
    run = write(tmp_path, "run.txt", GOOD_TREC_RUN)
    with pytest.raises(SystemExit) as exit_info:
        main(["evaluate", "--qrels", str(qrels), "--run", str(run), f"--ks={ks}"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "argument -k/--ks" in err
    assert "k must be a positive integer" in err or "k needs a comma-separated list" in err


def test_good_files_around_the_cases_are_accepted(tmp_path: Path) -> None:
    """The fixtures themselves are valid, so each case fails only on its bad line."""
    for qrels_text, run_text in ((GOOD_QRELS, GOOD_RUN), (GOOD_TREC_QRELS, GOOD_TREC_RUN)):
        qrels = write(tmp_path, "q.in", qrels_text)
        run = write(tmp_path, "r.in", run_text)
        assert main(["evaluate", "--qrels", str(qrels), "--run", str(run), "--format", "json"]) == 0
