"""The ledger of the detector's decisions: what a restarted replica takes back.

A regression stays open while its version serves, for weeks if need be, and closed ones
are history; the windows a replica reads back at start (``history_ms``, about two days)
cannot rebuild them. So in ``run`` every replica writes the detector's decisions to a
compacted topic (``REGRESSIONS_TOPIC``), each record keyed so that compaction keeps what
matters, and reads it back at start (:class:`Ledger`, :meth:`Detector.restore`). Replicas
decide the same on the same windows (the global view), so their records are the same and
duplicates are harmless. Values are JSON; floats are written with their shortest exact
representation (non-finite ones as the strings ``inf``, ``-inf``, ``nan``), so a decoded
regression equals the one encoded.

Keys (each part with ``%`` and ``|`` percent-escaped):

* ``<retriever>|<segment>|<metric>|<baseline>|<opened_at>|open``: the regression as it
  opened (its opening look, spans, slices, recovery test) and its order among those
  opened at the same boundary;
* ``...|closed``: when and why it closed, and its state then (latest look, recovery
  statistic): a key of its own, so compaction never keeps an older ``open`` record over a
  ``closed`` one written by another replica;
* ``...|look``: its latest look, written when its comparison stops being looked at (so a
  restarted replica shows the delta and p-value the others show);
* ``|through``: the last boundary the writer evaluated.

Every record carries the boundary it was written at; the ledger speaks for every
boundary up to the largest of them (:attr:`Ledger.through_ms`). A closed regression is
kept ``CLOSED_KEPT_MS`` of event time after it closed, then forgotten and its keys
tombstoned (null values).
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple

from service.detect.model import BoundaryTest, CloseReason, ComparisonKind, Regression
from service.detect.recovery import Recovery
from service.metrics.sequential import SequentialResult
from service.times import DAY_MS, rfc3339

CLOSED_KEPT_MS = 7 * DAY_MS
"""How long (event time after ``closed_at``) a closed regression stays in the detector and
the ledger (``/api/v1/regressions?state=closed``)."""
THROUGH_KEY = "|through"

Record = tuple[str, bytes | None]
"""A ledger record: key and JSON value (None: a tombstone)."""


class Part(StrEnum):
    """The last part of a regression's key: which record of it."""

    OPEN = "open"
    CLOSED = "closed"
    LOOK = "look"


_PARTS = frozenset(p.value for p in Part)

# -- encoding ------------------------------------------------------------------------------


def _num(x: float) -> float | str:
    return x if math.isfinite(x) else repr(x)


def _float(v: float | str) -> float:
    return float(v)


def _escape(part: str) -> str:
    return part.replace("%", "%25").replace("|", "%7C")


def regression_id(regression: Regression) -> str:
    """``<retriever>|<segment>|<metric>|<baseline>|<opened_at>``: one regression."""
    parts = (*regression.key, rfc3339(regression.opened_ms))
    return "|".join(_escape(p) for p in parts)


def encode_result(r: SequentialResult) -> dict[str, Any]:
    return {
        "delta": _num(r.delta),
        "variance": _num(r.variance),
        "log_e": _num(r.log_e),
        "log_e_drop": _num(r.log_e_drop),
        "tau": _num(r.tau),
        "alpha": _num(r.alpha),
    }


def decode_result(d: dict[str, Any]) -> SequentialResult:
    return SequentialResult(
        delta=_float(d["delta"]),
        variance=_float(d["variance"]),
        log_e=_float(d["log_e"]),
        log_e_drop=_float(d["log_e_drop"]),
        tau=_float(d["tau"]),
        alpha=_float(d["alpha"]),
    )


_TEST_FLOATS = (
    "baseline_mean",
    "candidate_mean",
    "delta",
    "log_e",
    "closed_log_e",
    "level",
    "family_alpha",
    "p_value",
)


def encode_test(c: BoundaryTest) -> dict[str, Any]:
    """A look, exactly (:func:`decode_test` gives an equal one)."""
    out: dict[str, Any] = {
        "retriever": c.retriever,
        "segment": c.segment,
        "metric": c.metric,
        "baseline": c.baseline,
        "kind": str(c.kind),
        "n_baseline": c.n_baseline,
        "n_candidate": c.n_candidate,
        "look": encode_result(c.look),
        "regressed": c.regressed,
    }
    out.update((name, _num(getattr(c, name))) for name in _TEST_FLOATS)
    return out


def decode_test(d: dict[str, Any]) -> BoundaryTest:
    floats = {name: _float(d[name]) for name in _TEST_FLOATS}
    return BoundaryTest(
        retriever=str(d["retriever"]),
        segment=str(d["segment"]),
        metric=str(d["metric"]),
        baseline=str(d["baseline"]),
        kind=ComparisonKind(d["kind"]),
        n_baseline=int(d["n_baseline"]),
        n_candidate=int(d["n_candidate"]),
        look=decode_result(d["look"]),
        regressed=bool(d["regressed"]),
        **floats,
    )


def encode_recovery(r: Recovery | None) -> dict[str, Any] | None:
    if r is None:
        return None
    return {
        "metric_index": r.metric_index,
        "floors": [None if f is None else _num(f) for f in r.floors],
        "drop": _num(r.drop),
        "margin": _num(r.margin),
        "bet": _num(r.bet),
    }


def decode_recovery(d: dict[str, Any] | None) -> Recovery | None:
    if d is None:
        return None
    return Recovery(
        metric_index=int(d["metric_index"]),
        floors=tuple(None if f is None else _float(f) for f in d["floors"]),
        drop=_float(d["drop"]),
        margin=_float(d["margin"]),
        bet=_float(d["bet"]),
    )


def encode_regression(r: Regression) -> dict[str, Any]:
    """A regression's whole state, exactly (:func:`decode_regression` gives an equal one)."""
    return {
        "opening": encode_test(r.opening),
        "latest": encode_test(r.latest),
        "opened_ms": r.opened_ms,
        "evidence_end_ms": r.evidence_end_ms,
        "since_ms": r.since_ms,
        "slices": [list(s) for s in r.slices],
        "recovery": encode_recovery(r.recovery),
        "recovery_log_e": _num(r.recovery_log_e),
        "recovered_since_ms": r.recovered_since_ms,
        "run_start_ms": r.run_start_ms,
        "closed_ms": r.closed_ms,
        "closed_reason": None if r.closed_reason is None else str(r.closed_reason),
    }


def decode_regression(d: dict[str, Any]) -> Regression:
    reason = d["closed_reason"]
    return Regression(
        opening=decode_test(d["opening"]),
        latest=decode_test(d["latest"]),
        opened_ms=int(d["opened_ms"]),
        evidence_end_ms=int(d["evidence_end_ms"]),
        since_ms=int(d["since_ms"]),
        slices=tuple((str(r), str(s)) for r, s in d["slices"]),
        recovery=decode_recovery(d["recovery"]),
        recovery_log_e=_float(d["recovery_log_e"]),
        recovered_since_ms=_optional_int(d["recovered_since_ms"]),
        run_start_ms=int(d["run_start_ms"]),
        closed_ms=_optional_int(d["closed_ms"]),
        closed_reason=None if reason is None else CloseReason(reason),
    )


def _optional_int(v: Any) -> int | None:
    return None if v is None else int(v)


def _dumps(value: dict[str, Any]) -> bytes:
    return json.dumps(value, allow_nan=False, separators=(",", ":")).encode()


# -- writing -------------------------------------------------------------------------------


class Recorder:
    """The detector's side of the ledger (``run`` only: ``replay`` and ``demo`` keep no
    outbox): the records to write, and a ledger read back that waits to be installed.

    While a ledger waits (a restarted replica evaluating the boundaries it speaks for),
    the detector's decisions are scratch and nothing is written."""

    def __init__(self) -> None:
        self.outbox: list[Record] = []
        """Records to write, oldest first (the Kafka edge takes them: :meth:`take`)."""
        self.pending: Ledger | None = None
        """A ledger read back, installed before the first boundary after it."""

    def due(
        self,
        boundary: int,
        latest: dict[Any, BoundaryTest],
        resume: Callable[[Regression, int], None],
    ) -> Decisions | None:
        """The waiting ledger's decisions, to install before evaluating ``boundary``: the
        first boundary after the last one the ledger speaks for (None: none waits, or not
        yet). ``latest`` are the detector's own looks at the ledger's last boundary, and
        ``resume`` brings an open regression's recovery statistic up to it from the
        windows (:meth:`service.detect.lifecycle.Lifecycle.resume`)."""
        ledger = self.pending
        if ledger is None:
            return None
        through = ledger.through_ms
        if through is not None and boundary <= through:
            return None
        self.pending = None
        decisions = ledger.decisions(latest)
        for regression in decisions.open:
            resume(regression, decisions.through_ms)
        return decisions

    def take(self) -> list[Record]:
        """The records written since the last call, oldest first."""
        out, self.outbox = self.outbox, []
        return out

    def evaluated(
        self,
        boundary: int,
        opened: list[Regression],
        closing: list[Regression],
        left: list[Regression],
    ) -> None:
        """One boundary's decisions: the regressions opened and closed, and the latest
        look of each open regression whose comparison stopped being looked at (``left``:
        looked at the boundary before, not at this one)."""
        if self.pending is not None:
            return
        out = self.outbox
        for order, r in enumerate(opened):
            value = {"boundary_ms": boundary, "order": order, "regression": encode_regression(r)}
            out.append((f"{regression_id(r)}|{Part.OPEN}", _dumps(value)))
        for order, r in enumerate(closing):
            value = {"boundary_ms": boundary, "order": order, "regression": encode_regression(r)}
            out.append((f"{regression_id(r)}|{Part.CLOSED}", _dumps(value)))
        for r in left:
            value = {"boundary_ms": boundary, "look": encode_test(r.latest)}
            out.append((f"{regression_id(r)}|{Part.LOOK}", _dumps(value)))

    def advanced(
        self, through_ms: int, closed: deque[Regression], opened: deque[Regression]
    ) -> tuple[deque[Regression], deque[Regression]]:
        """The end of an ``advance`` that moved to ``through_ms``: write how far, and
        forget the regressions closed ``CLOSED_KEPT_MS`` before it (their keys
        tombstoned). Returns ``closed`` and ``opened`` without them."""
        if self.pending is not None:
            return closed, opened
        gone = set()
        for r in closed:  # (in order of closing)
            if r.closed_ms is None or r.closed_ms + CLOSED_KEPT_MS >= through_ms:
                break
            gone.add(id(r))
            rid = regression_id(r)
            self.outbox += [(f"{rid}|{part}", None) for part in Part]
        self.outbox.append((THROUGH_KEY, _dumps({"boundary_ms": through_ms})))
        if gone:
            closed = deque((r for r in closed if id(r) not in gone), closed.maxlen)
            opened = deque((r for r in opened if id(r) not in gone), opened.maxlen)
        return closed, opened


# -- reading -------------------------------------------------------------------------------


class Decisions(NamedTuple):
    """The ledger's decisions as of its last boundary, as the detector holds them."""

    open: list[Regression]
    opened: list[Regression]
    """Every regression the ledger holds, in order of opening."""
    closed: list[Regression]
    """The closed ones, in order of closing."""
    through_ms: int
    """The boundary they are as of (:attr:`Ledger.through_ms`)."""


@dataclass(slots=True)
class Ledger:
    """The ledger read back: the last value of each key (a null value deletes it)."""

    values: dict[str, dict[str, Any]] = field(default_factory=dict)
    bad_records: int = 0

    def apply(self, key: str, value: bytes | None) -> None:
        """One record, in the topic's order (raises ValueError on a record that is not a
        ledger record: the caller logs it and goes on)."""
        if value is None:
            self.values.pop(key, None)
            return
        try:
            decoded = json.loads(value)
            int(decoded["boundary_ms"])
        except (ValueError, KeyError, TypeError) as error:
            self.bad_records += 1
            raise ValueError(f"not a ledger record ({key!r}): {error}") from error
        self.values[key] = decoded

    @property
    def through_ms(self) -> int | None:
        """The last boundary the ledger speaks for (None: an empty ledger)."""
        return max((int(v["boundary_ms"]) for v in self.values.values()), default=None)

    def decisions(self, latest: dict[Any, BoundaryTest]) -> Decisions:
        """The regressions as the writers held them at :attr:`through_ms`. An open one's
        latest look is ``latest``'s (the reader's own looks at that boundary), else its
        ``look`` record, else its opening; its recovery statistic is left for the
        detector to compute from the windows."""
        parts: dict[str, dict[str, dict[str, Any]]] = {}
        for key, value in self.values.items():
            rid, _, part = key.rpartition("|")
            if part in _PARTS:
                parts.setdefault(rid, {})[part] = value
        opened: list[tuple[tuple[int, int], Regression]] = []
        closed: list[tuple[tuple[int, int], Regression]] = []
        for records in parts.values():
            opening = records.get(Part.OPEN)
            if opening is None:
                continue  # (its open record was tombstoned: forgotten)
            try:
                regression = self._regression(records, opening, latest)
            except (ValueError, KeyError, TypeError):
                self.bad_records += 1
                continue
            opened.append(((int(opening["boundary_ms"]), int(opening["order"])), regression))
            shut = records.get(Part.CLOSED)
            if shut is not None:
                closed.append(((int(shut["boundary_ms"]), int(shut["order"])), regression))
        opened.sort(key=lambda x: x[0])
        closed.sort(key=lambda x: x[0])
        return Decisions(
            open=[r for _, r in opened if r.closed_ms is None],
            opened=[r for _, r in opened],
            closed=[r for _, r in closed],
            through_ms=self.through_ms or 0,
        )

    @staticmethod
    def _regression(
        records: dict[str, dict[str, Any]],
        opening: dict[str, Any],
        latest: dict[Any, BoundaryTest],
    ) -> Regression:
        shut = records.get(Part.CLOSED)
        if shut is not None:  # its state when it closed
            return decode_regression(shut["regression"])
        regression = decode_regression(opening["regression"])
        look = records.get(Part.LOOK)
        if regression.key in latest:
            regression.latest = latest[regression.key]
        elif look is not None:
            regression.latest = decode_test(look["look"])
        return regression
