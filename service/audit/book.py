"""Audited estimates of closed windows: per (retriever, segment), and pooled over segments
(``*``), for every metric key, from the windows' exact sums (:mod:`service.audit.estimate`).

A window's live side for a metric is read off its own aggregates: the finalised queries
for which the metric is defined (``queries``, or ``context_queries`` for
``context_precision``), the sums of the live values over labelled ones (an unlabelled
query's live value is 0) and the labelled count.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from service.audit.estimate import AuditSums, Estimate, LiveSums, estimate

POOLED = "*"
"""The segment of an estimate over every segment of a retriever."""


class SliceSums(Protocol):
    """What the estimates read of a window, or of merged windows of one slice (a closed
    window has it; so do a view's merged totals, ``SliceTotals``)."""

    @property
    def queries(self) -> int: ...
    @property
    def context_queries(self) -> int: ...
    @property
    def metrics(self) -> Mapping[str, Any]: ...
    @property
    def audit(self) -> Mapping[str, AuditSums]: ...


class WindowSums(SliceSums, Protocol):
    """A closed window: its sums and its slice (``ClosedWindow`` has it)."""

    @property
    def retriever(self) -> str: ...
    @property
    def segment(self) -> str: ...


@dataclass(slots=True)
class _Totals:
    live: dict[str, list[int]] = field(default_factory=dict)
    """Metric -> [queries, sum_fx, sum_sq_fx, labelled]."""
    audit: dict[str, AuditSums] = field(default_factory=dict)


def estimates(
    windows: Iterable[WindowSums], metric_keys: Iterable[str]
) -> dict[tuple[str, str, str], Estimate]:
    """(retriever, segment, metric) -> its estimate over ``windows`` (segment ``*``: pooled)."""
    return slice_estimates((((w.retriever, w.segment), w) for w in windows), metric_keys)


def slice_estimates(
    sliced: Iterable[tuple[tuple[str, str], SliceSums]], metric_keys: Iterable[str]
) -> dict[tuple[str, str, str], Estimate]:
    """:func:`estimates` of sums that name their slice apart: ((retriever, segment), sums)
    pairs, such as the items of a rolling view (windows already merged per slice). The
    sums are exact integers, so any grouping of the same windows gives the same estimates."""
    keys = tuple(metric_keys)
    totals: dict[tuple[str, str], _Totals] = {}
    for (retriever, own_segment), w in sliced:
        metrics, audit = w.metrics, w.audit  # (once: merged totals build their audit map)
        for segment in (own_segment, POOLED):
            t = totals.setdefault((retriever, segment), _Totals())
            for key in keys:
                moments = metrics.get(key)
                n = w.context_queries if key == "context_precision" else w.queries
                row = t.live.setdefault(key, [0, 0, 0, 0])
                row[0] += n
                if moments is not None:
                    row[1] += moments.sum_fx
                    row[2] += moments.sum_sq_fx
                    row[3] += moments.count
                sums = audit.get(key)
                if sums is not None:
                    t.audit[key] = t.audit[key] + sums if key in t.audit else sums
    out = {}
    for (retriever, segment), t in sorted(totals.items()):
        for key in keys:
            queries, sum_fx, sum_sq_fx, labelled = t.live.get(key, [0, 0, 0, 0])
            live = LiveSums(queries, sum_fx, sum_sq_fx, labelled)
            out[retriever, segment, key] = estimate(live, t.audit.get(key, AuditSums()))
    return out


def estimate_rows(
    windows: Iterable[WindowSums], metric_keys: Iterable[str]
) -> list[dict[str, Any]]:
    """The ``replay --estimates-out`` lines: one object per (retriever, segment, metric)."""
    return [
        {"retriever": r, "segment": s, "metric": m, **e.to_dict()}
        for (r, s, m), e in estimates(windows, metric_keys).items()
    ]
