"""HTTP routes of the detector: ``/api/v1/compare`` and ``/api/v1/regressions``."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query
from pydantic import BaseModel

from service.detect.compare import compare_metrics
from service.detect.model import BoundaryTest, Regression
from service.http.deps import State, span_ms
from service.metrics.aggregates import MetricAggregates, merge
from service.stream.windows import SliceTotals
from service.times import duration_label, rfc3339

router = APIRouter()


class Side(BaseModel):
    """One side of a comparison: labelled queries and the mean (None without data)."""

    n: int
    mean: float | None


class MetricDifference(BaseModel):
    """Welch's test of one metric, candidate minus baseline."""

    metric: str
    baseline: Side
    candidate: Side
    delta: float | None
    ci_low: float | None
    """95% interval of the delta."""
    ci_high: float | None
    p_value: float | None
    """Two-sided, Holm-adjusted over the metrics of this comparison."""
    verdict: str
    """``regression``, ``improvement``, ``no_significant_difference`` or ``insufficient_data``."""


class CompareResponse(BaseModel):
    """``GET /api/v1/compare``."""

    baseline: str
    candidate: str
    segment: str | None
    window: str
    watermark: str | None
    min_labelled: int
    min_effect: float
    metrics: list[MetricDifference]


class RegressionView(BaseModel):
    """An open regression: how it opened and the latest test."""

    retriever: str
    segment: str
    metric: str
    baseline: str
    kind: str
    """The test: ``deploy`` (against the previous version's past), ``canary`` (against the
    previous version over the same span, while both serve) or ``drift`` (against the same
    hours of the day before). A ``labelled_share`` metric: fewer queries got any label."""
    opened_at: str
    evidence_end: str
    baseline_mean: float
    candidate_mean: float
    delta: float
    ci_low: float
    ci_high: float
    """One-sided confidence sequences of the delta at the test's level (valid at every
    look): ``ci_high`` bounds it from above, and is below 0 when the test opened."""
    p_value: float
    """Always valid, adjusted over the test's family (latest look)."""
    e_value: float
    """The one-sided mixture likelihood ratio of a drop, latest look."""
    closed_e_value: float
    """The e-value closed over the slice's metrics (the smallest mean of the e-values of
    any set of them containing this one); it opened at ``1 / level``."""
    alpha: float
    """The error rate of the test's family: the deploy's, or the drift period's budget."""
    level: float
    """This test's share of it (Bonferroni over the family's slices)."""
    n_baseline: int
    n_candidate: int


class RegressionsResponse(BaseModel):
    """``GET /api/v1/regressions``."""

    evaluated_through: str | None
    regressions: list[RegressionView]


def _merged(
    views: dict[tuple[str, str], SliceTotals], retriever: str, segment: str | None
) -> MetricAggregates:
    return merge(
        totals.metrics
        for (r, s), totals in views.items()
        if r == retriever and (segment is None or s == segment)
    )


def _regression(regression: Regression) -> RegressionView:
    latest: BoundaryTest = regression.latest
    ci_low, ci_high = latest.ci  # (computed when asked for: once)
    return RegressionView(
        retriever=latest.retriever,
        segment=latest.segment,
        metric=latest.metric,
        baseline=latest.baseline,
        kind=latest.kind,
        opened_at=rfc3339(regression.opened_ms),
        evidence_end=rfc3339(regression.evidence_end_ms),
        baseline_mean=latest.baseline_mean,
        candidate_mean=latest.candidate_mean,
        delta=latest.delta,
        ci_low=ci_low,
        ci_high=ci_high,
        p_value=latest.p_value,
        e_value=latest.e_value,
        closed_e_value=latest.closed_e_value,
        alpha=latest.family_alpha,
        level=latest.level,
        n_baseline=latest.n_baseline,
        n_candidate=latest.n_candidate,
    )


@router.get("/api/v1/compare")
def compare(
    service: State,
    baseline: Annotated[str, Query(min_length=1, max_length=100)],
    candidate: Annotated[str, Query(min_length=1, max_length=100)],
    window: Annotated[str, Query(max_length=20)] = "24h",
    segment: Annotated[str | None, Query(max_length=100)] = None,
) -> CompareResponse:
    """Per metric: both means, the delta with its 95% interval, the p-value and a verdict.

    Both versions are read from the closed windows that end within ``window`` of the
    watermark (all segments merged unless ``segment`` is given).
    """
    span = span_ms(window)
    retention = service.view.closed.retention_ms
    if span > retention:
        raise HTTPException(
            status_code=422,
            detail=f"window must be at most {duration_label(retention)} (the longest "
            "rolling window kept); raise ROLLING_WINDOWS to compare over longer spans",
        )
    detector = service.detector.config
    with service.lock:
        wm = service.view.watermark_ms
        views = {} if wm is None else service.view.closed.rolling(span, wm)
        base = _merged(views, baseline, segment or None)
        cand = _merged(views, candidate, segment or None)
    rows = compare_metrics(
        base, cand, min_labelled=detector.min_labelled, min_effect=detector.min_effect
    )
    return CompareResponse(
        baseline=baseline,
        candidate=candidate,
        segment=segment or None,
        window=duration_label(span),
        watermark=None if wm is None else rfc3339(wm),
        min_labelled=detector.min_labelled,
        min_effect=detector.min_effect,
        metrics=[MetricDifference.model_validate(row) for row in rows],
    )


@router.get("/api/v1/regressions")
def regressions(service: State) -> RegressionsResponse:
    """The open regressions, oldest first."""
    with service.lock:
        detector = service.detector
        through = detector.through_ms
        rows = [_regression(r) for r in sorted(detector.open.values(), key=lambda r: r.opened_ms)]
    return RegressionsResponse(
        evaluated_through=None if through is None else rfc3339(through), regressions=rows
    )
