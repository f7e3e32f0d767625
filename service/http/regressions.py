"""HTTP routes of the detector: compare, regressions and tests (its comparisons)."""

from __future__ import annotations

import math
from typing import Annotated, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel

from service.detect.compare import compare_metrics
from service.detect.model import BoundaryTest, Regression
from service.detect.recovery import recovery_threshold
from service.http.deps import State, kept_span_ms, since_param
from service.metrics.aggregates import MetricAggregates, merge
from service.stream.rolling import SliceTotals
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
    """A regression: how it opened, its comparison's latest look, its recovery test, and
    how it closed (null while open)."""

    retriever: str
    segment: str
    metric: str
    baseline: str
    kind: str
    """The test: ``deploy`` (against the previous version's past), ``canary`` (against the
    previous version over the same span, while both serve), ``drift`` (against the same
    hours of the days before) or ``label_shift`` (one label source's share, metric
    ``source_labelled_share:<source>``, fell while the others held: the labels changed, not
    retrieval). A ``labelled_share`` metric: fewer queries got any label."""
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
    state: str
    """``open`` or ``closed``."""
    closed_at: str | None
    closed_reason: str | None
    """``rolled_back`` (a version that served before it serves instead), ``superseded``
    (a newer version does) or ``recovered`` (its recovery test showed the drop gone)."""
    recovery_e_value: float | None
    """The recovery test's e-value at the last boundary (None: its baseline's profile
    covers no hour of the day, so it can only close when its version stops serving)."""
    recovery_needed: float
    """The e-value the recovery test needs, held for ``REGRESSION_CLOSE_AFTER``."""
    recovery_drop: float | None
    """The recovery test's null: still worse than the baseline by at least this."""


class RegressionsResponse(BaseModel):
    """``GET /api/v1/regressions``."""

    evaluated_through: str | None
    state: str
    regressions: list[RegressionView]


class ComparisonView(BaseModel):
    """One comparison the detector holds: running, or why not, with its latest look."""

    retriever: str
    segment: str
    metric: str
    kind: str
    baseline: str | None
    running: bool
    why_not: str | None
    """``too_few_values``, ``no_baseline``, ``watch_ended`` or ``not_serving`` (null while
    it runs)."""
    since: str | None
    """When its current run began (the deploy, or the drift period)."""
    n_baseline: int
    n_candidate: int
    delta: float | None
    e_value: float | None
    closed_e_value: float | None
    """The e-value closed over the slice's metrics: a regression opens when it reaches
    ``needed_e_value`` and the drop is at least the minimum effect."""
    needed_e_value: float | None
    p_value: float | None
    looked_at: str | None
    """The boundary of its latest look (null: never looked at)."""


class ComparisonsResponse(BaseModel):
    """``GET /api/v1/tests``."""

    evaluated_through: str | None
    min_labelled: int
    min_effect: float
    tests: list[ComparisonView]


def _merged(
    views: dict[tuple[str, str], SliceTotals], retriever: str, segment: str | None
) -> MetricAggregates:
    return merge(
        totals.metrics
        for (r, s), totals in views.items()
        if r == retriever and (segment is None or s == segment)
    )


def _regression(regression: Regression, needed: float) -> RegressionView:
    latest: BoundaryTest = regression.latest
    ci_low, ci_high = latest.ci  # (computed when asked for: once)
    recovery = regression.recovery
    closed = regression.closed_ms
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
        state="open" if closed is None else "closed",
        closed_at=None if closed is None else rfc3339(closed),
        closed_reason=None if regression.closed_reason is None else str(regression.closed_reason),
        recovery_e_value=None if recovery is None else _exp(regression.recovery_log_e),
        recovery_needed=needed,
        recovery_drop=None if recovery is None else recovery.drop,
    )


def _exp(log_e: float) -> float:
    return math.exp(min(log_e, 700.0))


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
    span = kept_span_ms(window, service.view.closed.retention_ms)
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
def regressions(
    service: State,
    state: Literal["open", "closed", "all"] = "open",
    since: Annotated[str | None, Query(max_length=40)] = None,
) -> RegressionsResponse:
    """The regressions, oldest first: open ones (``state=open``, the default), closed ones
    (``closed``, as many as the detector keeps) or both; ``since`` keeps those open at or
    after it (closed at or after it, or still open)."""
    since_ms = since_param(since)
    with service.lock:
        detector = service.detector
        through = detector.through_ms
        chosen: list[Regression] = []
        if state != "closed":
            chosen += detector.open.values()
        if state != "open":
            chosen += detector.closed
        needed = math.exp(recovery_threshold(detector.config.window_ms))
        rows = [
            _regression(r, needed)
            for r in sorted(chosen, key=lambda r: (r.opened_ms, r.key))
            if since_ms is None or r.closed_ms is None or r.closed_ms >= since_ms
        ]
    return RegressionsResponse(
        evaluated_through=None if through is None else rfc3339(through),
        state=state,
        regressions=rows,
    )


@router.get("/api/v1/tests")
def comparisons(
    service: State,
    retriever: Annotated[str | None, Query(max_length=100)] = None,
    segment: Annotated[str | None, Query(max_length=100)] = None,
) -> ComparisonsResponse:
    """Every comparison the detector holds for these slices (all when absent), running or
    not and why not, with its sample sizes, delta, e-value and the e-value it needs: the
    answer to "why did nothing open"."""
    with service.lock:
        detector = service.detector
        through = detector.through_ms
        rows = [
            ComparisonView.model_validate(row.to_record())
            for row in detector.comparisons.select(retriever or None, segment or None)
        ]
    config = detector.config
    return ComparisonsResponse(
        evaluated_through=None if through is None else rfc3339(through),
        min_labelled=config.min_labelled,
        min_effect=config.min_effect,
        tests=rows,
    )
