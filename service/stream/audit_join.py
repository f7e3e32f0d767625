"""The audit join of one partition: the audit sample's finalised queries, held for
``AUDIT_WINDOW``, and the audit events that grade them.

A query in the audit sample (:func:`service.audit.sample.in_audit_sample`) keeps its chunk
ids while it is pending (the join keeps only their hashes). Once finalised it becomes an
:class:`AuditRequest` (what the judging pipeline is sent) that also holds the query's live
values ``f`` of every metric and whether it was labelled (``g``), read off the very
arrays its window's aggregates were made from.

An audit event lands in the open *audit window* of its own timestamp (tumbling, as the
live windows), and the audit windows close with the live windows of the partition: an
audit of a window that closed is late. At the close each audit, in arrival order, finds
its request: its true values ``y`` (R = the audit's chunks graded >= 1) and ``a`` (the
audit found one) are computed with the metric core, and the query's contribution
:meth:`AuditSums.of(y, a, f, g) <service.audit.estimate.AuditSums.of>` is added to the
audit aggregates of (the query's retriever and segment, the audit's window). The judge
named by ``AUDIT_JUDGE`` counts, or else the first judge to audit the query; a later audit
of the query by that judge replaces its earlier one (the earlier contribution is taken
back in the later audit's window, so every span that holds both counts the last one).
An audit of a query outside the sample, or of no query held (unknown, or past
``AUDIT_WINDOW``), changes no aggregate and is counted.

Audit windows close exactly when live windows do, from audits in offset order, so the
aggregates of a window are a function of the input like the live ones.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from service.audit.estimate import AuditSums
from service.audit.sample import sample_threshold, sampled
from service.errors import EventError
from service.metrics.ir import MetricKey, compute_metrics, judge_batch
from service.stream.agreement import LIVE, delta
from service.stream.events import AuditEvent
from service.times import duration_field, rfc3339_millis

AuditKey = tuple[str, str, int]
"""(retriever, segment, audit window start)."""


@dataclass(frozen=True, slots=True)
class AuditConfig:
    """The audit settings (``AUDIT_RATE``, ``AUDIT_WINDOW``, ``AUDIT_JUDGE``)."""

    rate: float = 0.01
    window_ms: int = duration_field("7d")
    judge: str | None = None
    """The judge whose audits the estimates use; None: the first to audit a query."""


@dataclass(slots=True)
class AuditRequest:
    """A finalised query of the audit sample, held for its audits."""

    query_id: str
    ts_ms: int
    retriever: str
    segment: str
    results: list[str]
    context_k: int
    """-1: none logged."""
    live_grades: dict[str, int]
    """Chunk id -> live grade (of the chunks whose ids the join kept)."""
    f: dict[MetricKey, float]
    """The live value of every metric defined for the query (0 when unlabelled)."""
    g: bool
    applied: list[tuple[int, str, dict[str, int]]] = field(default_factory=list)
    """The audits applied, in offset order: (feedback offset, judge, grades). What each
    contributed is a function of the list up to it, so an audit applied again (a window
    closed again after a restart from an older commit) contributes as the first time."""

    def judge(self, wanted: str | None) -> str | None:
        """The judge whose audits count: ``wanted``, or the first to audit the query."""
        if wanted is not None:
            return wanted
        return self.applied[0][1] if self.applied else None

    def judges(self) -> dict[str, dict[str, int]]:
        """Each judge's last grades of the query (for agreement)."""
        return {judge: grades for _, judge, grades in self.applied}

    def apply(self, offset: int, judge: str, grades: dict[str, int]) -> dict[str, int] | None:
        """Note an audit (once per offset); return the grades of the same judge's audit
        that it replaces (None: its first)."""
        earlier = [g for o, j, g in self.applied if j == judge and o < offset]
        if all(o != offset for o, _, _ in self.applied):
            self.applied.append((offset, judge, grades))
            self.applied.sort(key=lambda audit: audit[0])
        return earlier[-1] if earlier else None

    def to_state(self) -> dict[str, object]:
        """The audit state record (everything, to be taken over by another process)."""
        return {
            "query_id": self.query_id,
            "ts_ms": self.ts_ms,
            "retriever": self.retriever,
            "segment": self.segment,
            "results": self.results,
            "context_k": self.context_k,
            "live_grades": self.live_grades,
            "f": self.f,
            "g": self.g,
            "applied": [list(audit) for audit in self.applied],
        }

    @classmethod
    def from_state(cls, record: dict[str, Any]) -> AuditRequest:
        """Inverse of :meth:`to_state`."""
        return cls(
            str(record["query_id"]),
            int(record["ts_ms"]),
            str(record["retriever"]),
            str(record["segment"]),
            [str(c) for c in record["results"]],
            int(record["context_k"]),
            {str(c): int(g) for c, g in record["live_grades"].items()},
            {str(k): float(v) for k, v in record["f"].items()},
            bool(record["g"]),
            [
                (int(o), str(j), {str(c): int(v) for c, v in g.items()})
                for o, j, g in record["applied"]
            ],
        )

    def to_record(self) -> dict[str, object]:
        """The audit request record (the contract's fields)."""
        record: dict[str, object] = {
            "query_id": self.query_id,
            "timestamp": rfc3339_millis(self.ts_ms),
            "retriever": self.retriever,
            "segment": self.segment,
            "results": self.results,
        }
        if self.context_k >= 0:
            record["context_k"] = self.context_k
        record["live_grades"] = self.live_grades
        return record


@dataclass(slots=True)
class AuditClose:
    """What the audits of one closing audit window add to one slice: the audits counted,
    their sums per metric, and the judge agreement tables per pair."""

    audited: int = 0
    sums: dict[MetricKey, AuditSums] = field(default_factory=dict)
    judges: dict[str, list[int]] = field(default_factory=dict)

    def agree(self, request: AuditRequest, offset: int, judge: str, grades: dict[str, int]) -> None:
        """Add what an audit (at ``offset``) changes in its judge's pairs: with every other
        judge's last audit before it, and with the live labels."""
        last: dict[str, dict[str, int]] = {}
        for o, j, g in request.applied:
            if o < offset:
                last[j] = g
        old = last.pop(judge, None)
        live = dict.fromkeys(request.results, 0)
        live.update(request.live_grades)
        for other, theirs in (*last.items(), (LIVE, live)):
            name, change = delta(judge, grades, old, other, theirs)
            current = self.judges.setdefault(name, [0, 0, 0, 0])
            for i, value in enumerate(change):
                current[i] += value


class AuditJoin:
    """The audit state of one partition (see the module docstring)."""

    def __init__(
        self,
        config: AuditConfig,
        ks: Sequence[int],
        window_ms: int,
        counts: Counter[str] | None = None,
    ) -> None:
        self.config = config
        self.ks = tuple(ks)
        self.window_ms = window_ms
        self.threshold = sample_threshold(config.rate)
        self.sampled: dict[bytes, list[str]] = {}
        """Pending queries of the sample: their chunk ids in rank order."""
        self.named: dict[bytes, dict[int, str]] = {}
        """Pending queries of the sample: hash -> id of chunks their feedback named."""
        self.held: dict[str, AuditRequest] = {}
        self._expiry: deque[tuple[int, str]] = deque()
        self.open: dict[int, list[tuple[int, AuditEvent]]] = {}
        """Audit window start -> its audits (offset, event) in arrival order."""
        self.counts: Counter[str] = counts if counts is not None else Counter()
        """Audits by outcome: counted, replaced, outside_sample, no_query, other_judge."""
        self.changed: dict[str, AuditRequest | None] | None = None
        """Requests made, changed or forgotten (None) since :meth:`take_changes`: the
        audit state records to write with the windows of this close (None: no state is
        written, as in a replay)."""
        self.requests: list[AuditRequest] | None = None
        """Where the requests made are appended, for whoever publishes or writes them
        (None: nobody does)."""

    # -- the sample ----------------------------------------------------------------------

    def in_sample(self, query_id: bytes) -> bool:
        """Whether the query (id as UTF-8) is in the audit sample."""
        return sampled(query_id, self.threshold)

    def query(self, query_id: bytes, chunk_ids: list[str]) -> None:
        """A pending query of the sample: keep its chunk ids."""
        self.sampled[query_id] = chunk_ids

    def feedback(self, query_id: bytes, chunk: int, chunk_id: str) -> None:
        """Feedback of a pending sampled query named ``chunk_id`` (its hash ``chunk``)."""
        names = self.named.get(query_id)
        if names is None:
            names = self.named[query_id] = {}
        names[chunk] = chunk_id

    def finalised(  # noqa: PLR0917 - the finalised query's parts, as the close has them
        self,
        query_id: bytes,
        key: tuple[str, str, int],
        ts_ms: int,
        context_k: int,
        grades: dict[int, int] | None,
        f: dict[MetricKey, float],
    ) -> None:
        """A sampled query was finalised in the window ``key``: hold its request."""
        results = self.sampled.pop(query_id, None)
        names = self.named.pop(query_id, None) or {}
        if results is None:
            return  # (a query taken before this process kept ids: re-read past its window)
        names.update((hash(c), c) for c in results)
        live = {names[h]: g for h, g in (grades or {}).items() if h in names}
        labelled = any(g >= 1 for g in (grades or {}).values())
        request = AuditRequest(
            query_id.decode(), ts_ms, key[0], key[1], results, context_k, live, f, labelled
        )
        known = self.held.get(request.query_id)
        if known is not None and known.ts_ms == ts_ms:  # (taken over: its audits stay)
            request.applied = known.applied
        self.held[request.query_id] = request
        self._note(request.query_id, request)
        self._expiry.append((ts_ms + self.config.window_ms, request.query_id))
        if self.requests is not None:
            self.requests.append(request)

    def forget(self, query_id: bytes) -> None:
        """A pending query left without being finalised (evicted)."""
        self.sampled.pop(query_id, None)
        self.named.pop(query_id, None)

    # -- audits --------------------------------------------------------------------------

    def audit(self, offset: int, event: AuditEvent) -> EventError | None:
        """Take an audit into the open window of its time; an error for an audit more than
        ``AUDIT_WINDOW`` after its query (dead-lettered by the caller)."""
        request = self.held.get(event.query_id)
        if request is not None and event.timestamp_ms > request.ts_ms + self.config.window_ms:
            return EventError(
                "audit_too_late",
                f"an audit of query {event.query_id!r} came "
                f"{(event.timestamp_ms - request.ts_ms) / 86_400_000:.1f} days after it, past "
                "AUDIT_WINDOW; audit within the window, or raise --audit-window",
            )
        start = event.timestamp_ms - event.timestamp_ms % self.window_ms
        self.open.setdefault(start, []).append((offset, event))
        return None

    def min_offset(self) -> int | None:
        """The lowest offset of an audit in an open window (needed to rebuild them)."""
        offsets = [o for audits in self.open.values() for o, _ in audits]
        return min(offsets) if offsets else None

    def close(self, limit: int) -> dict[AuditKey, AuditClose]:
        """Close the audit windows starting at or before ``limit`` (as the live ones);
        return per (retriever, segment, window start) the audits counted, their sums and
        the judge agreement they add."""
        starts = sorted(s for s in self.open if s <= limit)
        out: dict[AuditKey, AuditClose] = {}
        for start in starts:
            audits = self.open.pop(start)
            matched = self._match(audits, start, out)
            if not matched:
                continue
            values = self._true_values(matched, [grades for _, _, _, grades in matched])
            replaced, earlier = [], []
            for m in matched:
                if m[2] is not None:
                    replaced.append(m)
                    earlier.append(m[2])
            before = self._true_values(replaced, earlier) if replaced else None
            row_before = 0
            for row, (_, request, old, _) in enumerate(matched):
                closing = out.setdefault((request.retriever, request.segment, start), AuditClose())
                sums = closing.sums
                for metric, new in self._contribution(request, values, row).items():
                    sums[metric] = sums.get(metric, AuditSums()) + new
                closing.audited += 1
                if old is not None and before is not None:  # the judge's earlier audit goes
                    for metric, gone in self._contribution(request, before, row_before).items():
                        sums[metric] = sums[metric] - gone
                    row_before += 1
                    closing.audited -= 1
                    self.counts["replaced"] += 1
                self.counts["counted"] += 1
                self._note(request.query_id, request)
        return out

    def _match(
        self, audits: list[tuple[int, AuditEvent]], start: int, out: dict[AuditKey, AuditClose]
    ) -> list[tuple[AuditEvent, AuditRequest, dict[str, int] | None, dict[str, int]]]:
        """The audits of a closing window that count, each with its request, the grades of
        the same judge's audit it replaces (None: its first) and its own grades; the
        others are counted by outcome. Every audit of a held query is kept (agreement)."""
        matched = []
        for offset, event in audits:
            request = self.held.get(event.query_id)
            if request is None:
                outside = not self.in_sample(event.query_id.encode())
                self.counts["outside_sample" if outside else "no_query"] += 1
                continue
            if event.timestamp_ms > request.ts_ms + self.config.window_ms:
                self.counts["too_late"] += 1  # (its query was final only after it came)
                continue
            closing = out.setdefault((request.retriever, request.segment, start), AuditClose())
            closing.agree(request, offset, event.judge, event.grades)
            old = request.apply(offset, event.judge, event.grades)
            self._note(request.query_id, request)
            if event.judge != request.judge(self.config.judge):
                self.counts["other_judge"] += 1
                continue
            matched.append((event, request, old, event.grades))
        return matched

    def _true_values(
        self,
        matched: Sequence[tuple[AuditEvent, AuditRequest, object, object]],
        grades: Sequence[dict[str, int]],
    ) -> dict[MetricKey, np.ndarray]:
        """Every metric of the matched queries with R = the chunks ``grades`` call relevant."""
        batch = judge_batch(
            [request.results for _, request, _, _ in matched],
            grades,
            [r.context_k if r.context_k >= 0 else None for _, r, _, _ in matched],
            ideal_depth=max(self.ks),
        )
        values = compute_metrics(batch, self.ks)
        values["__answerable__"] = batch.labelled.astype(np.float64)
        return values

    @staticmethod
    def _contribution(
        request: AuditRequest, values: dict[MetricKey, np.ndarray], row: int
    ) -> dict[MetricKey, AuditSums]:
        a = float(values["__answerable__"][row])
        g = 1.0 if request.g else 0.0
        out = {}
        for metric, f in request.f.items():
            y = float(values[metric][row])
            out[metric] = AuditSums.of(0.0 if math.isnan(y) else y, a, f, g)
        return out

    def expire(self, watermark_ms: int) -> None:
        """Forget requests past ``AUDIT_WINDOW`` (plus a day: a late audit is told so)."""
        queue = self._expiry
        while queue and queue[0][0] + 86_400_000 < watermark_ms:
            expiry, query_id = queue.popleft()
            request = self.held.get(query_id)
            if request is not None and request.ts_ms + self.config.window_ms == expiry:
                del self.held[query_id]
                self._note(query_id, None)

    def _note(self, query_id: str, request: AuditRequest | None) -> None:
        if self.changed is not None:
            self.changed[query_id] = request

    def take_changes(self) -> dict[str, AuditRequest | None]:
        """The requests changed since the last call (None: forgotten), to be written
        (nothing while the state is not kept)."""
        changed = self.changed
        if changed is None:
            return {}
        self.changed = {}
        return changed

    def load(self, requests: Iterable[AuditRequest]) -> None:
        """Hold the requests of the audit state topic (a partition taken over)."""
        for request in requests:
            self.held[request.query_id] = request
            self._expiry.append((request.ts_ms + self.config.window_ms, request.query_id))
        self._expiry = deque(sorted(self._expiry))
