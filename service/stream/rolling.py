"""Rolling views over closed windows: a slice's windows merged (:class:`SliceTotals`) and
the closed windows kept for the longest rolling span, merged over partitions
(:class:`ClosedWindows`)."""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from service.audit.estimate import AUDIT_TERMS, AuditSums
from service.metrics.aggregates import MetricAggregates, merge_into
from service.metrics.ir import MetricKey
from service.stream.labels import SOURCES
from service.stream.windows import ClosedWindow, SliceKey, no_sources


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
    sources: dict[str, int] = field(default_factory=no_sources)
    """Per label source, the queries with a relevant label from it (every source)."""

    def add(self, w: ClosedWindow) -> None:
        """Merge one more window in."""
        self.queries += w.queries
        self.labelled += w.labelled
        merge_into(self.metrics, w.metrics)  # in place: a view takes many windows one at a time
        self.context_queries += w.context_queries
        if w.audit:
            self._merge_audit(*_flatten(w.audit))
        if w.sources:
            self._merge_sources(w.sources)

    def merge(self, other: SliceTotals) -> None:
        """Merge the totals of other windows in: every field, exactly."""
        self.queries += other.queries
        self.labelled += other.labelled
        merge_into(self.metrics, other.metrics)
        self.context_queries += other.context_queries
        self._merge_audit(other.audit_keys, other.audit_flat)
        self._merge_sources(other.sources)

    def _merge_sources(self, sources: Mapping[str, int]) -> None:
        mine = self.sources
        for source, n in sources.items():
            mine[source] = mine.get(source, 0) + n

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
    def source_labelled_share(self) -> dict[str, float | None]:
        """Per label source, the share of finalised queries with a relevant label from it
        (None without queries: no data is not zero)."""
        queries = self.queries
        return {
            source: self.sources.get(source, 0) / queries if queries else None for source in SOURCES
        }

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
            totals.add(w)
            # (a block starting before the horizon is dropped below, before any view)
            block = w.start_ms - w.start_ms % block_ms
            merged = self._blocks.setdefault((w.retriever, w.segment, block), SliceTotals())
            merged.add(w)
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
