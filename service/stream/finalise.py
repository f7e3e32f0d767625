"""Finalising closed windows: the metric core over every closing window at once (and
over the windows due for their early aggregate)."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from service.metrics.aggregates import aggregate_groups
from service.metrics.ir import FloatArray, JudgedBatch, compute_metrics
from service.metrics.packed import judge_packed
from service.stream.audit_step import SampledClose, finalised_requests
from service.stream.join import RANKING_START, PartitionStream, Rows
from service.stream.join_state import WindowKey
from service.stream.labels import SOURCE_BITS
from service.stream.mined import LabelRecorder
from service.stream.windows import ClosedWindow


class _Columns:
    """The queries of several windows as the metric core takes them, one group a window."""

    def __init__(self) -> None:
        self.rankings: list[bytes] = []
        self.labels: list[dict[int, int] | None] = []
        self.context_ks: list[int] = []
        self.groups: list[int] = []
        self.masks: list[int] = []  # per query, the sources of its relevant labels

    def add(self, group: int, rows: Rows) -> range:
        """A window's rows (:meth:`PartitionStream.close`'s); return where they went."""
        packed, grades, window_ks, _, sources = rows
        start = len(self.rankings)
        self.rankings += packed
        self.labels += grades
        self.context_ks += window_ks
        self.masks += sources
        self.groups += [group] * len(packed)
        return range(start, len(self.rankings))

    def judge(self, ks: tuple[int, ...]) -> tuple[JudgedBatch, dict[str, FloatArray]]:
        """The judged batch and its metric values (a row per query)."""
        rankings, labels, context_ks = self.rankings, self.labels, self.context_ks
        batch = judge_packed(rankings, labels, context_ks, ideal_depth=max(ks), skip=RANKING_START)
        return batch, compute_metrics(batch, ks)


def finalise(
    closing: list[tuple[PartitionStream, WindowKey]],
    ks: tuple[int, ...],
    window_ms: int,
    recorder: LabelRecorder | None,
) -> list[ClosedWindow]:
    """Finalise the closing windows of every partition in one vectorised batch through the
    metric core (what makes streaming equal the offline evaluation): their window records,
    and the audit sample's requests (:mod:`service.stream.audit_step`)."""
    if not closing:
        return []
    columns = _Columns()
    mined: list[tuple[dict[str, object], ...]] = []
    sampled: list[SampledClose] = []  # the windows that hold queries of the audit sample
    for group, (stream, key) in enumerate(closing):
        rows = stream.close(key)
        packed, grades, window_ks, ids, _ = rows
        if recorder is not None:
            mined.append(tuple(recorder.finalised(ids, grades, key)))
        span = columns.add(group, rows)
        if stream.audits is not None and stream.audits.sampled:
            sampled.append(SampledClose(stream, key, span, packed, grades, window_ks, ids))
    batch, values = columns.judge(ks)
    for closed_window in sampled:
        finalised_requests(closed_window, values)
    return _windows(closing, batch, values, columns, window_ms=window_ms, mined=mined)


def early_windows(
    due: list[tuple[PartitionStream, WindowKey]], ks: tuple[int, ...], window_ms: int, age_ms: int
) -> list[ClosedWindow]:
    """The early aggregates of open windows (``label_age_ms``: only the labels that came
    within ``age_ms`` of their query), through the same metric core as :func:`finalise`."""
    if not due:
        return []
    columns = _Columns()
    for group, (stream, key) in enumerate(due):
        columns.add(group, stream.early_rows(key))
    batch, values = columns.judge(ks)
    return _windows(due, batch, values, columns, window_ms=window_ms, age_ms=age_ms)


def _windows(
    closing: list[tuple[PartitionStream, WindowKey]],
    batch: JudgedBatch,
    values: dict[str, FloatArray],
    columns: _Columns,
    *,
    window_ms: int,
    mined: list[tuple[dict[str, object], ...]] | None = None,
    age_ms: int | None = None,
) -> list[ClosedWindow]:
    """The window records of the groups of a judged batch (a window per group)."""
    group_index = np.asarray(columns.groups, dtype=np.int64)
    n = len(closing)
    aggregates = aggregate_groups(values, group_index, n)
    n_queries = np.bincount(group_index, minlength=n)
    n_labelled = np.bincount(group_index[batch.labelled], minlength=n)
    n_context = np.bincount(group_index[batch.context_k > 0], minlength=n)
    n_sources = _sources_per_group(columns.masks, group_index, n)
    out = []
    for group, (stream, (retriever, segment, start)) in enumerate(closing):
        if n_queries[group] == 0:
            continue  # every query of it was evicted
        out.append(
            ClosedWindow(
                retriever=retriever,
                segment=segment,
                partition=stream.partition,
                start_ms=start,
                end_ms=start + window_ms,
                queries=int(n_queries[group]),
                labelled=int(n_labelled[group]),
                metrics=aggregates[group],
                labels=mined[group] if mined else (),
                context_queries=int(n_context[group]),
                sources={source: int(column[group]) for source, column in n_sources.items()},
                label_age_ms=age_ms,
            )
        )
    return out


def _sources_per_group(
    masks: list[int], group_index: NDArray[np.int64], n: int
) -> dict[str, NDArray[np.int64]]:
    """Per label source, per group: the queries whose ``masks`` hold its bit."""
    mask = np.asarray(masks, dtype=np.int64)
    return {
        source: np.bincount(group_index[(mask & bit) != 0], minlength=n)
        for source, bit in SOURCE_BITS.items()
    }
