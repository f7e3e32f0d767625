"""Reading golden sets: TREC qrels and runs, and their JSONL forms.

Formats (detected per file: JSONL when the first non-blank line starts with ``{``):

* TREC qrels: ``query_id iteration chunk_id grade`` (whitespace separated).
* TREC run: ``query_id Q0 chunk_id rank score tag``, ordered as trec_eval orders it:
  by score descending, ties by chunk id descending; the rank column is checked to
  be an integer but not used.
* JSONL qrels: ``{"query_id", "relevant": {"chunk": grade, ...}}`` or the golden-set
  form ``{"query_id", "query", "relevant_chunk_ids": [...]}`` (grade 1 each).
* JSONL run: ``{"query_id", "results": [...]}`` in rank order, items as in query
  events (a string or ``{"chunk_id", "score"}``), optional ``context_k``.

Grades are integers; a grade <= 0 is a judged non-relevant chunk (as in trec_eval).
Every malformed line raises :class:`~service.errors.InputFileError` naming the file,
the line and the field.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, BinaryIO, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, StringConstraints, ValidationError
from pydantic import Field as PydanticField
from pydantic_core import ErrorDetails

from service.errors import InputFileError
from service.offline.trec_bulk import not_utf8, read_trec_run

Judgments = dict[str, dict[str, int]]
"""query id -> chunk id -> grade."""

ChunkId = Annotated[str, StringConstraints(min_length=1, max_length=500, strict=True)]
NonNegativeInt = Annotated[int, PydanticField(ge=0, strict=True)]


class ScoredChunk(BaseModel):
    """A result given as an object, as in query events; the rank is the position."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    chunk_id: ChunkId
    score: float | None = None


_UNION_TAGS = frozenset({"constrained-str", "str", "ScoredChunk"})


def field_path(loc: tuple[int | str, ...]) -> str:
    """A dotted field path such as ``results.3.chunk_id``, without pydantic's union tags."""
    return ".".join(str(p) for p in loc if p not in _UNION_TAGS)


def primary_error(error: ValidationError) -> ErrorDetails:
    """The most specific error: for a union, the member error that got deepest into the input."""
    errors = error.errors()
    return max(errors, key=lambda item: len(item["loc"]))  # max keeps the first of equals


def _int_id_as_text(value: object) -> object:
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


LooseQueryId = Annotated[
    str,
    BeforeValidator(_int_id_as_text),
    StringConstraints(min_length=1, max_length=200, strict=True),
]
StrictInt = Annotated[int, PydanticField(strict=True)]


class QrelsLine(BaseModel):
    """One JSONL qrels line, in either of its two forms."""

    model_config = ConfigDict(extra="ignore")

    query_id: LooseQueryId
    relevant: dict[ChunkId, StrictInt] | None = None
    relevant_chunk_ids: list[ChunkId] | None = None
    query: str | None = None


class RunLine(BaseModel):
    """One JSONL run line: a query's results in rank order."""

    model_config = ConfigDict(extra="ignore")

    query_id: LooseQueryId
    results: list[ChunkId | ScoredChunk]
    context_k: NonNegativeInt | None = None


@dataclass
class Run:
    """Ranked chunk ids per query, with ``context_k`` where the run gave one."""

    rankings: dict[str, list[str]]
    context_k: dict[str, int] = field(default_factory=dict)

    @property
    def duplicate_results(self) -> int:
        """Repeated chunk ids within a query's list (they count as non-relevant)."""
        return sum(len(docs) - len(set(docs)) for docs in self.rankings.values())


def open_input(path: str) -> BinaryIO:
    """The file opened to read bytes; InputFileError if it cannot be opened."""
    try:
        return Path(path).open("rb")
    except OSError as error:
        raise InputFileError(path, 0, "(file)", f"cannot open: {error.strerror}") from None


def jsonl_lines(paths: Iterable[str]) -> Iterator[tuple[str, int, bytes]]:
    """(path, 1-based number, bytes) of every non-blank line of the files, in order;
    InputFileError for a file that cannot be opened."""
    for path in paths:
        with open_input(path) as handle:
            for number, raw in enumerate(handle, start=1):
                if not raw.isspace():  # (never empty; strip() would copy every line)
                    yield path, number, raw


def _stream(path: str | Path) -> Iterator[tuple[int, str]]:
    """Yield (1-based number, text) of every line, streamed: big runs never sit in memory twice."""
    name = str(path)
    try:
        handle = open(path, encoding="utf-8")  # noqa: SIM115 (closed by the with below)
    except OSError as error:
        raise InputFileError(name, 0, "(file)", f"cannot read it: {error.strerror}") from None
    with handle:
        try:
            yield from enumerate(handle, start=1)
        except UnicodeDecodeError:
            raise not_utf8(name) from None


def _open_lines(path: str | Path) -> tuple[Iterator[tuple[int, str]], bool]:
    """The file's lines and whether it is JSONL (its first non-blank line starts with '{')."""
    lines = _stream(path)
    for number, line in lines:
        text = line.strip()
        if text:
            return itertools.chain([(number, line)], lines), text.startswith("{")
    raise InputFileError(str(path), 0, "(file)", "the file is empty")


def _nonblank(lines: Iterator[tuple[int, str]]) -> Iterator[tuple[int, str]]:
    for number, line in lines:
        if not line.isspace():
            yield number, line


def _validation_error(path: str, line: int, error: ValidationError) -> InputFileError:
    item = primary_error(error)
    loc = field_path(item["loc"]) or "(line)"
    if item["type"] == "json_invalid":
        return InputFileError(path, line, "(line)", f"not valid JSON: {item['msg']}")
    if item["type"] == "model_type":
        return InputFileError(path, line, "(line)", "expected a JSON object {...} on each line")
    shown = "" if item["type"] == "missing" else f" (got {item.get('input')!r:.60})"
    return InputFileError(path, line, loc, f"{item['msg']}{shown}")


_Row = TypeVar("_Row", QrelsLine, RunLine)


def _jsonl_rows(
    name: str, lines: Iterator[tuple[int, str]], model: type[_Row]
) -> Iterator[tuple[int, _Row]]:
    """Validate each non-blank line as ``model``; a query id may appear on one line only."""
    seen: dict[str, int] = {}
    for number, line in _nonblank(lines):
        try:
            row = model.model_validate_json(line)
        except ValidationError as error:
            raise _validation_error(name, number, error) from None
        first = seen.setdefault(row.query_id, number)
        if first != number:
            raise InputFileError(
                name,
                number,
                "query_id",
                f"query {row.query_id!r} already appeared at line {first}; "
                "give each query one line",
            )
        yield number, row


def _parse_int(path: str, line: int, name: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise InputFileError(path, line, name, f"expected an integer, got {text!r}") from None


def load_judgments(path: str | Path) -> Judgments:
    """Read qrels (TREC or JSONL): query id -> chunk id -> grade, in file order."""
    name = str(path)
    judgments: Judgments = {}
    lines, is_jsonl = _open_lines(path)
    if is_jsonl:
        for number, row in _jsonl_rows(name, lines, QrelsLine):
            if (row.relevant is None) == (row.relevant_chunk_ids is None):
                raise InputFileError(
                    name,
                    number,
                    "relevant",
                    "give exactly one of 'relevant' {chunk: grade} or 'relevant_chunk_ids' [...]",
                )
            if row.relevant is not None:
                judgments[row.query_id] = dict(row.relevant)
            else:
                judgments[row.query_id] = dict.fromkeys(row.relevant_chunk_ids or (), 1)
        return judgments
    for number, line in _nonblank(lines):
        parts = line.split()
        if len(parts) != 4:
            raise InputFileError(
                name,
                number,
                "(line)",
                f"expected 4 columns 'query_id iteration chunk_id grade', got {len(parts)}",
            )
        query_id, _, chunk_id, grade_text = parts
        grade = _parse_int(name, number, "grade", grade_text)
        per_query = judgments.setdefault(query_id, {})
        if chunk_id in per_query:
            first = next(n for n, t in _stream(path) if t.split()[0:3:2] == [query_id, chunk_id])
            raise InputFileError(
                name,
                number,
                "chunk_id",
                f"{chunk_id!r} is judged twice for query {query_id!r} "
                f"(first at line {first}); keep one line",
            )
        per_query[chunk_id] = grade
    return judgments


def trec_columns(
    name: str, lines: Iterator[tuple[int, str]]
) -> dict[str, tuple[list[str], list[float]]]:
    """A TREC run's lines, line by line: chunk ids and scores per query, in file order.

    The exact reference of the bulk reader (:mod:`service.offline.trec_bulk`), which
    hands it every block it cannot vouch for, so its errors are the only ones users see.
    """
    columns: dict[str, tuple[list[str], list[float]]] = {}
    current: str | None = None
    entry: tuple[list[str], list[float]] = ([], [])
    add_doc, add_score = entry[0].append, entry[1].append  # rebound on the first line
    for number, line in lines:
        parts = line.split()
        if len(parts) != 6:
            if not parts:
                continue
            raise InputFileError(
                name,
                number,
                "(line)",
                f"expected 6 columns 'query_id Q0 chunk_id rank score tag', got {len(parts)}",
            )
        query_id, _, doc, rank, score_text, _ = parts
        if not rank.isdigit():
            _parse_int(name, number, "rank", rank)
        try:
            score = float(score_text)
        except ValueError:
            score = math.nan
        if score - score != 0.0:  # NaN or infinite
            raise InputFileError(
                name, number, "score", f"expected a finite number, got {score_text!r}"
            )
        if query_id != current:
            entry = columns.setdefault(query_id, ([], []))
            add_doc, add_score, current = entry[0].append, entry[1].append, query_id
        add_doc(doc)
        add_score(score)
    return columns


def load_run(path: str | Path) -> Run:
    """Read a run (TREC or JSONL): ranked chunk ids per query."""
    name = str(path)
    run = Run(rankings={})
    lines, is_jsonl = _open_lines(path)
    if is_jsonl:
        for _, row in _jsonl_rows(name, lines, RunLine):
            run.rankings[row.query_id] = [
                r if isinstance(r, str) else r.chunk_id for r in row.results
            ]
            if row.context_k is not None:
                run.context_k[row.query_id] = row.context_k
    else:
        del lines  # the bulk reader reads the file from its start
        run.rankings = read_trec_run(path, trec_columns)
    return run
