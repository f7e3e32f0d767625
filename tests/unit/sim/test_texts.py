"""The simulator's repeated query texts (service/sim/texts.py): Zipf distributed, each
keeping its segment, truth and difficulty, with every find rate left as it was."""

from __future__ import annotations

import collections
import math
import random
from dataclasses import replace
from statistics import NormalDist

import pytest

from service.errors import ConfigError
from service.sim.simulator import HYBRID_V7, SimulationConfig, simulate_queries
from service.sim.texts import TextCatalog, TextModel
from service.times import HOUR_MS

SEGMENTS = (("kb", 0.5), ("docs", 0.5))


def _catalog(model: TextModel, seed: int = 3) -> TextCatalog:
    return TextCatalog(model, seed, SEGMENTS, lambda i: f"c{i}", 50_000)


def test_texts_are_drawn_by_their_zipf_weight() -> None:
    """With exponent 1 over 1,000 texts the most asked has 1 / H(1000) = 13.4% of the
    queries, the second half of that, the tenth a tenth (within 4 standard errors)."""
    catalog = _catalog(TextModel(texts=1_000, exponent=1.0))
    rng = random.Random(1)
    n = 40_000
    counts = collections.Counter(catalog.draw(rng).rank for _ in range(n))
    harmonic = sum(1 / i for i in range(1, 1_001))
    for rank in (1, 2, 10):
        p = 1 / rank / harmonic
        assert abs(counts[rank] / n - p) < 4 * math.sqrt(p * (1 - p) / n), rank
    assert max(counts) <= 1_000
    flat = _catalog(TextModel(texts=50, exponent=0.0))
    flat_counts = collections.Counter(flat.draw(rng).rank for _ in range(n))
    assert len(flat_counts) == 50
    assert max(flat_counts.values()) < 1.3 * n / 50


def test_a_text_keeps_its_segment_and_truth_and_the_query_event_names_it() -> None:
    config = SimulationConfig(
        seed=5,
        duration_ms=2 * HOUR_MS,
        queries_per_hour=2_000,
        segments=SEGMENTS,
        texts=TextModel(texts=30, exponent=1.0),
    )
    seen: dict[str, tuple[str, dict[str, int]]] = {}
    repeats = 0
    for query in simulate_queries(config):
        text = query.events[0].event["query"]
        assert isinstance(text, str)
        truth = (query.segment, dict(query.relevant))
        repeats += text in seen
        assert seen.setdefault(text, truth) == truth
    assert len(seen) <= 30
    assert repeats > 3_000
    # the same seed makes the same texts; another seed other truths for them
    first = _catalog(TextModel(texts=30), seed=5)._make(1)
    assert _catalog(TextModel(texts=30), seed=5)._make(1) == first
    assert _catalog(TextModel(texts=30), seed=6)._make(1).relevant != first.relevant


@pytest.mark.parametrize("persistence", [0.0, 0.5, 0.9])
def test_a_chunk_is_found_at_the_rate_its_difficulty_gives(persistence: float) -> None:
    """For a chunk of difficulty z, P(found) = Phi((Phi^-1(f) - rho z) / sqrt(1 - rho^2))
    (the copula's conditional law), and over texts it averages to f itself."""
    catalog = _catalog(TextModel(texts=5, persistence=persistence))
    text = catalog.draw(random.Random(2))
    chunk, z = next(iter(text.latent.items()))
    rho = math.sqrt(persistence)
    f = 0.8
    normal = NormalDist()
    expected = normal.cdf((normal.inv_cdf(f) - rho * z) / math.sqrt(1 - persistence))
    rng = random.Random(4)
    n = 20_000
    found = sum(catalog.found(rng, text, chunk, f) for _ in range(n)) / n
    assert abs(found - expected) < 4 * math.sqrt(expected * (1 - expected) / n)


@pytest.mark.parametrize("persistence", [0.0, 0.9])
def test_the_overall_find_rate_is_the_profiles_whatever_the_persistence(
    persistence: float,
) -> None:
    """Over many texts, the share of relevant chunks retrieved is the profile's
    find_rate as without texts: the truth and every rate of a run stay comparable."""
    config = SimulationConfig(
        seed=9,
        duration_ms=HOUR_MS,
        queries_per_hour=12_000,
        results_per_query=100,
        before=replace(HYBRID_V7, empty_rate=0.0),
        texts=TextModel(texts=200_000, exponent=0.0, persistence=persistence),
    )
    found = total = 0
    for query in simulate_queries(config):
        total += len(query.relevant)
        found += len(set(query.relevant) & set(query.results))
    share = found / total
    f = HYBRID_V7.find_rate
    assert abs(share - f) < 4 * math.sqrt(f * (1 - f) / total) + 0.01


def test_repeats_of_a_text_agree_more_the_more_persistent_it_is() -> None:
    """The variance of a chunk's found rate across texts, over repeats: about 0 at
    persistence 0 (each repeat a fresh draw), large at 0.9 (hard texts stay hard)."""

    def spread(persistence: float) -> float:
        catalog = _catalog(TextModel(texts=40, exponent=0.0, persistence=persistence))
        rng = random.Random(8)
        rates = []
        for rank in range(1, 41):
            text = catalog._make(rank)
            chunk = next(iter(text.latent))
            rates.append(sum(catalog.found(rng, text, chunk, 0.7) for _ in range(400)) / 400)
        mean = sum(rates) / len(rates)
        return sum((r - mean) ** 2 for r in rates) / (len(rates) - 1)

    assert spread(0.0) < 0.002  # binomial noise alone: 0.7 x 0.3 / 400 = 0.0005
    assert spread(0.9) > 0.05


@pytest.mark.parametrize(
    ("field", "value"), [("texts", 0), ("exponent", -1.0), ("persistence", 1.0)]
)
def test_a_text_model_out_of_range_is_refused(field: str, value: float) -> None:
    with pytest.raises(ConfigError, match=field):
        TextModel(**{field: value})  # type: ignore[arg-type]


def test_a_found_chunks_rank_keeps_its_law_and_repeats_with_its_text() -> None:
    """The rank of a found chunk has the version's truncated geometric law over all the
    queries (its uniform is uniform whatever the persistence), and at a persistence of
    0.9 one text's repeats place its chunk far more alike than different texts do."""
    catalog = _catalog(TextModel(texts=400, exponent=0.0, persistence=0.9))
    rng = random.Random(12)
    u = []
    for _ in range(4_000):
        text = catalog.draw(rng)
        u.append(catalog.placed(rng, text, next(iter(text.placement))))
    for q in (0.1, 0.5, 0.9):  # the uniform's quantiles, within 4 standard errors
        share = sum(x < q for x in u) / len(u)
        assert abs(share - q) < 4 * math.sqrt(q * (1 - q) / len(u)) + 0.02, q

    def within_text_spread(persistence: float) -> float:
        texts = _catalog(TextModel(texts=30, exponent=0.0, persistence=persistence))
        spreads = []
        for rank in range(1, 31):
            text = texts._make(rank)
            chunk = next(iter(text.placement))
            draws = [texts.placed(rng, text, chunk) for _ in range(50)]
            mean = sum(draws) / len(draws)
            spreads.append(sum((d - mean) ** 2 for d in draws) / (len(draws) - 1))
        return sum(spreads) / len(spreads)

    assert within_text_spread(0.0) == pytest.approx(1 / 12, rel=0.15)  # a uniform's variance
    assert within_text_spread(0.9) < 0.35 / 12
