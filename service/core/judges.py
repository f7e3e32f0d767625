"""Judge agreement over a span: the window records' agreement tables merged over
partitions, slices and windows (:mod:`service.stream.agreement` says what a table is)."""

from __future__ import annotations

from collections.abc import Iterable

from service.stream.agreement import Table, kappa
from service.stream.windows import ClosedWindow


class JudgeBook:
    """Per window start, each pair's table merged over partitions and slices, kept for the
    longest rolling span."""

    def __init__(self, window_ms: int, retention_ms: int) -> None:
        self.window_ms = window_ms
        self.retention_ms = retention_ms
        self._by_start: dict[int, dict[str, list[int]]] = {}
        self._latest_end_ms: int | None = None

    def add(self, windows: Iterable[ClosedWindow]) -> None:
        """Merge the agreement of newly closed windows (each once: the view sees to it)."""
        for w in windows:
            if self._latest_end_ms is None or w.end_ms > self._latest_end_ms:
                self._latest_end_ms = w.end_ms
            if not w.judges:
                continue
            tables = self._by_start.setdefault(w.start_ms, {})
            for name, table in w.judges.items():
                current = tables.setdefault(name, [0, 0, 0, 0])
                for i, n in enumerate(table):
                    current[i] += n
        if self._latest_end_ms is not None:
            horizon = self._latest_end_ms - self.retention_ms - self.window_ms
            for start in [s for s in self._by_start if s < horizon]:
                del self._by_start[start]

    def agreement(self, span_ms: int, until_ms: int) -> dict[str, Table]:
        """Each pair's table over the windows ending within ``span_ms`` before ``until_ms``."""
        out: dict[str, list[int]] = {}
        for start, tables in self._by_start.items():
            if until_ms - span_ms < start + self.window_ms <= until_ms:
                for name, table in tables.items():
                    current = out.setdefault(name, [0, 0, 0, 0])
                    for i, n in enumerate(table):
                        current[i] += n
        return {name: (t[0], t[1], t[2], t[3]) for name, t in sorted(out.items()) if any(t)}


def agreement_rows(tables: dict[str, Table]) -> list[dict[str, object]]:
    """The ``/api/v1/judges`` rows: per pair, its table, count, agreement and kappa."""
    rows = []
    for name, table in tables.items():
        first, second = name.split("|", 1)
        n, agreement, k = kappa(table)
        rows.append(
            {
                "first": first,
                "second": second,
                "count": n,
                "both_relevant": table[0],
                "first_only": table[1],
                "second_only": table[2],
                "neither": table[3],
                "agreement": agreement,
                "kappa": k,
            }
        )
    return rows
