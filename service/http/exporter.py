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
from service.http.estimate_series import estimate_series
from service.http.regression_series import GLOBAL, regression_series
from service.http.source_series import source_series
from service.metrics.aggregates import SCALE
from service.stream.topics import TOPICS, Topic
from service.times import duration_label

SUMMARY_FAMILIES = {
    "hit_rate": ("retrieval_hit", "1 if a relevant chunk is in the top k (success@k)"),
    "recall": ("retrieval_recall", "relevant chunks in the top k / all relevant chunks"),
    "precision": ("retrieval_precision", "relevant chunks in the top k / k"),
    "ndcg": ("retrieval_ndcg", "nDCG@k, linear gain, ideal from all graded chunks"),
}
ROLLING_FAMILIES = {
    "hit_rate": "retrieval_rolling_hit_rate",
    "recall": "retrieval_rolling_recall",
    "precision": "retrieval_rolling_precision",
    "ndcg": "retrieval_rolling_ndcg",
}


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
            metrics += list(self._health()) + regression_series(self.state)
            metrics += estimate_series(self.state)
            metrics += source_series(self.state)
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
            "retrieval_audits",
            "Audit events by outcome when their window closed (counted, replaced, "
            "outside_sample, no_query, too_late, other_judge); per replica.",
            "outcome",
            c.audit_outcomes,
        )
        outside = CounterMetricFamily(
            "retrieval_audit_outside_sample",
            "Audits of queries outside the audit sample (used for judge agreement only).",
        )
        outside.add_metric([], c.audit_outcomes["outside_sample"])
        yield outside
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
