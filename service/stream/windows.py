"""Tumbling event-time windows: closed-window records and rolling views over them.

A window is ``[start, start + size)`` aligned to the Unix epoch, per (retriever,
segment, partition). Once closed it never changes; its published record is
deterministic, so a consumer that keeps the last record per key (a compacted topic)
sees each window exactly once even though publishing is at least once.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import msgspec
import orjson

from service.audit.estimate import AUDIT_TERMS, AuditSums
from service.metrics.aggregates import MetricAggregates, Moments, merge_into
from service.metrics.ir import MetricKey
from service.times import parse_aware_ms, rfc3339

SliceKey = tuple[str, str]
"""(retriever, segment)."""

WindowIdent = tuple[str, str, int, int]
"""(retriever, segment, window start, partition): one window of one input partition."""


def window_start(ts_ms: int, size_ms: int) -> int:
    """Start of the epoch-aligned tumbling window that contains ``ts_ms``."""
    return ts_ms - ts_ms % size_ms


class WindowSink(Protocol):
    """What consumes closed windows downstream of the pipeline (the window view).

    The stream core never imports the detector: whoever composes the two registers it.
    """

    def add(self, windows: Sequence[ClosedWindow]) -> None:
        """Windows that are durable (published and committed, or read back)."""

    def advance(self, closed_through_ms: int) -> object:
        """Every window ending at or before ``closed_through_ms`` has closed everywhere."""


@dataclass(frozen=True, slots=True)
class ClosedWindow:
    """The aggregates of one closed window of one (retriever, segment, partition)."""

    retriever: str
    segment: str
    partition: int
    start_ms: int
    end_ms: int
    queries: int
    labelled: int
    metrics: MetricAggregates = field(default_factory=dict)
    labels: tuple[dict[str, Any], ...] = field(default=(), compare=False, repr=False)
    """The labels output's records of its labelled queries (when that output is on)."""
    context_queries: int = 0
    """Finalised queries that logged a ``context_k`` above 0 (``context_precision``'s
    population, labelled or not: the audited estimates need it)."""
    audit: Mapping[MetricKey, AuditSums] = field(default_factory=dict)
    """The audits whose own time falls in this window, of queries of this slice: per
    metric key the audited sums (:mod:`service.audit.estimate`)."""
    audited: int = 0
    judges: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    """Judge agreement added by the audits of this window: per pair (``"a|b"``, or
    ``"a|live"``) the table (both relevant, only a, only b, neither) on the chunks both
    graded (:mod:`service.stream.agreement`)."""
    """Audits counted in ``audit`` (a later audit of a query by the same judge replaces
    its earlier one: counted -1 then +1)."""

    def without_labels(self) -> ClosedWindow:
        """This window without its labels output (once sent: views keep windows for days)."""
        return replace(self, labels=()) if self.labels else self

    @property
    def unlabelled(self) -> int:
        """Finalised queries without any relevant chunk."""
        return self.queries - self.labelled

    @property
    def ident(self) -> WindowIdent:
        """What :attr:`key` names, as a tuple (cheaper than the key: no time formatting)."""
        return (self.retriever, self.segment, self.start_ms, self.partition)

    @property
    def key(self) -> str:
        """``<retriever>|<segment>|<window start, RFC 3339>|<partition>``."""
        return f"{self.retriever}|{self.segment}|{rfc3339(self.start_ms)}|{self.partition}"

    def to_record(self, metric_keys: Iterable[MetricKey]) -> dict[str, Any]:
        """The published JSON object; every metric key is present (count 0 when no data)."""
        empty = Moments()
        return {
            "retriever": self.retriever,
            "segment": self.segment,
            "partition": self.partition,
            "window_start": rfc3339(self.start_ms),
            "window_end": rfc3339(self.end_ms),
            "queries": self.queries,
            "labelled": self.labelled,
            "unlabelled": self.unlabelled,
            "metrics": {key: self.metrics.get(key, empty).to_dict() for key in metric_keys},
            # exact fixed-point sums (units of 2**-52) so that consumers can merge bit for bit
            "metrics_fixed": {
                key: [m.count, str(m.sum_fx), str(m.sum_sq_fx)] for key, m in self.metrics.items()
            },
            "context_queries": self.context_queries,
            "audit": {
                "audited": self.audited,
                "metrics": {key: sums.to_record() for key, sums in self.audit.items()},
                "judges": {pair: list(table) for pair, table in self.judges.items()},
            },
        }

    @classmethod
    def from_json(cls, raw: bytes) -> ClosedWindow:
        """:meth:`from_record` of a record's JSON bytes: a record with exact sums in one
        pass of msgspec's typed decoder (``metrics`` is skipped unread); any other, and
        any that it refuses, by :meth:`from_record` (its values, its errors)."""
        try:
            record = _EXACT_RECORD.decode(raw)
        except msgspec.DecodeError:  # (and its ValidationError)
            return cls.from_record(orjson.loads(raw))
        return cls(
            retriever=record.retriever,
            segment=record.segment,
            partition=record.partition,
            start_ms=_parse_ms(record.window_start),
            end_ms=_parse_ms(record.window_end),
            queries=record.queries,
            labelled=record.labelled,
            metrics={key: Moments(*sums) for key, sums in record.metrics_fixed.items()},
            context_queries=record.context_queries,
            **_audit_of(record.audit),
        )

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> ClosedWindow:
        """Inverse of :meth:`to_record` (exact when ``metrics_fixed`` is present)."""
        fixed = record.get("metrics_fixed")
        if fixed is not None:
            metrics = {k: Moments(int(c), int(s), int(q)) for k, (c, s, q) in fixed.items()}
        else:
            metrics = {
                k: Moments.from_dict(v) for k, v in record["metrics"].items() if v["count"] > 0
            }
        return cls(
            retriever=record["retriever"],
            segment=record["segment"],
            partition=int(record["partition"]),
            start_ms=_parse_ms(record["window_start"]),
            end_ms=_parse_ms(record["window_end"]),
            queries=int(record["queries"]),
            labelled=int(record["labelled"]),
            metrics=metrics,
            context_queries=int(record.get("context_queries", 0)),
            **_audit_of(record.get("audit")),
        )


class _ExactRecord(msgspec.Struct, gc=False):
    """What a window is rebuilt from, of a record with exact sums."""

    retriever: str
    segment: str
    partition: int
    window_start: str
    window_end: str
    queries: int
    labelled: int
    metrics_fixed: dict[str, tuple[int, int, int]]
    context_queries: int = 0
    audit: dict[str, Any] | None = None


def _audit_of(record: Mapping[str, Any] | None) -> dict[str, Any]:
    """A window record's ``audit`` object as :class:`ClosedWindow` fields (none: no audits,
    or a record from before audits were kept)."""
    if not record or not (record.get("metrics") or record.get("judges")):
        return {}
    return {
        "audited": int(record.get("audited", 0)),
        "audit": {key: AuditSums.from_record(v) for key, v in record["metrics"].items()},
        "judges": {
            pair: tuple(int(n) for n in table) for pair, table in record.get("judges", {}).items()
        },
    }


_EXACT_RECORD = msgspec.json.Decoder(_ExactRecord, strict=False)
"""(Not strict: the sums are written as strings, as :meth:`ClosedWindow.from_record`
reads them with ``int``; they outgrow 64 bits, which msgspec's ints do not mind.)"""


def _parse_ms(text: str) -> int:
    ms = parse_aware_ms(text)
    if ms is None:
        raise ValueError(f"expected RFC 3339 with an offset, got {text!r}")
    return ms


@dataclass(slots=True)
class SliceTotals:
    """Merged aggregates of several windows of one (retriever, segment): the live ones,
    and what the audited estimates need besides (:func:`service.audit.book.estimates`
    reads these totals as it reads windows)."""

    queries: int = 0
    labelled: int = 0
    metrics: MetricAggregates = field(default_factory=dict)
    context_queries: int = 0
    audit_keys: tuple[MetricKey, ...] = ()
    """The metric keys of :attr:`audit_flat`, sorted."""
    audit_flat: list[int] = field(default_factory=list)
    """Per key of :attr:`audit_keys`, its audited count and sums (:class:`AuditSums`),
    one after the other: windows with the same keys (nearly all) merge in one C-level
    ``map``, where merging sums per key made a day's rolling view six times slower."""

    def add(
        self,
        queries: int,
        labelled: int,
        metrics: Mapping[str, Moments],
        context_queries: int = 0,
        audit: Mapping[MetricKey, AuditSums] | None = None,
    ) -> None:
        """Merge one more window in."""
        self.queries += queries
        self.labelled += labelled
        merge_into(self.metrics, metrics)  # in place: a view takes many windows one at a time
        self.context_queries += context_queries
        if audit:
            self._merge_audit(*_flatten(audit))

    def merge(self, other: SliceTotals) -> None:
        """Merge the totals of other windows in: every field, exactly."""
        self.queries += other.queries
        self.labelled += other.labelled
        merge_into(self.metrics, other.metrics)
        self.context_queries += other.context_queries
        self._merge_audit(other.audit_keys, other.audit_flat)

    @property
    def audit(self) -> dict[MetricKey, AuditSums]:
        """Per metric key, the audited sums of the windows merged (exact, as theirs)."""
        return _unflatten(self.audit_keys, self.audit_flat)

    def _merge_audit(self, keys: tuple[MetricKey, ...], flat: Sequence[int]) -> None:
        if not flat:
            return
        if not self.audit_flat:
            self.audit_keys, self.audit_flat = keys, list(flat)
        elif keys == self.audit_keys:
            self.audit_flat = list(map(operator.add, self.audit_flat, flat))
        else:  # (a window without some key, context_precision: merged key by key)
            merged = self.audit
            for key, sums in _unflatten(keys, flat).items():
                held = merged.get(key)
                merged[key] = sums if held is None else held + sums
            self.audit_keys, self.audit_flat = _flatten(merged)

    @property
    def unlabelled_ratio(self) -> float | None:
        """Share of finalised queries without labels, or None without queries."""
        return (self.queries - self.labelled) / self.queries if self.queries else None


_AUDIT_WIDTH = 1 + len(AUDIT_TERMS)


def _flatten(audit: Mapping[MetricKey, AuditSums]) -> tuple[tuple[MetricKey, ...], list[int]]:
    """Audit sums per key as :attr:`SliceTotals.audit_flat`, keys sorted."""
    keys = tuple(sorted(audit))
    flat: list[int] = []
    for key in keys:
        sums = audit[key]
        flat.append(sums.n)
        flat.extend(sums.sums)
    return keys, flat


def _unflatten(keys: tuple[MetricKey, ...], flat: Sequence[int]) -> dict[MetricKey, AuditSums]:
    width = _AUDIT_WIDTH
    return {
        key: AuditSums(flat[i * width], tuple(flat[i * width + 1 : (i + 1) * width]))
        for i, key in enumerate(keys)
    }


class ClosedWindows:
    """Closed windows merged over partitions, kept for the longest rolling span.

    Besides each window, it keeps the windows of each block of ``BLOCK_WINDOWS``
    consecutive window starts merged, so that a rolling view merges whole blocks and
    only the windows at its two ends: a day's view of 5-minute windows merges some 46
    totals per slice instead of 288 (exact sums: the same result in any order). A block
    holds every kept window of its range or does not exist: one that starts before the
    retention's horizon (some of its windows dropped) is dropped with them.
    """

    BLOCK_WINDOWS = 12

    def __init__(self, window_ms: int, retention_ms: int) -> None:
        self.window_ms = window_ms
        self.retention_ms = retention_ms
        self._by_key: dict[tuple[str, str, int], SliceTotals] = {}
        self._block_ms = window_ms * self.BLOCK_WINDOWS
        self._blocks: dict[tuple[str, str, int], SliceTotals] = {}
        """(retriever, segment, block start) -> its windows merged."""
        self._latest_end_ms: int | None = None
        self._views: dict[tuple[int, int], dict[SliceKey, SliceTotals]] = {}
        """Rolling views already merged, until the next add (scrapes are frequent)."""

    def add(self, windows: Iterable[ClosedWindow]) -> None:
        """Merge newly published windows in and drop those past the retention."""
        self._views.clear()
        block_ms = self._block_ms
        for w in windows:
            totals = self._by_key.setdefault((w.retriever, w.segment, w.start_ms), SliceTotals())
            totals.add(w.queries, w.labelled, w.metrics, w.context_queries, w.audit)
            # (a block starting before the horizon is dropped below, before any view)
            block = w.start_ms - w.start_ms % block_ms
            merged = self._blocks.setdefault((w.retriever, w.segment, block), SliceTotals())
            merged.add(w.queries, w.labelled, w.metrics, w.context_queries, w.audit)
            if self._latest_end_ms is None or w.end_ms > self._latest_end_ms:
                self._latest_end_ms = w.end_ms
        if self._latest_end_ms is not None:
            horizon = self._latest_end_ms - self.retention_ms - self.window_ms
            for key in [k for k in self._by_key if k[2] < horizon]:
                del self._by_key[key]
            for key in [k for k in self._blocks if k[2] < horizon]:
                del self._blocks[key]

    def rolling(self, span_ms: int, until_ms: int) -> dict[SliceKey, SliceTotals]:
        """Merge the windows ending within ``span_ms`` before ``until_ms``, per slice.

        Windows end on multiples of the window length, so for a span that is a multiple
        of it the view only changes when ``until_ms`` crosses a window end (or a window
        is added): it is computed once and reused. The result must not be modified.
        """
        aligned = span_ms % self.window_ms == 0
        cache_key = (span_ms, until_ms // self.window_ms if aligned else until_ms)
        cached = self._views.get(cache_key)
        if cached is not None:
            return cached
        if len(self._views) > 64:
            self._views.clear()
        out: dict[SliceKey, SliceTotals] = {}
        low, size, block_ms = until_ms - span_ms, self.window_ms, self._block_ms
        whole = set()
        for (retriever, segment, block), totals in self._blocks.items():
            # every window of the block ends within: its first and its last
            if low < block + size and block + block_ms <= until_ms:
                out.setdefault((retriever, segment), SliceTotals()).merge(totals)
                whole.add((retriever, segment, block))
        for (retriever, segment, start), totals in self._by_key.items():
            end = start + size
            if (
                low < end <= until_ms
                and (retriever, segment, start - start % block_ms) not in whole
            ):
                out.setdefault((retriever, segment), SliceTotals()).merge(totals)
        self._views[cache_key] = out
        return out

    def listing(
        self, retriever: str | None = None, segment: str | None = None, since_ms: int | None = None
    ) -> list[tuple[str, str, int, SliceTotals]]:
        """Closed windows (merged over partitions), oldest first, optionally filtered."""
        rows = [
            (r, s, start, totals)
            for (r, s, start), totals in self._by_key.items()
            if (retriever is None or r == retriever)
            and (segment is None or s == segment)
            and (since_ms is None or start >= since_ms)
        ]
        rows.sort(key=lambda row: (row[2], row[0], row[1]))
        return rows
