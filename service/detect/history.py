"""One slice's closed windows as exact prefix sums, for the regression detector.

Each window contributes a flat row ``(count, sum_fx, sum_sq_fx)`` per watched metric
(Python ints, so sums stay exact), summed over partitions into one row per window start:

* each start remembers which partitions it holds (a bit each), so a window published
  again (publishing is at least once, and a copy is the same record) counts once, at
  any age;
* a recent window's row is also kept per partition, for ``KEEP_PARTS_MS``: a copy that
  differs there replaces the one it repeats. Older starts keep only their merged row,
  which is what the history's days need (a partition's own row per window would cost
  as many rows again as there are partitions: ``bench_detector_memory.py``);
* partitions may deliver their windows in any order; prefix sums are rebuilt lazily,
  once, before the next read, so a batch costs one pass whatever its order.

Any span then costs two binary searches and a subtraction.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

from service.metrics.aggregates import SCALE, Moments
from service.metrics.ir import MetricKey
from service.stream.windows import ClosedWindow
from service.times import HOUR_MS

Row = list[int]
EMPTY = Moments()
KEEP_PARTS_MS = HOUR_MS
"""How long before a slice's newest window a window's per-partition rows are kept (a copy
published again arrives within the commit interval, or after a restart, of its first)."""


def window_row(window: ClosedWindow, metrics: Iterable[MetricKey], labelled_share: bool) -> Row:
    """A window's row: (count, sum_fx, sum_sq_fx) of each metric, then of the labelled
    share (a 0/1 value per finalised query) when it is watched."""
    row: Row = []
    for name in metrics:
        m = window.metrics.get(name, EMPTY)
        row += (m.count, m.sum_fx, m.sum_sq_fx)
    if labelled_share:
        row += (window.queries, window.labelled * SCALE, window.labelled * SCALE)
    return row


def sample_moments(n: int, mean: float, mean_variance: float) -> Moments:
    """The sums of ``n`` values whose mean is ``mean`` and whose mean's variance is
    ``mean_variance`` (a sample variance of ``n * mean_variance``): how a baseline built
    from more than plain sums (a line, several days) reaches the mixture SPRT with its
    exact mean and variance."""
    sum_fx = round(mean * n * SCALE)
    spread = round(n * mean_variance * n * (n - 1) * SCALE * SCALE)
    return Moments(n, sum_fx, (spread + sum_fx * sum_fx) // (n * SCALE))


def plus(a: Row, b: Row) -> Row:
    """Two rows summed, column by column."""
    return [x + y for x, y in zip(a, b, strict=True)]


class SliceHistory:
    """Windows of one (retriever, segment), merged over partitions."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.first_start_ms: int | None = None
        """The earliest window ever added (kept when old windows are forgotten)."""
        self._parts: dict[tuple[int, int], Row] = {}
        """The rows of recent windows per (start, partition)."""
        self._seen: dict[int, int] = {}
        """The partitions each start holds, as bits."""
        self._newest = 0
        self._starts: list[int] = []
        self._values: dict[int, Row] = {}
        self._prefix: list[Row] = [[0] * width]
        self._dirty: int | None = None

    def __bool__(self) -> bool:
        return bool(self._starts)

    @property
    def starts(self) -> list[int]:
        """Window starts held, oldest first."""
        return self._starts

    def add(self, start_ms: int, partition: int, row: Row) -> None:
        """Add (or replace) the window of one partition."""
        if self.first_start_ms is None or start_ms < self.first_start_ms:
            self.first_start_ms = start_ms
        bit = 1 << partition
        seen = self._seen.get(start_ms, 0)
        current = self._values.get(start_ms)
        index = bisect.bisect_left(self._starts, start_ms)
        if seen & bit:
            old = self._parts.get((start_ms, partition))
            if old is None or old == row:
                return  # the same record again
            self._parts[start_ms, partition] = row
            assert current is not None  # (seen)
            self._values[start_ms] = [c - o + r for c, o, r in zip(current, old, row, strict=True)]
        else:
            self._seen[start_ms] = seen | bit
            self._newest = max(self._newest, start_ms)
            if start_ms >= self._newest - KEEP_PARTS_MS:
                self._parts[start_ms, partition] = row
            if current is None:
                self._starts.insert(index, start_ms)
                self._prefix.append([])
                self._values[start_ms] = row  # (never changed in place: replaced)
            else:
                self._values[start_ms] = plus(current, row)
        self._dirty = index if self._dirty is None else min(self._dirty, index)

    def drop_before(self, start_ms: int) -> None:
        """Forget the windows starting before ``start_ms``."""
        self._flush()
        i = bisect.bisect_left(self._starts, start_ms)
        if not i:
            return
        for start in self._starts[:i]:
            del self._values[start]
            del self._seen[start]
        self._parts = {k: v for k, v in self._parts.items() if k[0] >= start_ms}
        del self._starts[:i]
        del self._prefix[:i]  # differences of the remaining prefixes stay exact

    def total(self, lo_ms: int, hi_ms: int) -> Row:
        """Sums over the windows starting in ``[lo_ms, hi_ms)``."""
        self._flush()
        i = bisect.bisect_left(self._starts, lo_ms)
        j = bisect.bisect_left(self._starts, hi_ms)
        return [b - a for a, b in zip(self._prefix[i], self._prefix[j], strict=True)]

    def served(self, lo_ms: int, hi_ms: int) -> bool:
        """Whether any window starting in ``[lo_ms, hi_ms)`` holds a value (of any metric):
        the version served in that span."""
        return any(self.total(lo_ms, hi_ms)[0::3])

    def rows(self, lo_ms: int, hi_ms: int) -> list[tuple[int, Row]]:
        """Each window starting in ``[lo_ms, hi_ms)`` as (start, row), oldest first (merged
        over partitions; the rows are the history's own: do not change them)."""
        i = bisect.bisect_left(self._starts, lo_ms)
        j = bisect.bisect_left(self._starts, hi_ms)
        return [(start, self._values[start]) for start in self._starts[i:j]]

    def _flush(self) -> None:
        if self._dirty is None:
            return
        prefix, values, starts = self._prefix, self._values, self._starts
        for i in range(self._dirty, len(starts)):
            prefix[i + 1] = plus(prefix[i], values[starts[i]])
        self._dirty = None
        cut = self._newest - KEEP_PARTS_MS
        if any(start < cut for start, _ in self._parts):  # fold: merged rows only
            self._parts = {k: v for k, v in self._parts.items() if k[0] >= cut}
