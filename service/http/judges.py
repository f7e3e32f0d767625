"""``GET /api/v1/judges``: judge agreement over a rolling span, for every pair of judges
and every judge against the live labels (``second`` is ``live``), on the chunks both
graded: the 2x2 table of relevant or not, the share of agreement and Cohen's kappa."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BaseModel

from service.core.judges import agreement_rows
from service.http.deps import State, span_ms
from service.times import duration_label as span_label
from service.times import rfc3339

router = APIRouter()


class JudgePair(BaseModel):
    """The agreement of two judges (or a judge and the live labels) over the span."""

    first: str
    second: str
    """A judge, or ``live`` (the live labels: every result 0 without a signal)."""
    count: int
    """Chunks both graded."""
    both_relevant: int
    first_only: int
    second_only: int
    neither: int
    agreement: float | None
    """The share of those chunks both call relevant or both call not relevant."""
    kappa: float | None
    """Cohen's kappa (None where both always say the same one thing)."""


class JudgesResponse(BaseModel):
    window: str
    watermark: str | None
    pairs: list[JudgePair]


@router.get("/api/v1/judges")
def judges(
    service: State,
    window: Annotated[str, Query(max_length=20)] = "24h",
    judge: Annotated[str | None, Query(max_length=100)] = None,
) -> JudgesResponse:
    """Judge agreement over the last ``window`` of closed windows (``judge``: only the
    pairs it is in)."""
    span = span_ms(window)
    with service.lock:
        wm = service.view.watermark_ms
        tables = {} if wm is None else service.view.judges.agreement(span, wm)
    pairs = [JudgePair.model_validate(row) for row in agreement_rows(tables)]
    if judge:
        pairs = [p for p in pairs if judge in (p.first, p.second)]
    return JudgesResponse(
        window=span_label(span), watermark=None if wm is None else rfc3339(wm), pairs=pairs
    )
