"""Reading a TREC run in bulk: a block of lines at a time, in columns, not an object per token.

A TREC run of 100,000 queries x 100 results is 10 million lines; read line by line
(``str.split``, ``float`` and two appends per line) that is most of ``evaluate``'s
time. Here each block of about 4 MiB is cut into tokens with a few numpy passes over
its bytes (larger blocks lose more to page faults of their temporaries than they save
in calls); the scores of a block are decoded by one msgspec call, the chunk ids are made
Python strings by one ``split`` per query, and query boundaries are found by comparing
the query id column of neighbouring lines.

The result is exactly what the line parser (:func:`service.offline.files.trec_columns`)
gives, and every error is its error: a block that the fast path cannot vouch for (not
ASCII, a control character other than tab and newline, a line with other than 0 or 6
tokens, a rank that is not digits, a score that is not a finite JSON number) is handed
to the line parser with its line numbers, which accepts what Python accepts and names
the line and field of anything it refuses.
"""

from __future__ import annotations

import gc
import io
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np
from numpy.typing import NDArray

from service.errors import InputFileError

BLOCK_BYTES = 1 << 22

Bytes = NDArray[np.uint8]
Index = NDArray[np.intp]
Scores = NDArray[np.float64]
LineParser = Callable[[str, Iterator[tuple[int, str]]], dict[str, tuple[list[str], list[float]]]]

_FLOATS = msgspec.json.Decoder(list[float])
_DIGIT = np.zeros(256, dtype=bool)
_DIGIT[list(b"0123456789")] = True
_NUMBER = _DIGIT.copy()
_NUMBER[list(b"+-.eE,")] = True  # and the comma that joins them


@dataclass(slots=True)
class _Part:
    """A run of consecutive lines of one query, in file order."""

    docs: list[str]
    scores: Scores
    ordered: bool
    """Scores strictly decreasing: trec_eval's order is the file's."""


def _blocks(path: Path, block_bytes: int) -> Iterator[bytes]:
    """The file in blocks that end at a line end (an unterminated last line is ended)."""
    with path.open("rb") as handle:
        rest = b""
        while chunk := handle.read(block_bytes):
            data = rest + chunk
            cut = data.rfind(b"\n") + 1
            rest = data[cut:]
            if cut:
                yield data[:cut]
        if rest:
            yield rest + b"\n"  # the last line, unterminated: ended as every other line


def _tokens(a: Bytes) -> tuple[Index, Index]:
    """Start and end (exclusive) of every run of bytes above space.

    Written to allocate little: a fresh array of this size costs more in page faults
    than the pass that fills it."""
    solid = np.empty(a.size + 1, dtype=bool)
    solid[0] = False
    np.greater(a, 32, out=solid[1:])
    edges = np.not_equal(solid[1:], solid[:-1]).nonzero()[0]
    return edges[0::2], edges[1::2]


_RAMP = np.arange(1 << 20)


def _ramp(n: int) -> Index:
    """0, 1, ..., n - 1, from one array kept for the purpose."""
    global _RAMP  # noqa: PLW0603 (grown, never changed otherwise)
    if _RAMP.size < n:
        _RAMP = np.arange(max(n, 2 * _RAMP.size))
    return _RAMP[:n]


def _joined(a: Bytes, start: Index, end: Index, sep: int) -> tuple[Bytes, Index]:
    """The tokens [start, end) of ``a``, each followed by ``sep``, in one array; and where
    each separator is."""
    size = end - start
    size += 1
    out_end = np.cumsum(size)
    shift = out_end - size  # where each token starts in the output
    np.subtract(start, shift, out=shift)
    source = np.repeat(shift, size)
    source += _ramp(source.size)
    out = a.take(source, mode="clip")
    out_end -= 1
    out[out_end] = sep
    return out, out_end


def _same_as_previous(a: Bytes, start: Index, end: Index) -> NDArray[np.bool_]:
    """For lines 1..n-1: is the token equal to the previous line's (length, then bytes)?"""
    length = end - start
    same: NDArray[np.bool_] = length[1:] == length[:-1]
    for offset in range(int(length.max())):
        column = a.take(start + offset, mode="clip")
        column[length <= offset] = 0
        same &= column[1:] == column[:-1]
    return same


@dataclass
class _Block:
    """A block's lines in columns, cut into parts (runs of lines of one query)."""

    query_ids: list[str]
    bounds: list[int]
    """Part i is lines bounds[i]:bounds[i + 1]."""
    ordered: list[bool]
    docs: list[list[str]]
    """Each part's chunk ids."""
    scores: Scores
    lines: int
    """Lines in the block, blank ones included."""


def _fast_block(data: bytes) -> _Block | None:
    """The block in columns; None if it needs the line parser."""
    if not data.isascii():
        return None
    a = np.frombuffer(data, dtype=np.uint8)
    line_ends = (a == 10).nonzero()[0]
    if np.count_nonzero(a < 32) != line_ends.size + data.count(b"\t"):
        return None  # \r, \v, \f...: Python's split and line reading treat them otherwise
    start, end = _tokens(a)
    if start.size == 0 or start.size % 6:
        return None
    per_line = np.diff(np.searchsorted(start, line_ends), prepend=0)
    if np.any((per_line != 0) & (per_line != 6)):
        return None  # a line of other than 6 columns
    start, end = start.reshape(-1, 6), end.reshape(-1, 6)
    n = start.shape[0]
    ranks, _ = _joined(a, start[:, 3], end[:, 3], ord("0"))
    if not _DIGIT[ranks].all():
        return None
    scores_text, _ = _joined(a, start[:, 4], end[:, 4], ord(","))
    if not _NUMBER[scores_text].all() or np.count_nonzero(scores_text == 44) != n:
        return None
    try:
        values = _FLOATS.decode(b"[" + scores_text[:-1].tobytes() + b"]")
    except msgspec.DecodeError:
        return None  # not a JSON number (such as "+1" or ".5"), or out of range
    if len(values) != n:
        return None
    scores = np.fromiter(values, dtype=np.float64, count=n)
    if not np.isfinite(scores).all():
        return None
    same = _same_as_previous(a, start[:, 0], end[:, 0])
    firsts = np.concatenate(([0], (~same).nonzero()[0] + 1))
    query_ids = _joined(a, start[firsts, 0], end[firsts, 0], 32)[0].tobytes().decode().split()
    # chunk ids joined by spaces, parts by newlines: each part's list is made by one split
    # while its strings are in the cache (slicing a list of the block's ids touches each again)
    docs, seps = _joined(a, start[:, 2], end[:, 2], 32)
    docs[seps[firsts[1:] - 1]] = 10
    part_docs = [part.split() for part in docs.tobytes().decode().split("\n")]
    # a part is out of trec_eval's order where a score is not below the one before it
    rising = (same & (scores[1:] >= scores[:-1])).nonzero()[0] + 1
    ordered = np.ones(firsts.size, dtype=bool)
    ordered[np.searchsorted(firsts, rising, side="right") - 1] = False
    return _Block(
        query_ids, [*firsts.tolist(), n], ordered.tolist(), part_docs, scores, line_ends.size
    )


def _strictly_decreasing(scores: Scores) -> bool:
    return bool(np.all(scores[1:] < scores[:-1]))


class _Collector:
    """Parts per query, in order of first appearance."""

    def __init__(self) -> None:
        self.parts: dict[str, list[_Part]] = {}

    def add_block(self, block: _Block) -> None:
        scores, bounds, parts = block.scores, block.bounds, self.parts
        items = zip(block.query_ids, block.docs, block.ordered, strict=True)
        for index, (query_id, docs, ordered) in enumerate(items):
            part = _Part(docs, scores[bounds[index] : bounds[index + 1]], ordered)
            parts.setdefault(query_id, []).append(part)

    def add_columns(self, columns: dict[str, tuple[list[str], list[float]]]) -> None:
        for query_id, (docs, scores) in columns.items():
            part = _Part(docs, np.asarray(scores, dtype=np.float64), ordered=False)
            self.parts.setdefault(query_id, []).append(part)

    def rankings(self) -> dict[str, list[str]]:
        """Each query's chunk ids in trec_eval's order: score descending, ties by id descending."""
        out: dict[str, list[str]] = {}
        for query_id, parts in self.parts.items():
            if len(parts) == 1 and parts[0].ordered:
                out[query_id] = parts[0].docs
                continue
            docs = [doc for part in parts for doc in part.docs]
            scores = np.concatenate([part.scores for part in parts])
            if _strictly_decreasing(scores):
                out[query_id] = docs
            else:
                pairs = sorted(zip(scores.tolist(), docs, strict=True), reverse=True)
                out[query_id] = [doc for _, doc in pairs]
        return out


def not_utf8(path: str | Path) -> InputFileError:
    """The error for a file that is not valid UTF-8, naming its first bad line."""
    data = Path(path).read_bytes()
    line = 0
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
    return InputFileError(str(path), line, "(line)", "not valid UTF-8; save the file as UTF-8")


def _block_lines(name: str, data: bytes, before: int) -> list[tuple[int, str]]:
    """The block's lines numbered as the line parser numbers them (universal newlines)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise not_utf8(name) from None
    return list(enumerate(io.StringIO(text, newline=None), start=before + 1))


def read_trec_run(
    path: str | Path, line_parser: LineParser, block_bytes: int = BLOCK_BYTES
) -> dict[str, list[str]]:
    """A TREC run's chunk ids per query in trec_eval's order, read a block at a time."""
    name, path = str(path), Path(path)
    collector = _Collector()
    before = 0  # lines before the block
    collecting = gc.isenabled()
    gc.disable()  # millions of strings in lists that make no cycle: nothing for it to find
    try:
        for data in _blocks(path, block_bytes):
            fast = _fast_block(data)
            if fast is not None:
                collector.add_block(fast)
                before += fast.lines
                continue
            lines = _block_lines(name, data, before)
            collector.add_columns(line_parser(name, iter(lines)))
            before = lines[-1][0] if lines else before
    except OSError as error:
        raise InputFileError(name, 0, "(file)", f"cannot read it: {error.strerror}") from None
    finally:
        if collecting:
            gc.enable()
    return collector.rankings()
