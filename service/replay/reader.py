"""``replay``'s reader process: the files read, decoded and hashed in a second process
while this one joins, so that a replay on a machine with two cores or more runs the two
halves of its work side by side.

The reader is forked (so that it shares this process's ``hash`` of a string, which the
join keeps chunk ids as) and sends, in input order, one item per chunk of lines
(:func:`service.replay.lines.chunks`): the chunk's events, lean (what the join reads,
each query's chunk ids already hashed and packed), when every line of it decodes; or its
raw lines, which this process then reads one by one as it would without a reader (a
blank, oversized or bad line, found and reported there). Items are msgpack and the pipe
holds little more than one, so the reader is at most a chunk or two ahead.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import Connection

import msgspec
from msgspec import Struct

try:
    import fcntl
except ImportError:  # (not on Windows, where there is no fork either)
    fcntl = None  # type: ignore[assignment]

from service.audit.sample import sampled
from service.errors import InputFileError
from service.offline.files import open_input
from service.replay.lines import MAX_LINE_BYTES, chunks, decode_whole
from service.stream.events import FeedbackEvent, QueryEvent
from service.stream.prepared import Prepared, prepare


class LeanQuery(Struct, array_like=True, tag=0, gc=False):
    """A query event as the join reads it (its id and its chunk ids, hashed and packed,
    are in the chunk's columns)."""

    timestamp_ms: int
    retriever: str
    segment: str
    context_k: int | None
    results: list[str] | None = None
    """The chunk ids of a query in the audit sample (the audit join keeps them)."""

    def chunk_ids(self) -> list[str]:
        """The chunk ids, of a query in the audit sample."""
        return self.results or []


class LeanFeedback(Struct, array_like=True, tag=1, gc=False):
    """A feedback event as the join reads it (its query id, its chunk id's hash and its
    grade are in the chunk's columns)."""

    timestamp_ms: int
    chunk_id: str | None = None
    """The chunk id, of feedback for a query in the audit sample."""


class Decoded(Struct, array_like=True, tag="decoded"):
    """A chunk whose lines all decoded: its file (an index into the paths: a path need
    not be text), its first line, its size, its events (one a line), and their columns
    (``prepare``'s, sent as they are: an array of arrays)."""

    file: int
    first: int
    size: int
    events: list[LeanQuery | LeanFeedback]
    prepared: Prepared


class Raw(Struct, array_like=True, tag="raw"):
    """A chunk to read line by line (a blank, oversized or bad line is among them); an
    oversized line is sent as its length (all that its error says of it)."""

    file: int
    first: int
    lines: list[bytes | int]


class Unopened(Struct, array_like=True, tag="unopened"):
    """The file could not be opened (the replay stops there, as without a reader)."""

    file: int


class Failed(Struct, array_like=True, tag="failed"):
    """The reader stopped on an error of its own."""

    trace: str


class Done(Struct, array_like=True, tag="done"):
    """Every file was read."""


Item = Decoded | Raw | Unopened | Failed | Done
_ITEM = msgspec.msgpack.Decoder(Item)


def reader_allowed() -> bool:
    """Whether a reader process can help: on Linux (where fork is safe to use here) when
    this process may use two cores or more."""
    if not sys.platform.startswith("linux"):
        return False
    affinity = getattr(os, "sched_getaffinity", None)
    cores = len(affinity(0)) if affinity is not None else os.cpu_count() or 1
    return cores > 1


def _decoded(  # noqa: PLR0917 - one call, in the reader
    file: int,
    first: int,
    chunk: list[bytes],
    events: list[QueryEvent | FeedbackEvent],
    grade: Callable[[FeedbackEvent], int],
    audit_threshold: int,
) -> Decoded:
    """The item of a chunk whose lines all decoded (with the chunk ids of the events of
    the audit sample's queries: ``audit_threshold`` as ``sample_threshold`` gives it)."""
    prepared = prepare(events, grade)
    audited = [audit_threshold > 0 and sampled(key, audit_threshold) for key in prepared.keys]
    lean: list[LeanQuery | LeanFeedback] = [
        LeanQuery(e.timestamp_ms, e.retriever, e.segment, e.context_k, e.chunk_ids() if s else None)
        if type(e) is QueryEvent
        else LeanFeedback(e.timestamp_ms, e.chunk_id if s else None)  # type: ignore[union-attr]
        for e, s in zip(events, audited, strict=True)
    ]
    size = sum(map(len, chunk))
    return Decoded(file, first, size, lean, prepared)


def _raw(file: int, first: int, chunk: list[bytes]) -> Raw:
    """The item of a chunk to read line by line."""
    lines: list[bytes | int] = [
        len(raw) if len(raw) > MAX_LINE_BYTES and not raw.isspace() else raw for raw in chunk
    ]
    return Raw(file, first, lines)


def _read(
    paths: Sequence[str],
    out: Connection,
    unused: Connection,
    read_bytes: int,
    advance_every: int,
    *,
    grade: Callable[[FeedbackEvent], int],
    audit_threshold: int = 0,
) -> None:
    """The reader process: every file's chunks, as items, into ``out``. (``unused``, this
    process's copy of the pipe's other end, is closed first: once the replay's own copy
    is gone, however it went, a write here fails and the reader ends.)"""
    unused.close()
    encode = msgspec.msgpack.Encoder().encode
    lines_read = [0]  # non-blank lines, over every file (as the replay counts them)
    try:
        for file, path in enumerate(paths):
            try:
                handle = open_input(path)
            except InputFileError:
                out.send_bytes(encode(Unopened(file)))
                return
            with handle:
                for first, chunk in chunks(
                    handle, read_bytes, advance_every, lambda: lines_read[0]
                ):
                    events = decode_whole(chunk)
                    item: Item
                    if events is None:
                        item = _raw(file, first, chunk)
                        lines_read[0] += sum(not raw.isspace() for raw in chunk)
                    else:
                        item = _decoded(file, first, chunk, events, grade, audit_threshold)
                        lines_read[0] += len(chunk)
                    out.send_bytes(encode(item))
        out.send_bytes(encode(Done()))
    except BaseException:
        with contextlib.suppress(OSError):  # (the replay is gone: nobody to tell)
            out.send_bytes(encode(Failed(traceback.format_exc())))
    finally:
        out.close()


PIPE_BYTES = 1 << 20
"""The pipe from the reader holds this much (where the system allows it: Linux's default
ceiling for a process), so that the reader keeps a few chunks ahead while this process
finalises windows."""


def _widen(pipe: Connection) -> None:
    set_size = getattr(fcntl, "F_SETPIPE_SZ", None) if fcntl is not None else None
    if set_size is not None:
        with contextlib.suppress(OSError):  # (a lower ceiling: the reader waits more)
            fcntl.fcntl(pipe.fileno(), set_size, PIPE_BYTES)


class Reader:
    """A started reader process over ``paths``; iterate for its items, then ``close``.
    ``grade``: the label policy's grade of a feedback event."""

    def __init__(
        self,
        paths: Sequence[str],
        read_bytes: int,
        advance_every: int,
        grade: Callable[[FeedbackEvent], int],
        audit_threshold: int = 0,
    ) -> None:
        context = multiprocessing.get_context("fork")
        self.paths = paths
        self._in, out = context.Pipe(duplex=False)
        _widen(out)
        self._process = context.Process(
            target=_read,
            args=(paths, out, self._in, read_bytes, advance_every),
            kwargs={"grade": grade, "audit_threshold": audit_threshold},
            daemon=True,
        )
        self._process.start()
        out.close()

    def __iter__(self) -> Iterator[tuple[str, Decoded | Raw]]:
        """The items in input order, each with its file's path; InputFileError as the
        replay without a reader would raise it, RuntimeError if the reader failed."""
        while True:
            try:
                item = _ITEM.decode(self._in.recv_bytes())
            except (EOFError, OSError):  # (OSError: it ended within an item)
                raise RuntimeError("the replay's reader process stopped unexpectedly") from None
            if isinstance(item, Done):
                return
            if isinstance(item, Failed):
                raise RuntimeError(f"the replay's reader process failed:\n{item.trace}")
            path = self.paths[item.file]
            if isinstance(item, Unopened):
                open_input(path).close()  # (raises the error it met)
                raise InputFileError(path, 0, "(file)", "cannot open it")
            yield path, item

    def close(self) -> None:
        """Stop the reader (if it still runs) and wait for it."""
        self._in.close()
        if self._process.is_alive():
            self._process.terminate()
        self._process.join(timeout=5)
        if self._process.is_alive():  # (SIGTERM handled and not ending it)
            self._process.kill()
            self._process.join()
