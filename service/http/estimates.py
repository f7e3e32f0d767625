"""``GET /api/v1/estimates``: the audited estimates of the true metrics beside the live ones.

Read from the window view (global in ``run``: every replica gives the same answer), over
the closed windows that end within ``window`` of the view's end, as the rolling views
are; one row per (retriever, segment, metric), segment ``*`` being every segment of the
retriever pooled. The rows are those of ``replay --estimates-out`` over the same windows.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query
from pydantic import BaseModel

from service.http.deps import State, kept_span_ms
from service.times import duration_label, rfc3339

router = APIRouter()


class EstimateKinds(BaseModel):
    """What each number of a row is (the live one and the audited one differ in kind:
    one is today's number, the other its audited correction)."""

    observed: str = "live labels, labelled queries"
    estimate: str = "audited estimate"
    ci_low: str = "audited estimate, 95% interval, low end"
    ci_high: str = "audited estimate, 95% interval, high end"
    audited: str = "audited queries (the audit sample, judged)"
    queries: str = "finalised queries"
    answerable_share: str = "audited estimate of the share of queries with a relevant chunk"


class EstimateRow(BaseModel):
    """One metric of one slice: the live mean and the audited estimate of the true mean
    over answerable queries (null where there is no data: no audited answerable query
    gives no estimate, no labelled query no observed value)."""

    retriever: str
    segment: str
    """A segment, or ``*``: every segment of the retriever pooled."""
    metric: str
    window: str
    observed: float | None
    estimate: float | None
    ci_low: float | None
    ci_high: float | None
    audited: int
    queries: int
    answerable_share: float | None
    few_audited: bool
    """Fewer than 30 audited queries: read the interval, not the point."""
    kind: EstimateKinds


class EstimatesResponse(BaseModel):
    """``GET /api/v1/estimates``."""

    window: str
    watermark: str | None
    estimates: list[EstimateRow]


@router.get("/api/v1/estimates")
def estimates(
    service: State,
    window: Annotated[str, Query(max_length=20)] = "24h",
    retriever: Annotated[str | None, Query(max_length=100)] = None,
    segment: Annotated[str | None, Query(max_length=100)] = None,
    metric: Annotated[str | None, Query(max_length=40)] = None,
) -> EstimatesResponse:
    """Per retriever, segment (``*``: all pooled) and metric, over the closed windows that
    end within ``window`` of the watermark: the live mean over labelled queries
    (``observed``) and the audited estimate with its 95% interval. ``retriever`` and
    ``segment`` filter (an unknown one gives no rows); ``metric`` must be one of the
    pipeline's metric keys (422 otherwise: a typo would look like no data)."""
    view = service.view
    span = kept_span_ms(window, view.closed.retention_ms)
    keys = view.metric_keys
    if metric and metric not in keys:
        raise HTTPException(
            status_code=422, detail=f"metric must be one of {', '.join(keys)}, got {metric!r}"
        )
    label = duration_label(span)
    kinds = EstimateKinds()
    with service.lock:
        wm = view.watermark_ms
        found = view.estimates(span)
    rows = [
        EstimateRow(retriever=r, segment=s, metric=m, window=label, kind=kinds, **e.to_dict())
        for (r, s, m), e in found.items()
        if (not retriever or r == retriever)
        and (not segment or s == segment)
        and (not metric or m == metric)
    ]
    return EstimatesResponse(
        window=label, watermark=None if wm is None else rfc3339(wm), estimates=rows
    )
