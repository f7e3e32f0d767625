"""Where the audit join meets the pipeline: audit events taken out of a batch before the
live join, requests made as sampled queries are finalised, and audit windows closed into
the window records (:mod:`service.stream.audit_join` has the state and the rules)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from operator import itemgetter
from typing import NamedTuple

import numpy as np

from service.audit.estimate import AuditSums
from service.errors import EventError
from service.metrics.ir import MetricKey
from service.stream.audit_join import AuditRequest
from service.stream.counters import Counts
from service.stream.events import AuditEvent
from service.stream.guard import timestamp_refusal
from service.stream.join import HEADER, PartitionStream
from service.stream.prepared import Prepared, Record
from service.stream.topics import FEEDBACK
from service.stream.windows import ClosedWindow

CONTEXT_PRECISION = "context_precision"


def has_audits(batch: Sequence[Record]) -> bool:
    """Whether a batch holds an audit event (then :func:`take_with_audits` takes it)."""
    return any(type(record[2]) is AuditEvent for record in batch)


def take_with_audits(  # noqa: PLR0917 - the pipeline's take, and what it shares
    stream: PartitionStream,
    batch: Sequence[Record],
    prepared: Prepared | None,
    counts: Counts,
    now_ms: int,
    skew_ms: int,
) -> list[tuple[int, EventError]]:
    """Take a batch with audit events: the audits into the partition's audit join (counted
    once, as any record; with auditing off counted as ignored), the rest into the live
    join (with the batch's columns less the audits': they hold no query); every failure
    with its position in ``batch``, in order."""
    kept: list[Record] = []
    positions: list[int] = []
    failures: list[tuple[int, EventError]] = []
    window_ms = stream.config.window_ms
    latest = stream.watermark.latest
    for position, record in enumerate(batch):
        _, offset, event = record
        if type(event) is not AuditEvent:
            kept.append(record)
            positions.append(position)
            continue
        count = stream.seen(FEEDBACK, offset, now_ms)
        if count:
            counts.events[FEEDBACK] += 1
        ts_ms = event.timestamp_ms
        error = timestamp_refusal(ts_ms, now_ms, skew_ms)
        audits = stream.audits
        if error is None and audits is not None:
            if ts_ms - ts_ms % window_ms + window_ms <= stream.published_through_ms:
                if count:  # (a re-read audit of a published window is expected and silent)
                    counts.late[FEEDBACK] += 1
                continue
            error = audits.audit(offset, event)
            latest[FEEDBACK] = max(latest[FEEDBACK], ts_ms)
        elif error is None:  # auditing is off
            if count:
                counts.ignored[FEEDBACK] += 1
            continue
        if error is not None:
            if count:
                counts.invalid[FEEDBACK, error.reason] += 1
            failures.append((position, error))
    if kept:
        if prepared is not None:
            keys, chunks, levels = prepared.keys, prepared.chunks, prepared.levels
            sources = prepared.sources
            prepared = Prepared(
                prepared.bodies,
                prepared.repeats,
                [keys[i] for i in positions],
                [chunks[i] for i in positions],
                [levels[i] for i in positions],
                [sources[i] for i in positions],
            )
        refused = stream.take(kept, prepared)
        failures += [(positions[at], error) for at, error in refused]
        failures.sort(key=itemgetter(0))
    return failures


class SampledClose(NamedTuple):
    """A closed live window of a partition that holds queries of the audit sample: what
    :meth:`PartitionStream.close` returned, and the rows of its queries in the batch."""

    stream: PartitionStream
    key: tuple[str, str, int]
    rows: range
    packed: Sequence[bytes]
    grades: Sequence[dict[int, int] | None]
    context_ks: Sequence[int]
    ids: Sequence[bytes]


def finalised_requests(closed: SampledClose, values: Mapping[MetricKey, np.ndarray]) -> None:
    """The sampled queries of a closed live window become requests (``values``: the
    arrays the window's aggregates were made from)."""
    stream, key, rows, packed, grades, context_ks, ids = closed
    audits = stream.audits
    if audits is None or not audits.sampled:
        return
    window_ms = stream.config.window_ms
    for i, row in enumerate(rows):
        query_id = ids[i]
        if query_id not in audits.sampled:
            continue
        since = HEADER.unpack_from(packed[i])[0] % window_ms
        f: dict[MetricKey, float] = {}
        for metric, column in values.items():
            value = float(column[row])
            if math.isnan(value):
                if metric == CONTEXT_PRECISION and context_ks[i] <= 0:
                    continue  # (not defined for this query)
                value = 0.0
            f[metric] = value
        audits.finalised(query_id, key, key[2] + since, context_ks[i], grades[i], f)


def close_audits(
    streams: Iterable[PartitionStream], windows: list[ClosedWindow], attribution_ms: int
) -> list[ClosedWindow]:
    """Close every partition's audit windows that the live rule closes now and fold them
    into the closed live windows of the same key (or new records without queries)."""
    out = {w.ident: w for w in windows}
    for stream in streams:
        audits = stream.audits
        if audits is None:
            continue
        wm = stream.watermark_ms
        window_ms = stream.config.window_ms
        limit = wm - attribution_ms - window_ms
        for (retriever, segment, start), closing in audits.close(limit).items():
            ident = (retriever, segment, start, stream.partition)
            window = out.get(ident)
            if window is None:
                window = ClosedWindow(
                    retriever, segment, stream.partition, start, start + window_ms, 0, 0
                )
            out[ident] = replace(
                window,
                audit=_merged(window.audit, closing.sums),
                audited=closing.audited,
                judges={k: tuple(v) for k, v in closing.judges.items() if any(v)},
            )
        audits.expire(wm)
    return list(out.values())


def _merged(
    a: Mapping[MetricKey, AuditSums], b: Mapping[MetricKey, AuditSums]
) -> dict[MetricKey, AuditSums]:
    merged = dict(a)
    for key, sums in b.items():
        merged[key] = merged[key] + sums if key in merged else sums
    return merged


class AuditDoors:
    """The pipeline's doors to the audit joins of its partitions (the edges never touch
    the joins' state): the requests made, the state changed, the state read back."""

    streams: dict[int, PartitionStream]
    audit_requests: list[AuditRequest] | None

    def keep_audit_requests(self, into: list[AuditRequest]) -> None:
        """Append the audit requests of every partition, assigned now or later, to ``into``
        as they are made (``replay --audit-requests-out``, ``AUDIT_TOPIC``; nothing while
        auditing is off)."""
        self.audit_requests = into
        for stream in self.streams.values():
            if stream.audits is not None:
                stream.audits.requests = into

    def take_audit_requests(self) -> list[AuditRequest]:
        """The audit requests made since the last call (kept only after
        :meth:`keep_audit_requests`)."""
        if not self.audit_requests:
            return []
        taken = list(self.audit_requests)
        self.audit_requests.clear()  # (the same list: every partition appends to it)
        return taken

    def audit_changes(self) -> dict[int, dict[str, AuditRequest | None]]:
        """Per partition, the audit requests made, changed or forgotten (None) since the
        last call: the audit state records to write with the windows just closed."""
        return {
            p: stream.audits.take_changes()
            for p, stream in self.streams.items()
            if stream.audits is not None and stream.audits.changed
        }

    def load_audits(self, partition: int, requests: Iterable[AuditRequest]) -> None:
        """A partition taken over holds the requests of its audit state (read back)."""
        audits = self.streams[partition].audits
        if audits is not None:
            audits.load(requests)
