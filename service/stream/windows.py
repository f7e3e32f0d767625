"""Tumbling event-time windows: closed-window records and rolling views over them.

A window is ``[start, start + size)`` aligned to the Unix epoch, per (retriever,
segment, partition). Once closed it never changes; its published record is
deterministic, so a consumer that keeps the last record per key (a compacted topic)
sees each window exactly once even though publishing is at least once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import msgspec
import orjson

from service.audit.estimate import AuditSums
from service.metrics.aggregates import MetricAggregates, Moments
from service.metrics.ir import MetricKey
from service.stream.labels import SOURCES
from service.times import parse_aware_ms, rfc3339

SliceKey = tuple[str, str]
"""(retriever, segment)."""

WindowIdent = tuple[str, str, int, int]
"""(retriever, segment, window start, partition): one window of one input partition."""


def no_sources() -> dict[str, int]:
    """Per label source (``SOURCES``, all three always), no query."""
    return dict.fromkeys(SOURCES, 0)


def _sources_of(record: Mapping[str, Any] | None) -> dict[str, int]:
    """A window record's ``sources`` object as :attr:`ClosedWindow.sources` (every source;
    a record written before sources were counted has none: zeros)."""
    if not record:
        return no_sources()
    return {source: int(record.get(source, 0)) for source in SOURCES}


def window_start(ts_ms: int, size_ms: int) -> int:
    """Start of the epoch-aligned tumbling window that contains ``ts_ms``."""
    return ts_ms - ts_ms % size_ms


class WindowSink(Protocol):
    """What consumes closed windows downstream of the pipeline (the window view).

    The stream core never imports the detector: whoever composes the two registers it.
    """

    def add(self, windows: Sequence[ClosedWindow]) -> None:
        """Windows that are durable (published and committed, or read back)."""

    def add_early(self, windows: Sequence[ClosedWindow]) -> None:
        """Early windows (``label_age_ms`` set), durable likewise."""

    def advance(self, closed_through_ms: int) -> object:
        """Every window ending at or before ``closed_through_ms`` has closed everywhere
        (every early window, when they are made: the detector's boundary)."""


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
    """Audits counted in ``audit`` (a later audit of a query by the same judge replaces
    its earlier one: counted -1 then +1)."""
    judges: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    """Judge agreement added by the audits of this window: per pair (``"a|b"``, or
    ``"a|live"``) the table (both relevant, only a, only b, neither) on the chunks both
    graded (:mod:`service.stream.agreement`)."""
    sources: Mapping[str, int] = field(default_factory=no_sources)
    """Per label source (``click``, ``citation``, ``judgment``: every one, always), the
    finalised queries with a relevant label (grade >= 1) from that source that the
    labelling rule applied (a query labelled by two sources counts in both)."""
    label_age_ms: int | None = None
    """An early aggregate (``JoinConfig.early_ms``): made once the watermark passed the
    window's end plus this, of the queries then pending, with only the labels that came
    within this of their query (the detector compares both sides at this label age);
    None: the final window."""

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
            "sources": {source: self.sources.get(source, 0) for source in SOURCES},
            **({} if self.label_age_ms is None else {"label_age_ms": self.label_age_ms}),
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
            sources=_sources_of(record.sources),
            label_age_ms=record.label_age_ms,
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
            sources=_sources_of(record.get("sources")),
            label_age_ms=_age_of(record.get("label_age_ms")),
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
    sources: dict[str, int] | None = None
    audit: dict[str, Any] | None = None
    label_age_ms: int | None = None


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


def _age_of(value: Any) -> int | None:
    """A record's ``label_age_ms`` (absent: a final window)."""
    return None if value is None else int(value)


def _parse_ms(text: str) -> int:
    ms = parse_aware_ms(text)
    if ms is None:
        raise ValueError(f"expected RFC 3339 with an offset, got {text!r}")
    return ms
