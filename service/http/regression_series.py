"""The regression detector's Prometheus series, read from the service state at scrape time."""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily, Metric

from service.core.state import ServiceState
from service.detect.ledger import CLOSED_KEPT_MS

GLOBAL = "Global: every replica exports the same values, for all partitions."  # (HELP)
CLOSED_SHOWN_MS = CLOSED_KEPT_MS
"""How long a closed regression keeps its ``retrieval_regression_closed_timestamp_seconds``
series: closed within this much event time of the detector's last boundary (as long as
``run``'s detector and ledger keep it; ``replay`` and ``demo`` keep more)."""


def regression_series(state: ServiceState) -> list[Metric]:
    """The detector's series: every comparison tested at the last boundary and every open
    regression (``retrieval_regression`` and its evidence), and the regressions closed
    recently (``retrieval_regression_closed_timestamp_seconds``). All global: empty on a
    replica that does not speak (below)."""
    detector = state.detector
    labels = ["retriever", "segment", "metric", "baseline"]
    flag = GaugeMetricFamily(
        "retrieval_regression",
        "1 while a regression is open (until its version stops serving or its recovery "
        f"test shows the drop gone), else 0 (tested at the last step). {GLOBAL}",
        labels=labels,
    )
    delta = GaugeMetricFamily(
        "retrieval_regression_delta",
        f"Candidate mean minus baseline mean of the latest test (negative: worse). {GLOBAL}",
        labels=labels,
    )
    p_value = GaugeMetricFamily(
        "retrieval_regression_p_value",
        "Always-valid p-value of the sequential test (the smallest so far of its run, "
        f"adjusted over its family): valid however often it is read. {GLOBAL}",
        labels=labels,
    )
    e_value = GaugeMetricFamily(
        "retrieval_regression_e_value",
        "E-value of the latest look of the sequential test (the one-sided mixture "
        "likelihood ratio of a drop); the regression opens when the e-value closed over "
        f"the slice's metrics reaches slices / alpha of its family. {GLOBAL}",
        labels=labels,
    )
    closed_e = GaugeMetricFamily(
        "retrieval_regression_closed_e_value",
        "E-value of the latest look closed over the slice's metrics (the smallest mean of "
        "the e-values of any set of them containing this one): the regression opens when "
        f"it reaches 1 / level. {GLOBAL}",
        labels=labels,
    )
    info = GaugeMetricFamily(
        "retrieval_regression_info",
        "1 for the test behind each regression series: kind deploy (against the previous "
        "version's past), canary (against it over the same span), drift (against the "
        "same hours of the days before) or label_shift (one label source's share fell while "
        f"the others held: a change of the labels, not of retrieval). {GLOBAL}",
        labels=[*labels, "kind"],
    )
    # the global view speaks once it has a boundary, on every replica alike; a local
    # one (a single process's own windows) only while it owns partitions
    view = state.view
    owns = bool(state.pipeline.partitions())
    speaks = view.boundary_ms is not None if view.is_global else owns
    closed = GaugeMetricFamily(
        "retrieval_regression_closed_timestamp_seconds",
        "Event time at which a regression closed, for those closed within the last 7 days "
        "of event time (the latest per series), by reason: rolled_back (a version that "
        "served before it serves instead), superseded (a newer version does) or recovered "
        f"(its recovery test showed the drop gone). {GLOBAL}",
        labels=[*labels, "reason"],
    )
    rows = detector.snapshot() if speaks else []
    through = detector.through_ms
    if speaks and through is not None:
        latest: dict[tuple[str, ...], int] = {}
        for regression in detector.closed:  # in order of closing: the latest wins
            ms, reason = regression.closed_ms, regression.closed_reason
            if ms is not None and reason is not None and ms >= through - CLOSED_SHOWN_MS:
                latest[(*regression.key, str(reason))] = ms
        for label_values, ms in sorted(latest.items()):
            closed.add_metric(list(label_values), ms / 1000)
    for key, is_open, comparison in rows:
        values = list(key)
        flag.add_metric(values, 1.0 if is_open else 0.0)
        delta.add_metric(values, comparison.delta)
        p_value.add_metric(values, comparison.p_value)
        e_value.add_metric(values, comparison.e_value)
        closed_e.add_metric(values, comparison.closed_e_value)
        info.add_metric([*values, str(comparison.kind)], 1.0)
    return [flag, delta, p_value, e_value, closed_e, info, closed]
