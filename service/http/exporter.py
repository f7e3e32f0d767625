"""Prometheus exposition: a custom collector that reads the pipeline at each scrape.

Summaries and finalised counts come from *published* windows only, so ``/metrics`` agrees
with the ``retrieval.windows`` topic by construction and a restart that re-reads unpublished
records does not count them twice. Registered on the registry passed in, never the global one.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector

from service.core.state import ServiceState
from service.metrics.aggregates import SCALE
from service.stream.topics import TOPICS, Topic
from service.times import DAY_MS, duration_label

SUMMARY_FAMILIES = {
    "hit_rate": ("retrieval_hit", "1 if a relevant chunk is in the top k (success@k)"),
    "recall": ("retrieval_recall", "relevant chunks in the top k / all relevant chunks"),
    "precision": ("retrieval_precision", "relevant chunks in the top k / k"),
    "ndcg": ("retrieval_ndcg", "nDCG@k, linear gain, ideal from all graded chunks"),
}
GLOBAL = "Global: every replica exports the same values, for all partitions."  # (HELP)
ROLLING_FAMILIES = {
    "hit_rate": "retrieval_rolling_hit_rate",
    "recall": "retrieval_rolling_recall",
    "precision": "retrieval_rolling_precision",
    "ndcg": "retrieval_rolling_ndcg",
}
CLOSED_SHOWN_MS = 7 * DAY_MS
"""How long a closed regression keeps its ``retrieval_regression_closed_timestamp_seconds``
series: closed within this much event time of the detector's last boundary."""


class PipelineCollector(Collector):
    """Every series of the contract, read under the state's lock at scrape time."""

    def __init__(self, state: ServiceState) -> None:
        self.state = state
        self.pipeline = state.pipeline
        self.detector = state.detector
        self.lock = state.lock
        self.topics = state.topic_names
        self.health = state.health

    def collect(self) -> Iterator[Metric]:
        with self.lock:
            metrics = list(self._counters()) + list(self._summaries()) + list(self._rolling())
            metrics += list(self._health()) + list(self._regressions())
        yield from metrics

    def _counters(self) -> Iterator[Metric]:
        c = self.pipeline.counts
        topic = self.topics
        queries = CounterMetricFamily(
            "retrieval_queries", "Query events accepted.", labels=["retriever", "segment"]
        )
        for (retriever, segment), n in sorted(c.queries.items()):
            queries.add_metric([retriever, segment], n)
        yield queries
        finalized = CounterMetricFamily(
            "retrieval_queries_finalized",
            "Queries finalised in published windows, by whether they had a relevant chunk.",
            labels=["retriever", "segment", "labelled"],
        )
        for (retriever, segment, labelled), n in sorted(c.finalized.items()):
            finalized.add_metric([retriever, segment, "true" if labelled else "false"], n)
        yield finalized
        yield _by_topic("retrieval_events", "Records consumed.", c.events, topic)
        yield _by_topic("retrieval_ignored_records", "Records the mapping skips.", c.ignored, topic)
        invalid = CounterMetricFamily(
            "retrieval_invalid_events",
            "Records rejected (and dead-lettered), by reason.",
            labels=["topic", "reason"],
        )
        for (kind, reason), n in sorted(c.invalid.items()):
            invalid.add_metric([topic[kind], reason], n)
        yield invalid
        yield _by_label(
            "retrieval_feedback_unmatched",
            "Feedback not applied to any query, by reason (no_query, outside_window).",
            "reason",
            c.unmatched,
        )
        yield _by_topic(
            "retrieval_late_events", "Records after their query was final.", c.late, topic
        )
        yield _by_topic(
            "retrieval_duplicate_events",
            "Query events with an id already pending.",
            c.duplicates,
            topic,
        )
        yield _by_label("retrieval_evicted", "State dropped at the caps.", "kind", c.evicted)
        yield _by_label(
            "retrieval_label_overflow",
            "Label values replaced by 'other' at the cap.",
            "label",
            c.label_overflow,
        )
        dup = CounterMetricFamily(
            "retrieval_duplicate_results", "Query events whose results repeat a chunk id."
        )
        dup.add_metric([], c.duplicate_results)
        yield dup
        published = CounterMetricFamily("retrieval_windows_published", "Closed windows published.")
        published.add_metric([], c.windows_published)
        yield published
        first = GaugeMetricFamily(
            "retrieval_retriever_first_seen_timestamp_seconds",
            "Event time of the first query seen from each retriever version.",
            labels=["retriever"],
        )
        for retriever, ms in sorted(c.first_seen_ms.items()):
            first.add_metric([retriever], ms / 1000)
        yield first

    def _summaries(self) -> Iterator[Metric]:
        by_family: dict[str, SummaryMetricFamily] = {}
        for family, (name, doc) in SUMMARY_FAMILIES.items():
            by_family[family] = SummaryMetricFamily(
                name, f"Per finalised labelled query: {doc}.", labels=["retriever", "segment", "k"]
            )
        rr = SummaryMetricFamily(
            "retrieval_reciprocal_rank",
            "Per finalised labelled query: 1/rank of the first relevant result (0 if none).",
            labels=["retriever", "segment"],
        )
        cp = SummaryMetricFamily(
            "retrieval_context_precision",
            "Per finalised labelled query with context_k: relevant in the first context_k, share.",
            labels=["retriever", "segment"],
        )
        for (retriever, segment), metrics in sorted(self.pipeline.counts.published.items()):
            for key, moments in metrics.items():
                total = moments.sum_fx / SCALE
                if key == "mrr":
                    rr.add_metric([retriever, segment], moments.count, total)
                elif key == "context_precision":
                    cp.add_metric([retriever, segment], moments.count, total)
                else:
                    family, k = key.split("@")
                    by_family[family].add_metric([retriever, segment, k], moments.count, total)
        yield from by_family.values()
        yield rr
        yield cp

    def _rolling(self) -> Iterator[Metric]:
        view = self.state.view
        wm = view.watermark_ms
        families = {
            f: GaugeMetricFamily(
                n,
                f"Rolling {f}@k over closed windows. {GLOBAL}",
                labels=["retriever", "segment", "k", "window"],
            )
            for f, n in ROLLING_FAMILIES.items()
        }
        labels3 = ["retriever", "segment", "window"]
        mrr = GaugeMetricFamily(
            "retrieval_rolling_mrr", f"Rolling MRR over closed windows. {GLOBAL}", labels=labels3
        )
        cp = GaugeMetricFamily(
            "retrieval_rolling_context_precision",
            f"Rolling context precision. {GLOBAL}",
            labels=labels3,
        )
        labelled = GaugeMetricFamily(
            "retrieval_rolling_labelled_queries",
            f"Labelled queries in the rolling view. {GLOBAL}",
            labels=labels3,
        )
        ratio = GaugeMetricFamily(
            "retrieval_rolling_unlabelled_ratio",
            f"Share of finalised queries without a relevant chunk in the rolling view. {GLOBAL}",
            labels=labels3,
        )
        if wm is not None:
            for span in view.rolling_ms:
                name = duration_label(span)
                for (retriever, segment), totals in sorted(view.closed.rolling(span, wm).items()):
                    labelled.add_metric([retriever, segment, name], totals.labelled)
                    if totals.unlabelled_ratio is not None:
                        ratio.add_metric([retriever, segment, name], totals.unlabelled_ratio)
                    for key, moments in totals.metrics.items():
                        mean = moments.mean
                        if mean is None:
                            continue  # no data is not zero: no sample at all
                        if key == "mrr":
                            mrr.add_metric([retriever, segment, name], mean)
                        elif key == "context_precision":
                            cp.add_metric([retriever, segment, name], mean)
                        else:
                            family, k = key.split("@")
                            families[family].add_metric([retriever, segment, k, name], mean)
        yield from families.values()
        yield from (mrr, cp, labelled, ratio)

    def _health(self) -> Iterator[Metric]:
        p = self.pipeline
        yield GaugeMetricFamily(
            "retrieval_pending_queries", "Queries awaiting finalisation.", value=p.pending_queries
        )
        yield GaugeMetricFamily(
            "retrieval_pending_feedback",
            "Feedback events waiting for their query.",
            value=p.pending_feedback,
        )
        yield _seconds(
            "retrieval_watermark_timestamp_seconds",
            "Event-time watermark: the minimum over assigned partitions.",
            p.watermark_ms,
        )
        lag = GaugeMetricFamily(
            "retrieval_consumer_lag", "Records not yet consumed.", labels=["topic", "partition"]
        )
        for (topic, partition), n in sorted(self.health.lag.items()):
            lag.add_metric([topic, str(partition)], n)
        yield lag
        paused = GaugeMetricFamily(
            "retrieval_consumer_paused",
            "1 while backpressure pauses the topic partition (its event time leads).",
            labels=["topic", "partition"],
        )
        for topic, partition in sorted(self.health.lag):
            paused.add_metric([topic, str(partition)], (topic, partition) in self.health.paused)
        yield paused
        yield GaugeMetricFamily(
            "retrieval_assigned_partitions",
            "Partitions assigned to this process.",
            value=self.health.assigned,
        )
        yield _seconds(
            "retrieval_last_poll_timestamp_seconds",
            "Wall-clock time of the last poll.",
            self.health.last_poll_ms,
        )
        yield CounterMetricFamily(
            "retrieval_commits",
            "Commits that succeeded (input offsets, with the windows sent since the last).",
            value=self.health.commits,
        )
        yield _seconds(
            "retrieval_last_commit_timestamp_seconds",
            "Wall-clock time of the last commit that succeeded.",
            self.health.last_commit_ms,
        )
        yield from self._broker()
        view = self.state.view
        if view.is_global:
            yield _seconds(
                "retrieval_global_view_boundary_timestamp_seconds",
                "Global view: every window ending at or before this is in, from all replicas.",
                view.boundary_ms,
            )
            bad = CounterMetricFamily(
                "retrieval_global_view_bad_records",
                "Global view: records of the windows topic that were not window records "
                "(skipped and logged; only this service should write to that topic).",
            )
            bad.add_metric([], view.bad_records)
            yield bad
            yield GaugeMetricFamily(
                "retrieval_global_view_partitions_behind",
                "Global view: input partitions left out of the boundary (stalled or unowned).",
                value=len(view.behind),
            )
            yield _seconds(
                "retrieval_global_view_delay_seconds",
                "Global view: wall time from a window's publication to its arrival in the view.",
                view.delay_ms,
            )
        dead = CounterMetricFamily(
            "retrieval_deadletter_records", "Records sent to the dead-letter topic."
        )
        dead.add_metric([], self.health.deadletters)
        yield dead

    def _broker(self) -> Iterator[Metric]:
        """Connectivity to the broker and the time spent waiting on it."""
        health, now = self.health, self.state.wall_ms()
        connected = GaugeMetricFamily(
            "retrieval_broker_connected",
            "1 while a connection to a Kafka broker is up (at the loop's last turn), else 0.",
        )
        unreachable = GaugeMetricFamily(
            "retrieval_broker_unreachable_seconds",
            "For how long no broker connection has been up (0 while one is).",
        )
        if health.broker_connected is not None:
            connected.add_metric([], 1.0 if health.broker_connected else 0.0)
            since = health.unreachable_since_ms
            unreachable.add_metric([], 0.0 if since is None else (now - since) / 1000)
        yield connected
        yield unreachable
        waited = CounterMetricFamily(
            "retrieval_broker_wait_seconds",
            "Wall time the processing loop spent in broker calls, per call (poll, commit, "
            "rebuild, lag): finished calls; the current one is retrieval_broker_waiting_seconds.",
            labels=["call"],
        )
        for call, ms in sorted(health.waited_ms.items()):
            waited.add_metric([call], ms / 1000)
        yield waited
        wait = health.wait
        yield GaugeMetricFamily(
            "retrieval_broker_waiting_seconds",
            "How long the processing loop has been inside its current broker call (0: none).",
            value=0.0 if wait is None else (now - wait.since_ms) / 1000,
        )

    def _regressions(self) -> Iterator[Metric]:
        labels = ["retriever", "segment", "metric", "baseline"]
        flag = GaugeMetricFamily(
            "retrieval_regression",
            f"1 while a significant regression is open, else 0 (tested at the last step). {GLOBAL}",
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
            "version's past), canary (against it over the same span) or drift (against the "
            f"same hours the day before). {GLOBAL}",
            labels=[*labels, "kind"],
        )
        # the global view speaks once it has a boundary, on every replica alike; a local
        # one (a single process's own windows) only while it owns partitions
        view = self.state.view
        owns = bool(self.pipeline.partitions())
        speaks = view.boundary_ms is not None if view.is_global else owns
        closed = GaugeMetricFamily(
            "retrieval_regression_closed_timestamp_seconds",
            "Event time at which a regression closed, for those closed within the last 7 days "
            "of event time (the latest per series), by reason: rolled_back (a version that "
            "served before it serves instead), superseded (a newer version does) or recovered "
            f"(its recovery test showed the drop gone). {GLOBAL}",
            labels=[*labels, "reason"],
        )
        rows = self.detector.snapshot() if speaks else []
        through = self.detector.through_ms
        if speaks and through is not None:
            latest: dict[tuple[str, ...], int] = {}
            for regression in self.detector.closed:  # in order of closing: the latest wins
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
        yield from (flag, delta, p_value, e_value, closed_e, info, closed)


def _by_topic(name: str, doc: str, counts: Mapping[Topic, int], topics: tuple[str, str]) -> Metric:
    family = CounterMetricFamily(name, doc, labels=["topic"])
    for kind in TOPICS:
        family.add_metric([topics[kind]], counts.get(kind, 0))
    return family


def _seconds(name: str, doc: str, ms: int | None) -> Metric:
    """A gauge in seconds of a time in milliseconds; no sample while it is unknown."""
    gauge = GaugeMetricFamily(name, doc)
    if ms is not None:
        gauge.add_metric([], ms / 1000)
    return gauge


def _by_label(name: str, doc: str, label: str, counts: Mapping[str, int]) -> Metric:
    family = CounterMetricFamily(name, doc, labels=[label])
    for value, n in sorted(counts.items()):
        family.add_metric([value], n)
    return family


def build_registry(state: ServiceState) -> CollectorRegistry:
    """A fresh registry holding the collector of ``state`` (never the global default)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PipelineCollector(state))
    return registry
