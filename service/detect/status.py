"""Every comparison the detector holds, running or not, and why not: the answer to "why
did nothing open" (``GET /api/v1/tests``, ``replay --tests-out``).

At each boundary the detector tells a :class:`ComparisonBook` what it compared and what it
could not compare and why; the book keeps one row per (slice, metric, kind of test),
with the numbers of the latest look (kept when the test stops, so a stopped test still
shows where it ended).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from service.detect.model import POOLED_SEGMENT, BoundaryTest, ComparisonKind, Family, Sums
from service.detect.plans import moments
from service.metrics.ir import MetricKey
from service.stream.windows import SliceKey
from service.times import rfc3339


class WhyNot(StrEnum):
    """Why a comparison is not running at the last boundary."""

    TOO_FEW_VALUES = "too_few_values"
    """A side has fewer than ``min_labelled`` values of the metric (for drift: the slice
    had fewer than that the day before the period began)."""
    NO_BASELINE = "no_baseline"
    """Nothing to compare with: a version seen from the start of the history (no previous
    version), or drift without a day of the slice's history."""
    WATCH_ENDED = "watch_ended"
    """The deploy's watch is over (``REGRESSION_DEPLOY_WATCH``, or the shorter watch of a
    deploy without a day of history)."""
    NOT_SERVING = "not_serving"
    """The version served nothing in the last ``REGRESSION_CANDIDATE``."""


ComparisonKey = tuple[str, str, MetricKey, ComparisonKind]
"""(retriever, segment, metric, kind of test)."""


@dataclass(slots=True)
class ComparisonStatus:
    """One comparison: running or not, and its latest look."""

    retriever: str
    segment: str
    metric: MetricKey
    kind: ComparisonKind
    baseline: str | None
    """The previous version, ``previous_day`` (drift), or None (no baseline)."""
    why_not: WhyNot | None
    """None while it runs."""
    since_ms: int | None = None
    """When its current run began (the deploy, or the drift period)."""
    n_baseline: int = 0
    n_candidate: int = 0
    look: BoundaryTest | None = None
    """Its latest look (None: never looked at)."""
    looked_ms: int | None = None
    """The boundary of that look."""

    def to_record(self) -> dict[str, Any]:
        """The ``replay --tests-out`` line (and the route's row)."""
        look = self.look
        return {
            "retriever": self.retriever,
            "segment": self.segment,
            "metric": self.metric,
            "kind": str(self.kind),
            "baseline": self.baseline,
            "running": self.why_not is None,
            "why_not": None if self.why_not is None else str(self.why_not),
            "since": None if self.since_ms is None else rfc3339(self.since_ms),
            "n_baseline": self.n_baseline,
            "n_candidate": self.n_candidate,
            "delta": None if look is None else look.delta,
            "e_value": None if look is None else look.e_value,
            "closed_e_value": None if look is None else look.closed_e_value,
            "needed_e_value": None if look is None else 1.0 / look.level,
            "p_value": None if look is None else look.p_value,
            "looked_at": None if self.looked_ms is None else rfc3339(self.looked_ms),
        }


class ComparisonBook:
    """The comparisons of every slice the detector holds."""

    def __init__(self, watched: tuple[MetricKey, ...]) -> None:
        self.watched = watched
        self.rows: dict[ComparisonKey, ComparisonStatus] = {}

    def compared(self, key: SliceKey, family: Family, base: Sums, candidate: Sums) -> None:
        """A comparison planned at this boundary: a metric with too few values stays so,
        one looked at runs (:meth:`looked`)."""
        for index, metric in enumerate(self.watched):
            b, c = moments(base, index), moments(candidate, index)
            row = self._row(key, metric, family.kind, family.baseline)
            if row.since_ms != family.start_ms:  # a new run: the last one's look is not its
                row.since_ms, row.look, row.looked_ms = family.start_ms, None, None
            row.n_baseline, row.n_candidate = b.count, c.count
            row.why_not = WhyNot.TOO_FEW_VALUES

    def stopped(
        self, key: SliceKey, kind: ComparisonKind, baseline: str | None, why: WhyNot
    ) -> None:
        """A comparison of every metric of the slice that does not run, and why."""
        for metric in self.watched:
            self._row(key, metric, kind, baseline).why_not = why

    def looked(self, tests: list[BoundaryTest], boundary_ms: int) -> None:
        """The looks made at this boundary."""
        for test in tests:
            row = self._row((test.retriever, test.segment), test.metric, test.kind, test.baseline)
            row.look, row.looked_ms, row.why_not = test, boundary_ms, None

    def kind_of(self, key: SliceKey) -> ComparisonKind:
        """The kind of the slice's deploy comparison so far (a canary, or a deploy)."""
        for metric in self.watched:
            if (*key, metric, ComparisonKind.CANARY) in self.rows:
                return ComparisonKind.CANARY
        return ComparisonKind.DEPLOY

    def forget(self, keep: set[SliceKey]) -> None:
        """Only the slices the detector still holds (and their pooled rows)."""
        retrievers = {r for r, _ in keep}
        self.rows = {
            k: row
            for k, row in self.rows.items()
            if (k[0], k[1]) in keep or (k[1] == POOLED_SEGMENT and k[0] in retrievers)
        }

    def select(
        self, retriever: str | None = None, segment: str | None = None
    ) -> list[ComparisonStatus]:
        """The rows of these slices (all when None), in order."""
        return [
            row
            for k, row in sorted(self.rows.items())
            if (retriever is None or k[0] == retriever) and (segment is None or k[1] == segment)
        ]

    def _row(
        self, key: SliceKey, metric: MetricKey, kind: ComparisonKind, baseline: str | None
    ) -> ComparisonStatus:
        test_key = (*key, metric, kind)
        row = self.rows.get(test_key)
        if row is None:
            row = self.rows[test_key] = ComparisonStatus(
                key[0], key[1], metric, kind, baseline, None
            )
            if kind == ComparisonKind.DEPLOY:  # a promoted canary: one comparison, one row
                self.rows.pop((*key, metric, ComparisonKind.CANARY), None)
        elif baseline is not None:
            row.baseline = baseline
        return row
