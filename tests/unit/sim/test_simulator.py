"""The synthetic traffic generator: valid, deterministic, ordered, and realistic enough."""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import io
import itertools
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.errors import ConfigError
from service.sim import simulator
from service.sim.simulator import (
    DEFAULT_START_MS,
    HOUR_MS,
    HYBRID_V7,
    HYBRID_V8,
    SimEvent,
    SimQuery,
    SimulationConfig,
    encode,
    generate,
    simulate_queries,
    write_jsonl,
)
from service.sim.truth import summarize
from service.stream.events import FeedbackEvent, QueryEvent, decode_feedback, decode_query

MINUTE_MS = 60_000
SWITCH_MS = DEFAULT_START_MS + 30 * MINUTE_MS
ATTRIBUTION_WINDOW_MS = 30 * MINUTE_MS
RFC3339_MS_Z = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")

HOUR = SimulationConfig(duration_ms=HOUR_MS, after=HYBRID_V8, switch_at_ms=SWITCH_MS)


@pytest.fixture(scope="module")
def events() -> list[SimEvent]:
    return list(generate(HOUR))


@pytest.fixture(scope="module")
def queries() -> list[SimQuery]:
    return list(simulate_queries(HOUR))


def decoded(events: list[SimEvent]) -> Iterator[tuple[SimEvent, QueryEvent | FeedbackEvent]]:
    for event in events:
        raw = encode(event)
        yield event, decode_query(raw) if event.topic == "queries" else decode_feedback(raw)


def digest(config: SimulationConfig) -> str:
    sha = hashlib.sha256()
    for event in generate(config):
        sha.update(f"{event.topic}|{event.key}|{event.arrival_ms}|".encode() + encode(event))
    return sha.hexdigest()


def test_same_seed_same_sequence_other_seed_other_sequence(events: list[SimEvent]) -> None:
    assert list(generate(HOUR)) == events
    other = list(generate(dataclasses.replace(HOUR, seed=8)))
    assert other != events
    assert other[0].event["results"] != events[0].event["results"]


def test_sequence_does_not_depend_on_the_process_hash_seed() -> None:
    """Set iteration order changes with PYTHONHASHSEED; the output must not."""
    config = SimulationConfig(duration_ms=10 * MINUTE_MS, unretrieved_citation_rate=1.0)
    code = (
        "from service.sim.simulator import SimulationConfig\n"
        "from tests.unit.sim.test_simulator import digest\n"
        "print(digest(SimulationConfig(duration_ms=600_000, unretrieved_citation_rate=1.0)))"
    )
    root = Path(__file__).resolve().parents[3]
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        out = subprocess.run(
            [sys.executable, "-c", code],
            check=False,
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == digest(config)


def test_every_event_validates_and_is_consistent(events: list[SimEvent]) -> None:
    query_ids = {e.key for e in events if e.topic == "queries"}
    assert len(query_ids) == sum(1 for e in events if e.topic == "queries")  # unique ids
    signals: collections.Counter[str] = collections.Counter()
    for event, model in decoded(events):
        assert event.key == model.query_id
        assert model.timestamp_ms == event.timestamp_ms
        assert RFC3339_MS_Z.match(str(event.event["timestamp"]))
        if isinstance(model, QueryEvent):
            chunks = model.chunk_ids()
            assert len(chunks) in {0, HOUR.results_per_query}
            assert len(set(chunks)) == len(chunks)
            assert model.context_k == HOUR.context_k
            assert model.segment in {"support-kb", "docs", "billing"}
            assert all(re.fullmatch(r"doc-\d+#\d", c) for c in chunks)
        else:
            assert isinstance(model, FeedbackEvent)
            assert model.query_id in query_ids
            signals[model.signal] += 1
    assert set(signals) == {"click", "citation", "judgment"}


def test_arrival_order_lag_and_feedback_times(events: list[SimEvent]) -> None:
    arrivals = [e.arrival_ms for e in events]
    assert arrivals == sorted(arrivals)
    lags = [e.arrival_ms - e.timestamp_ms for e in events]
    assert min(lags) >= 0
    assert max(lags) <= HOUR.max_arrival_delay_ms
    assert max(lags) > HOUR.max_arrival_delay_ms // 2  # lag spikes do happen
    # Out-of-orderness in arrival order stays within the bound the watermark relies on.
    newest_ms = 0
    for event in events:
        newest_ms = max(newest_ms, event.timestamp_ms)
        assert newest_ms - event.timestamp_ms <= HOUR.max_arrival_delay_ms
    query_ms = {e.key: e.timestamp_ms for e in events if e.topic == "queries"}
    position = {e.key: i for i, e in enumerate(events) if e.topic == "queries"}
    early = 0
    for i, event in enumerate(events):
        if event.topic == "feedback":
            delay = event.timestamp_ms - query_ms[event.key]
            assert 1_000 <= delay <= HOUR.max_feedback_delay_ms < ATTRIBUTION_WINDOW_MS
            early += i < position[event.key]
    assert early > 0  # some feedback arrives before its query, as in real pipelines


def test_version_switch_at_deploy_time(events: list[SimEvent]) -> None:
    seen: collections.Counter[str] = collections.Counter()
    for event in events:
        if event.topic == "queries":
            expected = "hybrid-v7" if event.timestamp_ms < SWITCH_MS else "hybrid-v8"
            assert event.event["retriever"] == expected
            seen[expected] += 1
    assert min(seen.values()) > 1000


def test_quality_drop_lowers_the_profile_after_the_switch_only() -> None:
    config = dataclasses.replace(HOUR, quality_drop=0.2)
    assert config.profile_at(SWITCH_MS - 1) == HYBRID_V7
    assert config.profile_at(SWITCH_MS).find_rate == pytest.approx(HYBRID_V8.find_rate - 0.2)
    middle = SimulationConfig(after=HYBRID_V8).deploy_ms
    assert middle == DEFAULT_START_MS + 3 * HOUR_MS


def test_a_drop_in_some_segments_lowers_the_profile_there_only() -> None:
    config = dataclasses.replace(HOUR, quality_drop=0.2, drop_segments=("docs",))
    assert config.profile_at(SWITCH_MS, segment="docs").find_rate == pytest.approx(0.67)
    assert config.profile_at(SWITCH_MS, segment="billing") == HYBRID_V8
    assert config.profile_at(SWITCH_MS - 1, segment="docs") == HYBRID_V7
    # in the events: the share of relevant chunks retrieved, by segment, after the switch
    run = dataclasses.replace(config, duration_ms=3 * HOUR_MS, seed=11)
    found: dict[bool, list[int]] = {True: [0, 0], False: [0, 0]}
    for q in simulate_queries(run):
        if q.timestamp_ms >= SWITCH_MS and q.results:
            tally = found[q.segment == "docs"]
            tally[0] += sum(1 for chunk in q.relevant if chunk in q.results)
            tally[1] += len(q.relevant)
    docs, others = (found[k][0] / found[k][1] for k in (True, False))
    assert docs == pytest.approx(0.67, abs=0.02)
    assert others == pytest.approx(0.87, abs=0.02)


def test_clicks_are_position_biased(events: list[SimEvent]) -> None:
    queries = sum(1 for e in events if e.topic == "queries" and e.event["results"])
    ranks: dict[str, dict[str, int]] = {}
    for event, model in decoded(events):
        if isinstance(model, QueryEvent):
            ranks[event.key] = {chunk: r for r, chunk in enumerate(model.chunk_ids(), 1)}
    clicks_at: collections.Counter[int] = collections.Counter()
    for event in events:
        if event.topic == "feedback" and event.event["signal"] == "click":
            clicks_at[ranks[event.key].get(str(event.event["chunk_id"]), 0)] += 1
    ctr_1, ctr_10 = clicks_at[1] / queries, clicks_at[10] / queries
    assert ctr_1 > 0.2
    assert ctr_1 > 20 * ctr_10  # ~0.32 vs ~0.001: examination and relevance both decay


def test_examination_not_just_relevance_drives_the_bias() -> None:
    """With relevant chunks spread over all ranks, a relevant chunk at rank 10 is still
    clicked far less often than one at rank 1: the user rarely looks that far."""
    flat = dataclasses.replace(HYBRID_V7, find_rate=1.0, rank_decay=0.97)
    config = SimulationConfig(duration_ms=2 * HOUR_MS, before=flat, abandon_rate=0.0)
    shown: collections.Counter[int] = collections.Counter()
    clicked: collections.Counter[int] = collections.Counter()
    for query in simulate_queries(config):
        clicks = {
            e.event["chunk_id"]
            for e in query.events
            if e.topic == "feedback" and e.event["signal"] == "click"
        }
        for rank, chunk in enumerate(query.results, 1):
            if chunk in query.relevant:
                shown[rank] += 1
                clicked[rank] += chunk in clicks
    assert min(shown[1], shown[10]) > 200
    rate_1, rate_10 = clicked[1] / shown[1], clicked[10] / shown[10]
    assert rate_1 > 0.5
    assert rate_1 > 3 * rate_10


def observed_and_true_hit_rate(config: SimulationConfig) -> dict[str, tuple[float, float]]:
    """Per retriever: share of queries with positive feedback on a top-5 chunk, and the
    ground-truth hit rate@5."""
    counts: collections.Counter[str] = collections.Counter()
    positive: collections.Counter[str] = collections.Counter()
    queries = list(simulate_queries(config))
    for query in queries:
        top = set(query.results[:5])
        counts[query.retriever] += 1
        positive[query.retriever] += any(
            e.event["chunk_id"] in top and e.event.get("grade", 1) != 0 for e in query.events[1:]
        )
    truth = summarize(queries, k=5)
    return {r: (positive[r] / counts[r], truth[r].hit_rate) for r in counts}


@pytest.mark.slow
def test_a_quality_drop_is_visible_in_the_feedback() -> None:
    """~7,000 queries per side: the standard error of a difference of shares is ~0.008.
    The drop lowers the observed share by ~0.08 and the true hit rate@5 by ~0.12."""
    same = dataclasses.replace(HYBRID_V7, name="hybrid-v8")  # only the drop differs
    base = SimulationConfig(duration_ms=4 * HOUR_MS, after=same)
    control = observed_and_true_hit_rate(base)
    dropped = observed_and_true_hit_rate(dataclasses.replace(base, quality_drop=0.2))
    assert abs(control["hybrid-v7"][0] - control["hybrid-v8"][0]) < 0.025
    assert abs(control["hybrid-v7"][1] - control["hybrid-v8"][1]) < 0.025
    assert dropped["hybrid-v7"] == control["hybrid-v7"]  # before the deploy: same draws
    assert dropped["hybrid-v7"][0] - dropped["hybrid-v8"][0] > 0.045
    assert dropped["hybrid-v7"][1] - dropped["hybrid-v8"][1] > 0.08


@pytest.mark.parametrize(("per_hour", "hours"), [(3600.0, 2), (600.0, 6)])
def test_poisson_arrivals_at_the_configured_rate(per_hour: float, hours: int) -> None:
    config = SimulationConfig(duration_ms=hours * HOUR_MS, queries_per_hour=per_hour)
    times = [q.timestamp_ms for q in simulate_queries(config)]
    expected = per_hour * hours  # Poisson: sd = sqrt(expected), 60 or 85 here
    assert abs(len(times) - expected) < 0.05 * expected
    assert config.start_ms <= times[0]
    assert times[-1] < config.end_ms
    gaps = [b - a for a, b in itertools.pairwise(times)]
    mean = sum(gaps) / len(gaps)
    sd = (sum((g - mean) ** 2 for g in gaps) / len(gaps)) ** 0.5
    assert 0.9 < sd / mean < 1.1  # exponential gaps have a coefficient of variation of 1


def test_feedback_follows_the_ground_truth(queries: list[SimQuery]) -> None:
    long_relevant = short_noise = relevant_clicks = noise_clicks = 0
    without_feedback = 0
    for query in queries:
        feedback = [e.event for e in query.events[1:]]
        without_feedback += not feedback
        context = set(query.results[: HOUR.context_k])
        for event in feedback:
            chunk, signal = event["chunk_id"], event["signal"]
            if signal == "click":
                dwell = event["dwell_ms"]
                assert isinstance(dwell, int)
                if chunk in query.relevant:
                    relevant_clicks += 1
                    long_relevant += dwell >= 30_000
                else:
                    noise_clicks += 1
                    short_noise += dwell < 30_000
            elif signal == "citation":
                assert chunk in context or (chunk in query.relevant and chunk not in query.results)
            else:
                assert chunk in context
                assert event["grade"] == query.relevant.get(str(chunk), 0)
    assert long_relevant / relevant_clicks > 0.7
    assert short_noise == noise_clicks > 0
    assert relevant_clicks > 5 * noise_clicks
    assert 0.25 < without_feedback / len(queries) < 0.4  # abandoned, plus nothing found


def test_abandoned_queries_get_no_feedback() -> None:
    config = SimulationConfig(duration_ms=10 * MINUTE_MS, abandon_rate=1.0)
    assert {e.topic for e in generate(config)} == {"queries"}


def test_some_results_carry_descending_scores(events: list[SimEvent]) -> None:
    scored = plain = 0
    for event in events:
        results = event.event.get("results")
        if event.topic != "queries" or not isinstance(results, list) or not results:
            continue
        if isinstance(results[0], dict):
            scored += 1
            scores = [r["score"] for r in results]
            assert scores == sorted(scores, reverse=True)
        else:
            plain += 1
    assert 0.1 < scored / (scored + plain) < 0.3


def test_generation_streams_with_bounded_lookahead(monkeypatch: pytest.MonkeyPatch) -> None:
    """A day-long run is not materialised: generate pulls queries only a few minutes
    (feedback delay + ingestion lag) ahead of what it has yielded."""
    pulled: list[int] = []
    real = simulator.simulate_queries

    def counting(config: SimulationConfig) -> Iterator[SimQuery]:
        for query in real(config):
            pulled.append(query.timestamp_ms)
            yield query

    monkeypatch.setattr(simulator, "simulate_queries", counting)
    config = SimulationConfig(duration_ms=24 * HOUR_MS)
    horizon_ms = config.max_feedback_delay_ms + config.max_arrival_delay_ms
    for n, event in enumerate(generate(config)):
        assert pulled[-1] - event.arrival_ms <= horizon_ms
        if n == 20_000:
            break
    assert len(pulled) < 10_000  # of ~86,000 queries in the day


def test_encode_and_write_jsonl(tmp_path: Path, events: list[SimEvent]) -> None:
    sample = events[:500]
    assert json.loads(encode(sample[0])) == sample[0].event
    assert b" " not in encode(sample[0])
    path = tmp_path / "events.jsonl"
    assert write_jsonl(iter(sample), path) == 500
    lines = path.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == [
        {"topic": e.topic, "event": e.event} for e in sample
    ]
    buffer = io.StringIO()
    assert write_jsonl(sample, buffer) == 500
    assert buffer.getvalue() == path.read_text(encoding="utf-8")


def test_id_prefix_keeps_runs_apart() -> None:
    config = SimulationConfig(duration_ms=MINUTE_MS, id_prefix="run2-")
    ids = [e.key for e in generate(config)]
    assert ids
    assert all(i.startswith("run2-") for i in ids)
    default = next(generate(SimulationConfig(duration_ms=MINUTE_MS)))
    assert default.key.startswith(f"s7t{DEFAULT_START_MS // 1000}-")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"switch_at_ms": SWITCH_MS}, "after"),
        ({"quality_drop": 0.1}, "after"),
        ({"after": HYBRID_V8, "drop_segments": ("nowhere",)}, "drop_segments"),
        ({"abandon_rate": 1.5}, "abandon_rate"),
        ({"queries_per_hour": 0.0}, "queries_per_hour"),
        ({"segments": ()}, "segments"),
        ({"max_arrival_delay_ms": -1}, "max_arrival_delay_ms"),
        ({"corpus_chunks": 10}, "corpus_chunks"),
    ],
)
def test_bad_configs_are_rejected_with_a_reason(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SimulationConfig(**changes)  # type: ignore[arg-type]


def test_bad_profiles_are_rejected() -> None:
    with pytest.raises(ConfigError, match="rank_decay"):
        dataclasses.replace(HYBRID_V7, rank_decay=1.0)
    with pytest.raises(ConfigError, match="find_rate"):
        dataclasses.replace(HYBRID_V7, find_rate=-0.1)


def test_a_version_whose_users_act_later_delays_its_feedback_and_nothing_else() -> None:
    """``feedback_delay`` scales the delay of each feedback event of the version's queries
    (the same draws: the same feedback, later); the other version's is unchanged."""
    base = SimulationConfig(seed=3, duration_ms=HOUR_MS, queries_per_hour=600, after=HYBRID_V8)
    slow = dataclasses.replace(base, after=dataclasses.replace(HYBRID_V8, feedback_delay=2.0))

    def delays(config: SimulationConfig) -> dict[str, list[tuple[str, str, int]]]:
        events = list(generate(config))
        asked = {
            str(e.event["query_id"]): (str(e.event["retriever"]), e.timestamp_ms)
            for e in events
            if e.topic == "queries"
        }
        out: dict[str, list[tuple[str, str, int]]] = collections.defaultdict(list)
        for e in sorted(events, key=lambda e: (e.timestamp_ms, e.key)):
            if e.topic == "feedback" and e.event.get("signal") in ("click", "citation", "judgment"):
                retriever, ts = asked[str(e.event["query_id"])]
                delay = e.timestamp_ms - ts
                out[retriever].append((str(e.event["chunk_id"]), str(e.event["signal"]), delay))
        for values in out.values():
            values.sort()
        return out

    before, after = delays(base), delays(slow)
    assert before[HYBRID_V7.name] == after[HYBRID_V7.name]
    fast, late = before[HYBRID_V8.name], after[HYBRID_V8.name]
    assert len(fast) > 100
    # (each list sorted by chunk, signal and delay: doubling keeps that order)
    assert [(c, s) for c, s, _ in late] == [(c, s) for c, s, _ in fast]
    assert all(abs(b - 2 * a) <= 1 for (_, _, a), (_, _, b) in zip(fast, late, strict=True))
    assert max(d for *_, d in late) > 5 * MINUTE_MS  # some of it past a 5-minute label age
    with pytest.raises(ConfigError, match="feedback_delay"):
        dataclasses.replace(HYBRID_V8, feedback_delay=0.0)
