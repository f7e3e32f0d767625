"""The audited estimates' Prometheus series, from the window view at scrape time.

``retrieval_estimate{retriever,segment,metric,window}`` with ``retrieval_estimate_ci_low``
and ``retrieval_estimate_ci_high`` (same labels), and
``retrieval_audited_queries{retriever,segment,window}``: for every rolling window, per
retriever and segment and pooled over segments (``segment="*"``). Global, as the rolling
gauges: read from the same view, every replica exports the same values. The audited count
is there for every slice of the view, 0 included (a count, as
``retrieval_rolling_labelled_queries``: audits that stop coming show).

Only the metrics users read and the detector watches get series (recall@k and hit
rate@k at every configured k, MRR, and the detector's metrics), not every metric key:
three gauges per metric, slice and window would triple the rolling gauges' series, and
``/api/v1/estimates`` has every key. No series without an estimate (no audited
answerable query in the span): no data is not zero.
"""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily, Metric

from service.core.state import ServiceState
from service.http.regression_series import GLOBAL
from service.times import duration_label

EXPORTED_FAMILIES = ("recall", "hit_rate")
"""The at-k families exported at every configured k (besides MRR and the detector's)."""


def exported_metrics(keys: tuple[str, ...], watched: tuple[str, ...]) -> tuple[str, ...]:
    """The metric keys that get estimate series, in the pipeline's order: recall@k and
    hit_rate@k for every k, ``mrr``, and the detector's watched metrics."""
    return tuple(
        key
        for key in keys
        if key.split("@")[0] in EXPORTED_FAMILIES or key == "mrr" or key in watched
    )


def estimate_series(state: ServiceState) -> list[Metric]:
    """The four families over every rolling window of the view (read under the lock)."""
    labels = ["retriever", "segment", "metric", "window"]
    point = GaugeMetricFamily(
        "retrieval_estimate",
        "Audited estimate of the true mean of a metric over answerable queries "
        "(prediction-powered: live values corrected by the audit sample), over the "
        f'rolling window; segment "*": all segments. {GLOBAL}',
        labels=labels,
    )
    low = GaugeMetricFamily(
        "retrieval_estimate_ci_low",
        f"Low end of the 95% interval of retrieval_estimate. {GLOBAL}",
        labels=labels,
    )
    high = GaugeMetricFamily(
        "retrieval_estimate_ci_high",
        f"High end of the 95% interval of retrieval_estimate. {GLOBAL}",
        labels=labels,
    )
    audited = GaugeMetricFamily(
        "retrieval_audited_queries",
        "Audited queries in the rolling window, 0 included (the estimates' sample; below 30, "
        f'read the interval, not the point); segment "*": all segments. {GLOBAL}',
        labels=["retriever", "segment", "window"],
    )
    view = state.view
    exported = set(exported_metrics(view.metric_keys, state.detector.config.metrics))
    for span in view.rolling_ms:
        name = duration_label(span)
        counts: dict[tuple[str, str], int] = {}
        for (retriever, segment, metric), e in view.estimates(span).items():
            # (context_precision counts only the audited queries that logged a context_k)
            slice_key = (retriever, segment)
            counts[slice_key] = max(counts.get(slice_key, 0), e.audited)
            if metric not in exported or e.estimate is None:
                continue  # no data is not zero: no sample at all
            values = [retriever, segment, metric, name]
            point.add_metric(values, e.estimate)
            if e.ci_low is not None and e.ci_high is not None:
                low.add_metric(values, e.ci_low)
                high.add_metric(values, e.ci_high)
        for (retriever, segment), n in counts.items():
            audited.add_metric([retriever, segment, name], n)
    return [point, low, high, audited]
