"""The ledger of the detector's decisions: what a restarted replica takes back.

A regression stays open while its version serves, for weeks if need be, and closed ones
are history; the windows a replica reads back at start (``history_ms``, about two days)
cannot rebuild them. So in ``run`` every replica writes the detector's decisions to a
compacted topic (``REGRESSIONS_TOPIC``), each record keyed so that compaction keeps what
matters, and reads it back at start (:class:`Ledger`, :meth:`Detector.restore`). Replicas
decide the same on the same windows (the global view), so their records are the same and
duplicates are harmless. Values are JSON, and a regression or a look decodes to one equal
to the one encoded (:mod:`service.detect.codec`).

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
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple

from service.detect.codec import decode_regression, decode_test, encode_regression, encode_test
from service.detect.model import BoundaryTest, Regression
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

# -- keys and values -------------------------------------------------------------------


def _escape(part: str) -> str:
    return part.replace("%", "%25").replace("|", "%7C")


def regression_id(regression: Regression) -> str:
    """``<retriever>|<segment>|<metric>|<baseline>|<opened_at>``: one regression."""
    parts = (*regression.key, rfc3339(regression.opened_ms))
    return "|".join(_escape(p) for p in parts)


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
        """A ledger read back, waiting to be installed: once the detector has evaluated
        the ledger's last boundary, or before its first boundary if that is later."""

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
        for part, group in ((Part.OPEN, opened), (Part.CLOSED, closing)):
            for order, r in enumerate(group):
                value = {
                    "boundary_ms": boundary,
                    "order": order,
                    "regression": encode_regression(r),
                }
                out.append((f"{regression_id(r)}|{part}", _dumps(value)))
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
    """The ones still open, in order of opening."""
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
