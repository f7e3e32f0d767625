"""Golden sets mined from production: the labels output turned into JSONL qrels.

The labels output (``--labels-topic``, ``replay --labels-out``) holds one record per
finalised labelled query: what the retriever logged and the grades its feedback gave.
:func:`mine` keeps the labels of at least ``min_grade`` (2 keeps citations, long clicks
and judgments of 2 or more, with the default grades), drops queries left without one,
keeps one query per normalised query text (when the records carry text), and samples at
most ``per_segment`` queries per segment, in an order drawn from ``seed`` (the same
input, options and seed give the same set). The set's version is a content hash of the
qrels file it writes; ``evaluate`` and ``compare`` print the same hash of the file they
read, so a changed score can be told apart from a changed set.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from service.errors import InputFileError
from service.offline.files import jsonl_lines

VERSION_CHARS = 12
"""Hex digits of the SHA-256 kept as a set's version."""


def set_version(data: bytes) -> str:
    """The version of a golden set: the start of the SHA-256 of its file's bytes."""
    return hashlib.sha256(data).hexdigest()[:VERSION_CHARS]


def file_version(path: str) -> str:
    """:func:`set_version` of a file (InputFileError when it cannot be read)."""
    try:
        return set_version(Path(path).read_bytes())
    except OSError as error:  # worded as the golden-set readers word it
        raise InputFileError(path, 0, "(file)", f"cannot read it: {error.strerror}") from None


_PUNCTUATION = re.compile(r"[^\w\s]+")
_SPACES = re.compile(r"\s+")


def normalise(text: str) -> str:
    """Query text for deduplication: Unicode NFKC, case folded, punctuation dropped,
    runs of white space as one space."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    return _SPACES.sub(" ", _PUNCTUATION.sub(" ", folded)).strip()


@dataclass(frozen=True, slots=True)
class Labelled:
    """One record of the labels output."""

    query_id: str
    segment: str
    retriever: str
    results: list[str]
    labels: dict[str, int]
    query: str | None


def read_labels(paths: Iterable[str]) -> Iterator[Labelled]:
    """The records of labels-output files (JSONL); InputFileError names a bad line."""
    for path, number, raw in jsonl_lines(paths):
        yield _record(raw, path, number)


def _record(raw: bytes, path: str, number: int) -> Labelled:
    def bad(field: str, problem: str) -> InputFileError:
        return InputFileError(
            path, number, field, problem + " (a line of the labels output: --labels-out)"
        )

    try:
        obj: Any = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise bad("(line)", "not valid JSON") from None
    if not isinstance(obj, dict):
        raise bad("(line)", "expected a JSON object")
    for name in ("query_id", "segment", "retriever"):
        if not isinstance(obj.get(name), str):
            raise bad(name, "expected a string")
    results, labels, query = obj.get("results"), obj.get("labels"), obj.get("query")
    if not isinstance(results, list) or not all(isinstance(r, str) for r in results):
        raise bad("results", "expected an array of chunk ids")
    if not isinstance(labels, dict) or not all(
        isinstance(g, int) and not isinstance(g, bool) for g in labels.values()
    ):
        raise bad("labels", "expected an object of chunk id: integer grade")
    if query is not None and not isinstance(query, str):
        raise bad("query", "expected a string")
    return Labelled(obj["query_id"], obj["segment"], obj["retriever"], results, labels, query)


@dataclass(frozen=True, slots=True)
class MinedSet:
    """A mined golden set and the logged run of its queries."""

    qrels: bytes
    run: bytes
    per_segment: dict[str, int]

    @property
    def version(self) -> str:
        return set_version(self.qrels)


def mine(
    records: Iterable[Labelled],
    *,
    min_grade: int = 1,
    per_segment: int | None = None,
    seed: int = 0,
    retriever: str | None = None,
) -> MinedSet:
    """The golden set (JSONL qrels) and the logged run (JSONL) of the chosen queries."""
    latest: dict[str, Labelled] = {}
    for record in records:  # a query published again (a re-read) keeps its last record
        if retriever is None or record.retriever == retriever:
            latest[record.query_id] = record
    candidates = []
    for record in latest.values():
        strong = {c: g for c, g in record.labels.items() if g >= min_grade}
        if strong:
            order = hashlib.sha256(f"{seed}\x00{record.query_id}".encode()).digest()
            candidates.append((order, record, strong))
    candidates.sort(key=lambda item: item[0])
    seen_text: set[str] = set()
    taken: dict[str, int] = {}
    chosen = []
    for _, record, strong in candidates:
        if record.query is not None:
            text = normalise(record.query)
            if text in seen_text:
                continue
            seen_text.add(text)
        if per_segment is not None and taken.get(record.segment, 0) >= per_segment:
            continue
        taken[record.segment] = taken.get(record.segment, 0) + 1
        chosen.append((record, strong))
    chosen.sort(key=lambda item: (item[0].segment, item[0].query_id))
    qrels, run = bytearray(), bytearray()
    for record, strong in chosen:
        entry: dict[str, Any] = {"query_id": record.query_id, "segment": record.segment}
        if record.query is not None:
            entry["query"] = record.query
        entry["relevant"] = dict(sorted(strong.items()))
        qrels += orjson.dumps(entry) + b"\n"
        run += orjson.dumps({"query_id": record.query_id, "results": record.results}) + b"\n"
    return MinedSet(bytes(qrels), bytes(run), dict(sorted(taken.items())))
