"""A regression and a look, as JSON values and back, exactly (the ledger's values:
:mod:`service.detect.ledger`).

Floats are written with their shortest exact representation (``json``'s ``repr``), so a
decoded value equals the one encoded; non-finite ones (a closed e-value of a metric with
no evidence is ``-inf``) as the strings ``inf``, ``-inf``, ``nan``, so the values stay
standard JSON.
"""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any

from service.detect.model import BoundaryTest, CloseReason, ComparisonKind, Regression
from service.detect.recovery import Recovery
from service.metrics.sequential import SequentialResult


def _num(x: float) -> float | str:
    return x if math.isfinite(x) else repr(x)


def _float(v: float | str) -> float:
    return float(v)


_RESULT_FLOATS = tuple(f.name for f in fields(SequentialResult))
"""Every field of a look's test: all floats."""


def encode_result(r: SequentialResult) -> dict[str, Any]:
    return {name: _num(getattr(r, name)) for name in _RESULT_FLOATS}


def decode_result(d: dict[str, Any]) -> SequentialResult:
    return SequentialResult(**{name: _float(d[name]) for name in _RESULT_FLOATS})


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
