"""Seeded synthetic traffic for a retrieval system: queries and the feedback they get.

Pure and deterministic: the same :class:`SimulationConfig` yields the same events, in
the same order, on every run. Each query has a hidden ground truth (1..4 relevant
chunks, grades 1..3). The retriever in service at the query's time (``before``, or
``after`` from ``switch_at_ms`` on) returns ``results_per_query`` chunks, placing each
relevant chunk with probability ``find_rate`` at a rank drawn from a truncated
geometric distribution (``rank_decay``: P(rank r) ~ rank_decay ** (r - 1)); the rest
are random corpus chunks. Users then click (see :mod:`service.sim.clicks`), the answer
cites relevant chunks from the first ``context_k`` results, and a few queries are
judged. Abandoned queries get no feedback at all. Queries in the audit sample are audited
hours later by simulated judges (:mod:`service.sim.audit`), from random sources of their
own; the true metric values are in :mod:`service.sim.truth`.

Events are streamed in arrival order (event time plus a bounded ingestion lag, drawn
independently per event, so feedback may arrive before its query), with memory bounded
by the events of the last ``max_feedback_delay_ms + max_arrival_delay_ms``, plus the
audits still to come (hours late, but only for the audit sample's share of the queries).
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace

from service.errors import ConfigError
from service.sim.audit import JudgeModel, audit_events
from service.sim.clicks import ClickModel, check_rate, simulate_feedback
from service.sim.events import SimEvent, SimQuery, Topic, encode, write_jsonl
from service.sim.profiles import HYBRID_V7, HYBRID_V8, RetrieverProfile
from service.sim.shape import TrafficShape
from service.sim.texts import (
    RELEVANT_COUNT_WEIGHTS,
    QueryText,
    TextCatalog,
    TextModel,
    draw_truth,
)
from service.times import HOUR_MS, rfc3339_millis

DEFAULT_START_MS = 1_796_083_200_000
"""2026-12-01T00:00:00Z."""
CHUNKS_PER_DOC = 8
__all__ = [  # (the profiles live in service.sim.profiles and are read from here too)
    "CHUNKS_PER_DOC",
    "DEFAULT_START_MS",
    "HYBRID_V7",
    "HYBRID_V8",
    "RetrieverProfile",
    "SimEvent",
    "SimQuery",
    "SimulationConfig",
    "Topic",
    "encode",
    "generate",
    "simulate_queries",
    "write_jsonl",
]


@dataclass(frozen=True, slots=True)
class SimulationConfig:
    """Everything that shapes a run; times are integer ms, rates are probabilities."""

    seed: int = 7
    start_ms: int = DEFAULT_START_MS
    duration_ms: int = 6 * HOUR_MS
    queries_per_hour: float = 3600.0
    corpus_chunks: int = 50_000
    results_per_query: int = 20
    context_k: int = 5
    segments: tuple[tuple[str, float], ...] = (("support-kb", 0.5), ("docs", 0.3), ("billing", 0.2))
    before: RetrieverProfile = HYBRID_V7
    after: RetrieverProfile | None = None
    switch_at_ms: int | None = None
    """The deploy time: queries at or after it use ``after``. None: half-way through the run."""
    quality_drop: float = 0.0
    """Subtracted from ``after.find_rate`` (0.05 = 5 points): a bad deploy in one number."""
    drop_segments: tuple[str, ...] = ()
    """The segments where ``quality_drop`` applies (none named: all of them): a version
    worse for some users only."""
    abandon_rate: float = 0.25
    clicks: ClickModel = field(default_factory=ClickModel)
    citation_rate: float = 0.7
    """Probability that a relevant chunk among the first ``context_k`` results is cited."""
    citation_noise_rate: float = 0.01
    """Probability that a non-relevant chunk among the first ``context_k`` is cited."""
    unretrieved_citation_rate: float = 0.03
    """Per query: a relevant chunk that was not retrieved is cited (lowers recall)."""
    judgment_rate: float = 0.02
    """Per query: a judge grades each of the first ``context_k`` results."""
    citation_delay_ms: tuple[int, int] = (1_000, 10_000)
    max_feedback_delay_ms: int = 300_000
    scored_results_rate: float = 0.2
    """Share of queries whose results are logged as ``{"chunk_id", "score"}`` objects."""
    mean_arrival_delay_ms: int = 800
    lag_spike_rate: float = 0.01
    """Share of events delayed uniformly up to ``max_arrival_delay_ms``."""
    max_arrival_delay_ms: int = 20_000
    """Keep below the service's max_out_of_orderness (60 s) or events will be late."""
    id_prefix: str | None = None
    """Query ids are ``<prefix><n>``; None: ``s<seed>t<start seconds>-``."""
    shape: TrafficShape | None = None
    """Daily cycles, canaries, rollbacks, drift, label shifts (:mod:`service.sim.shape`);
    None: flat."""
    audit_rate: float = 0.0
    """Queries in the audit sample at this rate (``service.audit``) are audited; 0: none."""
    judges: tuple[JudgeModel, ...] = ()
    """Who audits the sample (:mod:`service.sim.audit`); none named: one careful judge."""
    texts: TextModel | None = None
    """Repeated query texts, Zipf distributed, each keeping its difficulty
    (:mod:`service.sim.texts`); the query events carry them as ``query``. None: every
    query is new, and has no text."""

    def __post_init__(self) -> None:
        for name in ("abandon_rate", "citation_rate", "citation_noise_rate", "lag_spike_rate"):
            check_rate(name, getattr(self, name))
        for name in ("unretrieved_citation_rate", "judgment_rate", "scored_results_rate"):
            check_rate(name, getattr(self, name))
        for name in ("start_ms", "mean_arrival_delay_ms", "max_arrival_delay_ms"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if self.duration_ms <= 0 or self.queries_per_hour <= 0:
            raise ConfigError("duration_ms and queries_per_hour must be positive")
        if not 0 <= self.results_per_query <= 1000 or self.context_k < 0:
            raise ConfigError("results_per_query must be in 0..1000 and context_k >= 0")
        if self.corpus_chunks < 2 * (self.results_per_query + len(RELEVANT_COUNT_WEIGHTS)):
            raise ConfigError(f"corpus_chunks={self.corpus_chunks} is too small for the results")
        if not self.segments or any(w <= 0 or not 1 <= len(s) <= 100 for s, w in self.segments):
            raise ConfigError("segments need 1..100-character names and positive weights")
        low, high = self.citation_delay_ms
        if not 0 <= low <= high <= self.max_feedback_delay_ms:
            raise ConfigError("need 0 <= citation_delay_ms <= max_feedback_delay_ms")
        if self.after is None and (self.switch_at_ms is not None or self.quality_drop):
            raise ConfigError("switch_at_ms and quality_drop need an 'after' retriever profile")
        check_rate("quality_drop", self.quality_drop)
        unknown = set(self.drop_segments) - {name for name, _ in self.segments}
        if unknown:
            raise ConfigError(f"drop_segments {sorted(unknown)} are not among the segments")
        check_rate("audit_rate", self.audit_rate)
        names = [judge.name for judge in self.judges]
        if len(set(names)) != len(names):
            raise ConfigError(f"judges need distinct names, got {names!r}")

    @property
    def end_ms(self) -> int:
        """Queries have timestamps in [start_ms, end_ms)."""
        return self.start_ms + self.duration_ms

    @property
    def deploy_ms(self) -> int | None:
        """When ``after`` takes over, or None for a single-version run."""
        if self.after is None:
            return None
        return (
            self.start_ms + self.duration_ms // 2
            if self.switch_at_ms is None
            else self.switch_at_ms
        )

    def profile_at(
        self, timestamp_ms: int, draw: float = 0.0, segment: str | None = None
    ) -> RetrieverProfile:
        """The effective profile serving a query at this time in this segment (the quality
        drop applied where it applies; with a shape, ``draw`` in [0, 1) decides a
        canary's share)."""
        deploy_ms, shape = self.deploy_ms, self.shape
        new = self.after is not None and deploy_ms is not None and timestamp_ms >= deploy_ms
        if new and shape is not None and deploy_ms is not None:
            new = shape.new_version_serves(timestamp_ms, deploy_ms, draw)
        if not new or self.after is None:
            profile, shift = self.before, 0.0
        else:
            dropped = not self.drop_segments or segment in self.drop_segments
            profile, shift = self.after, -self.quality_drop if dropped else 0.0
        if shape is not None:
            shift += shape.find_rate_shift(timestamp_ms)
        if shift == 0.0:
            return profile
        return replace(profile, find_rate=min(1.0, max(0.0, profile.find_rate + shift)))


def _chunk_id(index: int) -> str:
    return f"doc-{index // CHUNKS_PER_DOC}#{index % CHUNKS_PER_DOC}"


class _Simulator:
    """The per-query draws; one random.Random consumed in a fixed order."""

    def __init__(self, config: SimulationConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.segment_names = [name for name, _ in config.segments]
        self.segment_weights = [weight for _, weight in config.segments]
        self.prefix = (
            f"s{config.seed}t{config.start_ms // 1000}-"
            if config.id_prefix is None
            else config.id_prefix
        )
        self.catalog = (
            None
            if config.texts is None
            else TextCatalog(
                config.texts, config.seed, config.segments, _chunk_id, config.corpus_chunks
            )
        )

    def lag_ms(self, rng: random.Random | None = None) -> int:
        """An ingestion lag, drawn from ``rng`` (by default the simulator's)."""
        c, rng = self.config, self.rng if rng is None else rng
        if rng.random() < c.lag_spike_rate:
            return rng.randint(0, c.max_arrival_delay_ms)
        mean = c.mean_arrival_delay_ms
        return min(c.max_arrival_delay_ms, int(rng.expovariate(1 / mean))) if mean else 0

    def rank(self, profile: RetrieverProfile, n: int, u: float | None = None) -> int:
        """A 0-based rank from the geometric distribution truncated to n ranks, at the
        uniform ``u`` (by default drawn here)."""
        decay = profile.rank_decay
        if decay == 0.0:
            return 0
        if u is None:
            u = self.rng.random()
        return min(n - 1, int(math.log1p(-u * (1.0 - decay**n)) / math.log(decay)))

    def results(
        self, profile: RetrieverProfile, relevant: Mapping[str, int], text: QueryText | None
    ) -> list[str]:
        c, rng, catalog = self.config, self.rng, self.catalog
        n = c.results_per_query
        if n == 0 or rng.random() < profile.empty_rate:
            return []
        slots: list[str | None] = [None] * n
        for chunk in relevant:
            if (
                rng.random() < profile.find_rate
                if text is None or catalog is None
                else catalog.found(rng, text, chunk, profile.find_rate)
            ):
                u = None if text is None or catalog is None else catalog.placed(rng, text, chunk)
                want = self.rank(profile, n, u)  # taken: the next free rank below, else above
                free = [i for i in range(want, n) if slots[i] is None] or [
                    i for i in range(want - 1, -1, -1) if slots[i] is None
                ]
                if free:
                    slots[free[0]] = chunk
        used = set(relevant)
        for i in range(n):
            while slots[i] is None:
                chunk = _chunk_id(rng.randrange(c.corpus_chunks))
                if chunk not in used:
                    used.add(chunk)
                    slots[i] = chunk
        return [s for s in slots if s is not None]

    def truth(self, text: QueryText | None) -> tuple[str, dict[str, int]]:
        """A query's segment and relevant chunks: its text's, or drawn afresh."""
        if text is not None:
            return text.segment, text.relevant
        return draw_truth(
            self.rng, self.segment_names, self.segment_weights, _chunk_id, self.config.corpus_chunks
        )

    def query(self, number: int, timestamp_ms: int) -> SimQuery:
        c, rng = self.config, self.rng
        query_id = f"{self.prefix}{number}"
        draw = rng.random() if c.shape is not None and c.shape.shapes_traffic else 0.0
        text = None if self.catalog is None else self.catalog.draw(rng)
        segment, relevant = self.truth(text)
        profile = c.profile_at(timestamp_ms, draw, segment)  # (draws nothing)
        results = self.results(profile, relevant, text)
        body: dict[str, object] = {
            "query_id": query_id,
            "timestamp": rfc3339_millis(timestamp_ms),
            "retriever": profile.name,
            "results": results,
            "context_k": c.context_k,
            "segment": segment,
        }
        if text is not None:
            body["query"] = text.text
        if rng.random() < c.scored_results_rate:
            score = rng.uniform(0.75, 0.95)
            scored: list[dict[str, object]] = []
            for chunk in results:
                scored.append({"chunk_id": chunk, "score": round(score, 4)})
                score = max(0.0, score - rng.uniform(0.0, 0.03))
            body["results"] = scored
        events = [self.event("queries", query_id, body, timestamp_ms)]
        shape = c.shape
        clicks_scale = 1.0 if shape is None else shape.clicks_factor(timestamp_ms)
        citations_scale = 1.0 if shape is None else shape.citations_factor(timestamp_ms)
        if rng.random() >= c.abandon_rate:
            feedback = simulate_feedback(
                rng,
                results,
                relevant,
                c,
                clicks_scale=clicks_scale,
                citations_scale=citations_scale,
            )
            for delay_ms, chunk, signal, extra in feedback:
                fb_ms = timestamp_ms + round(delay_ms * profile.feedback_delay)
                fb: dict[str, object] = {
                    "query_id": query_id,
                    "timestamp": rfc3339_millis(fb_ms),
                    "chunk_id": chunk,
                    "signal": signal,
                    **extra,
                }
                events.append(self.event("feedback", query_id, fb, fb_ms))
        audits = audit_events(c, query_id, timestamp_ms, results, relevant, lag_ms=self.lag_ms)
        for audit_body, audit_ms, arrival_ms in audits:
            events.append(SimEvent("feedback", query_id, audit_body, audit_ms, arrival_ms))
        return SimQuery(
            query_id,
            timestamp_ms,
            profile.name,
            segment,
            tuple(results),
            relevant,
            c.context_k,
            tuple(events),
        )

    def event(
        self, topic: Topic, query_id: str, body: dict[str, object], timestamp_ms: int
    ) -> SimEvent:
        return SimEvent(topic, query_id, body, timestamp_ms, timestamp_ms + self.lag_ms())


def simulate_queries(config: SimulationConfig) -> Iterator[SimQuery]:
    """The run's queries in event-time order (Poisson arrivals), with ground truth and events."""
    sim = _Simulator(config)
    shape = config.shape if config.shape is not None and config.shape.shapes_traffic else None
    peak = 1.0 + (shape.volume_amplitude if shape is not None else 0.0)
    rate_per_ms = config.queries_per_hour * peak / HOUR_MS
    clock_ms = float(config.start_ms)
    number = 0
    while True:
        clock_ms += sim.rng.expovariate(rate_per_ms)
        if clock_ms >= config.end_ms:
            return
        # a time-varying rate by thinning: keep an arrival with probability rate(t) / peak
        if shape is not None and sim.rng.random() * peak >= shape.volume(int(clock_ms)):
            continue
        yield sim.query(number, int(clock_ms))
        number += 1


def generate(config: SimulationConfig) -> Iterator[SimEvent]:
    """Every event of the run in nondecreasing ``arrival_ms`` order, streamed."""
    pending: list[tuple[int, int, SimEvent]] = []
    sequence = 0
    for query in simulate_queries(config):
        # Later queries and their feedback have event time, hence arrival, >= this query's.
        while pending and pending[0][0] <= query.timestamp_ms:
            yield heapq.heappop(pending)[2]
        for event in query.events:
            heapq.heappush(pending, (event.arrival_ms, sequence, event))
            sequence += 1
    while pending:
        yield heapq.heappop(pending)[2]
