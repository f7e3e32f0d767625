"""Offline evaluation of a whole event log, window by window, without any streaming.

This is the reference the streaming pipeline must equal: every query event with the
feedback of the same ``query_id`` inside ``[ts - clock_skew, ts + attribution]``,
grades maximised, chunk ids compared as strings, and the metric core applied to each
tumbling window; per window, the queries with a relevant label (grade >= 1) from each
source, counted from the signal names. It assumes an in-order log (no late or
duplicate handling beyond "first query event of an id wins"), which is what a clean,
in-bound stream is.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence

import numpy as np

from service.audit.estimate import AuditSums
from service.audit.sample import in_audit_sample
from service.metrics.aggregates import aggregate_groups
from service.metrics.ir import DEFAULT_KS, compute_metrics, judge_batch
from service.stream.events import AuditEvent, FeedbackEvent, QueryEvent
from service.stream.labels import SOURCES, LabelPolicy
from service.stream.windows import ClosedWindow, window_start


def evaluate_event_log(
    queries: Iterable[QueryEvent],
    feedback: Iterable[FeedbackEvent],
    *,
    window_ms: int = 5 * 60_000,
    attribution_ms: int = 30 * 60_000,
    clock_skew_ms: int = 5_000,
    ks: Sequence[int] = DEFAULT_KS,
    policy: LabelPolicy | None = None,
    partition_of: dict[str, int] | None = None,
) -> dict[str, ClosedWindow]:
    """Closed-window records keyed like the published ones (partition 0 unless mapped)."""
    policy = policy or LabelPolicy()
    by_query: dict[str, list[FeedbackEvent]] = defaultdict(list)
    for event in feedback:
        by_query[event.query_id].append(event)
    seen: set[str] = set()
    rankings: list[list[str]] = []
    judgments: list[dict[str, int]] = []
    context_ks: list[int | None] = []
    keys: list[tuple[str, str, int, int]] = []
    labelled_by: dict[tuple[str, str, int, int], Counter[str]] = defaultdict(Counter)
    for query in queries:
        if query.query_id in seen:
            continue
        seen.add(query.query_id)
        ts = query.timestamp_ms
        grades: dict[str, int] = {}
        sources: set[str] = set()
        for event in by_query.get(query.query_id, ()):
            if ts - clock_skew_ms <= event.timestamp_ms <= ts + attribution_ms:
                grade = policy.grade(event)
                grades[event.chunk_id] = max(grade, grades.get(event.chunk_id, -1))
                if grade >= 1:
                    sources.add(event.signal)
        rankings.append(query.chunk_ids())
        judgments.append(grades)
        context_ks.append(query.context_k)
        partition = (partition_of or {}).get(query.query_id, 0)
        key = (query.retriever, query.segment, window_start(ts, window_ms), partition)
        keys.append(key)
        labelled_by[key].update(sources)
    distinct = sorted(set(keys))
    index = {key: i for i, key in enumerate(distinct)}
    groups = np.asarray([index[key] for key in keys], dtype=np.int64)
    batch = judge_batch(rankings, judgments, context_ks, ideal_depth=max(ks))
    aggregates = aggregate_groups(compute_metrics(batch, ks), groups, len(distinct))
    n_queries = np.bincount(groups, minlength=len(distinct))
    n_labelled = np.bincount(groups[batch.labelled], minlength=len(distinct))
    n_context = np.bincount(groups[batch.context_k > 0], minlength=len(distinct))
    out = {}
    for i, key in enumerate(distinct):
        retriever, segment, start, partition = key
        window = ClosedWindow(
            retriever=retriever,
            segment=segment,
            partition=partition,
            start_ms=start,
            end_ms=start + window_ms,
            queries=int(n_queries[i]),
            labelled=int(n_labelled[i]),
            metrics=aggregates[i],
            context_queries=int(n_context[i]),
            sources={source: labelled_by[key][source] for source in SOURCES},
        )
        out[window.key] = window
    return out


def audit_totals(
    queries: Iterable[QueryEvent],
    feedback: Iterable[FeedbackEvent],
    audits: Iterable[AuditEvent],
    *,
    rate: float,
    judge: str | None = None,
    audit_window_ms: int = 7 * 86_400_000,
    attribution_ms: int = 30 * 60_000,
    clock_skew_ms: int = 5_000,
    ks: Sequence[int] = DEFAULT_KS,
    policy: LabelPolicy | None = None,
) -> dict[tuple[str, str], dict[str, AuditSums]]:
    """The audited sums per (retriever, segment) of a whole event log, computed directly:
    each query of the audit sample (first event of an id) with its live labels as above
    and the last audit of the judge that counts (``judge``, else the first to audit it;
    audits in log order, none past ``audit_window_ms``). What the streaming audit join's
    window records must add up to."""
    policy = policy or LabelPolicy()
    by_query: dict[str, list[FeedbackEvent]] = defaultdict(list)
    for event in feedback:
        by_query[event.query_id].append(event)
    counted: dict[str, AuditEvent] = {}
    for audit in audits:
        wanted = judge or (counted[audit.query_id].judge if audit.query_id in counted else None)
        if wanted is None or audit.judge == wanted:
            counted[audit.query_id] = audit
    sampled: list[QueryEvent] = []
    seen: set[str] = set()
    for query in queries:
        if query.query_id in seen:
            continue
        seen.add(query.query_id)
        last = counted.get(query.query_id)
        if last is None or not in_audit_sample(query.query_id, rate):
            continue
        if last.timestamp_ms <= query.timestamp_ms + audit_window_ms:
            sampled.append(query)
    live = [
        _live_grades(q, by_query.get(q.query_id, ()), clock_skew_ms, attribution_ms, policy)
        for q in sampled
    ]
    rankings = [q.chunk_ids() for q in sampled]
    context_ks = [q.context_k for q in sampled]
    f = compute_metrics(judge_batch(rankings, live, context_ks, ideal_depth=max(ks)), ks)
    truth = judge_batch(
        rankings, [counted[q.query_id].grades for q in sampled], context_ks, ideal_depth=max(ks)
    )
    y = compute_metrics(truth, ks)
    out: dict[tuple[str, str], dict[str, AuditSums]] = {}
    for i, query in enumerate(sampled):
        g = 1.0 if any(grade >= 1 for grade in live[i].values()) else 0.0
        a = float(truth.labelled[i])
        sums = out.setdefault((query.retriever, query.segment), {})
        for key in f:
            if key == "context_precision" and not (query.context_k or 0) > 0:
                continue  # (not defined without a context)
            fv, yv = float(f[key][i]), float(y[key][i])
            add = AuditSums.of(_zero_nan(yv), a, _zero_nan(fv), g)
            sums[key] = sums[key] + add if key in sums else add
    return out


def _zero_nan(value: float) -> float:
    """A metric of a query without relevant chunks (NaN) counts 0 in the audited sums."""
    return 0.0 if math.isnan(value) else value


def _live_grades(
    query: QueryEvent,
    feedback: Iterable[FeedbackEvent],
    clock_skew_ms: int,
    attribution_ms: int,
    policy: LabelPolicy,
) -> dict[str, int]:
    """A query's live grades: its feedback within the attribution bounds, maximised."""
    grades: dict[str, int] = {}
    ts = query.timestamp_ms
    for event in feedback:
        if ts - clock_skew_ms <= event.timestamp_ms <= ts + attribution_ms:
            grades[event.chunk_id] = max(policy.grade(event), grades.get(event.chunk_id, -1))
    return grades
