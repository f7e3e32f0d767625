"""The label sources' Prometheus series, read from the rolling views at scrape time.

``retrieval_rolling_source_labelled_ratio{retriever,segment,source,window}``: per slice and
rolling span, the share of finalised queries with a relevant label from each source
(``click``, ``citation``, ``judgment``). A source that falls while the others of its slice
hold is a change of the labels (a prompt that cites less, a page that is clicked less),
not of retrieval. Global, like the other rolling gauges: every replica exports the same
values, from the closed windows of all partitions.
"""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily, Metric

from service.core.state import ServiceState
from service.http.regression_series import GLOBAL
from service.times import duration_label


def source_series(state: ServiceState) -> list[Metric]:
    """``retrieval_rolling_source_labelled_ratio`` of every slice with finalised queries in
    each rolling span (no sample for a slice without queries: no data is not zero). Read
    under the state's lock (the caller holds it)."""
    ratio = GaugeMetricFamily(
        "retrieval_rolling_source_labelled_ratio",
        "Share of finalised queries with a relevant label (grade >= 1) from the source "
        f"(click, citation, judgment) in the rolling view. {GLOBAL}",
        labels=["retriever", "segment", "source", "window"],
    )
    view = state.view
    wm = view.watermark_ms
    if wm is not None:
        for span in view.rolling_ms:
            name = duration_label(span)
            for (retriever, segment), totals in sorted(view.closed.rolling(span, wm).items()):
                for source, share in totals.source_labelled_share.items():
                    if share is not None:
                        ratio.add_metric([retriever, segment, source, name], share)
    return [ratio]
