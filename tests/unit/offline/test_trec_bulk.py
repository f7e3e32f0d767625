"""The bulk TREC run reader against the line parser it stands in for.

The oracle is the line parser over the whole file (``trec_columns`` over the file's
lines, universal newlines) followed by trec_eval's order written out here (score
descending, ties by chunk id descending). On drawn files with every irregularity the
line parser accepts (tabs, runs of spaces, blank lines, CRLF, non-ASCII ids, scores
JSON does not write, ties, queries split over the file, an unterminated last line) and
block sizes small enough that queries and lines of every kind meet block edges, the
rankings are the same; a bad line anywhere gives the same error, line and field.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.errors import InputFileError
from service.offline.files import load_run, trec_columns
from service.offline.trec_bulk import read_trec_run


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    with open(path, encoding="utf-8") as handle:
        yield from enumerate(handle, start=1)


def reference(path: Path) -> dict[str, list[str]]:
    columns = trec_columns(str(path), _lines(path))
    return {
        query: [doc for _, doc in sorted(zip(scores, docs, strict=True), reverse=True)]
        for query, (docs, scores) in columns.items()
    }


def _score(rng: random.Random) -> str:
    kind = rng.randrange(9)
    if kind == 0:
        return rng.choice(["+1", ".5", "1.", "-0", "007", "1_0", "2E3", "-1e-3"])
    if kind == 1:
        return str(rng.randrange(4))  # ties
    return repr(round(rng.uniform(-50, 50), rng.randrange(1, 12)))


def draw_run(rng: random.Random, *, irregular: bool) -> str:
    queries = [f"q{i}" if rng.random() < 0.8 else f"query-{i}-ü" for i in range(rng.randint(1, 8))]
    if not irregular:
        queries = [f"q{i}" for i in range(len(queries))]
    out = []
    once = rng.random() < 0.5  # each query in one run of lines, or coming back later
    for turn in range(len(queries) if once else rng.randint(1, 60)):
        query = queries[turn] if once else rng.choice(queries)
        scores = [
            _score(rng) if irregular else str(round(rng.uniform(-9, 9), rng.randrange(3)))
            for _ in range(rng.randint(1, 12))
        ]
        if rng.random() < 0.7:  # as retrievers write runs: best first, ties in any order
            scores.sort(key=float, reverse=True)
        for rank, score in enumerate(scores, start=1):
            doc = f"d{rng.randrange(30)}" + ("é" if irregular and rng.random() < 0.05 else "")
            sep = rng.choice([" ", "  ", "\t", " \t "]) if irregular else " "
            line = sep.join([query, "Q0", doc, str(rank), score, "tag"])
            if irregular and rng.random() < 0.1:
                line = rng.choice([" ", "\t"]) + line + rng.choice([" ", "\t "])
            end = "\r\n" if irregular and rng.random() < 0.03 else "\n"
            out.append(line + end)
            if irregular and rng.random() < 0.05:
                out.append(rng.choice(["\n", "  \n", "\t\n"]))
    text = "".join(out)
    if rng.random() < 0.3:
        text = text.rstrip("\n")
    return text


@pytest.mark.parametrize("irregular", [False, True])
def test_same_rankings_as_the_line_parser(tmp_path: Path, irregular: bool) -> None:
    rng = random.Random(16 + irregular)
    path = tmp_path / "run.txt"
    for _ in range(150):
        path.write_bytes(draw_run(rng, irregular=irregular).encode())
        expected = reference(path)
        for block in (rng.randint(16, 200), 4096, 1 << 20):
            assert read_trec_run(path, trec_columns, block) == expected
        assert load_run(path).rankings == expected


def _refuse(
    name: str, lines: Iterator[tuple[int, str]]
) -> dict[str, tuple[list[str], list[float]]]:
    raise AssertionError(f"the line parser was asked to read {name}")


def test_a_regular_file_never_reaches_the_line_parser(tmp_path: Path) -> None:
    rng = random.Random(3)
    path = tmp_path / "run.txt"
    for _ in range(30):
        path.write_bytes(draw_run(rng, irregular=False).encode())
        assert read_trec_run(path, _refuse, rng.randint(16, 4096)) == reference(path)


def test_only_the_irregular_block_reaches_the_line_parser(tmp_path: Path) -> None:
    lines = [f"q{i // 10} Q0 d{i} {i % 10 + 1} {-i} run\n" for i in range(1000)]
    lines[500] = lines[500].replace("\n", "\r\n")
    path = tmp_path / "run.txt"
    path.write_text("".join(lines), newline="")
    asked: list[int] = []

    def counting(
        name: str, block: Iterator[tuple[int, str]]
    ) -> dict[str, tuple[list[str], list[float]]]:
        numbered = list(block)
        asked.extend(number for number, _ in numbered)
        return trec_columns(name, iter(numbered))

    assert read_trec_run(path, counting, 1024) == reference(path)
    assert 501 in asked  # numbered as in the file
    assert len(asked) < 60  # one block of about 40 lines


BAD_LINES = {
    "q1 Q0 d1 1 2.0": ("(line)", "expected 6 columns"),
    "q1 Q0 d1 1 2.0 t extra": ("(line)", "expected 6 columns"),
    "q1 Q0 d1 x 2.0 t": ("rank", "expected an integer, got 'x'"),
    "q1 Q0 d1 1.5 2.0 t": ("rank", "expected an integer"),
    "q1 Q0 d1 1 nan t": ("score", "expected a finite number, got 'nan'"),
    "q1 Q0 d1 1 1e999 t": ("score", "expected a finite number, got '1e999'"),
    "q1 Q0 d1 1 -inf t": ("score", "expected a finite number"),
    "q1 Q0 d1 1 2,5 t": ("score", "expected a finite number, got '2,5'"),
    "q1 Q0 d1 1 [1] t": ("score", "expected a finite number"),
    "q1 Q0 d1 1 0x10 t": ("score", "expected a finite number"),
}


@pytest.mark.parametrize("bad", sorted(BAD_LINES))
def test_a_bad_line_gives_the_line_parsers_error(tmp_path: Path, bad: str) -> None:
    rng = random.Random(bad)
    path = tmp_path / "run.txt"
    for _ in range(5):
        lines = [line + "\n" for line in draw_run(rng, irregular=False).splitlines()]
        at = rng.randrange(len(lines) + 1)
        lines.insert(at, bad + "\n")
        path.write_text("".join(lines))
        with pytest.raises(InputFileError) as expected:
            trec_columns(str(path), _lines(path))
        with pytest.raises(InputFileError) as got:
            read_trec_run(path, trec_columns, rng.randint(16, 300))
        assert str(got.value) == str(expected.value)
        assert got.value.line == at + 1
        field, message = BAD_LINES[bad]
        assert got.value.field == field
        assert message in got.value.problem


def test_invalid_utf8_is_named_by_line(tmp_path: Path) -> None:
    path = tmp_path / "run.txt"
    good = "".join(f"q1 Q0 d{i} {i + 1} {-i} t\n" for i in range(100))
    path.write_bytes(good.encode() + b"q1 Q0 d\xff 101 -101 t\n" + good.encode())
    with pytest.raises(InputFileError) as got:
        read_trec_run(path, trec_columns, 256)
    assert got.value.line == 101
    assert "not valid UTF-8" in got.value.problem
