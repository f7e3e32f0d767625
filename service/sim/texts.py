"""Repeated query texts: the simulator's Zipf mode.

Real traffic repeats itself: a few texts are asked again and again, most rarely. With a
:class:`TextModel`, each query asks one of ``texts`` texts, the ``i``-th most asked with
probability proportional to ``1 / i ** exponent``, and a text keeps what makes it easy
or hard: its segment, its relevant chunks and their grades, and for each relevant chunk
a latent difficulty ``z`` (a standard normal, drawn once per text from the seed and the
text's rank, whatever the order texts are first asked in).

Whether a retriever finds a relevant chunk stays a draw with probability ``find_rate``
(so every rate, drop and truth of the run is the same as without texts), made through a
Gaussian copula: the chunk is found when ``Phi(rho * z + sqrt(1 - rho ** 2) * e) <
find_rate``, ``e`` a fresh standard normal per query, ``rho ** 2`` =
``persistence``. At 0 repeats are independent; near 1 a text's chunk is found almost
always or almost never, by every version (a hard text stays hard after a deploy): the
share of a query's variance its text's history can explain, which is what a
per-text variance reduction (CUPED) can remove. Where a found chunk is ranked is drawn
the same way, from a second latent ``z`` per chunk, at the version's own rank decay: a
retriever ranks a repeated text alike, up to the same persistence.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from service.errors import ConfigError

RELEVANT_COUNT_WEIGHTS = (0.4, 0.3, 0.2, 0.1)
"""1, 2, 3 or 4 relevant chunks (the simulator's, with or without texts)."""
GRADE_WEIGHTS = (0.3, 0.4, 0.3)
"""Grades 1, 2, 3."""


@dataclass(frozen=True, slots=True)
class TextModel:
    """How query texts repeat (``SimulationConfig.texts``; None: every query is new)."""

    texts: int = 20_000
    """Distinct texts."""
    exponent: float = 1.0
    """Zipf exponent: the i-th most asked text has weight ``1 / i ** exponent``."""
    persistence: float = 0.5
    """Share of the latent variance of finding a text's chunk that is the text's own."""

    def __post_init__(self) -> None:
        if not 1 <= self.texts <= 10_000_000:
            raise ConfigError(f"texts must be in 1..10000000, got {self.texts!r}")
        if not 0.0 <= self.exponent <= 4.0:
            raise ConfigError(f"exponent must be in [0, 4], got {self.exponent!r}")
        if not 0.0 <= self.persistence < 1.0:
            raise ConfigError(f"persistence must be in [0, 1), got {self.persistence!r}")


DEFAULT_TEXTS = TextModel()


@dataclass(frozen=True, slots=True)
class QueryText:
    """One text and what it keeps over its repeats."""

    rank: int
    """1 for the most asked text."""
    text: str
    segment: str
    relevant: dict[str, int]
    """Relevant chunk id -> grade 1..3."""
    latent: dict[str, float]
    """Relevant chunk id -> its difficulty ``z``."""
    placement: dict[str, float]
    """Relevant chunk id -> how low versions rank it when they find it (a ``z`` too)."""


def draw_truth(
    rng: random.Random,
    segments: Sequence[str],
    weights: Sequence[float],
    chunk_id: Callable[[int], str],
    corpus_chunks: int,
) -> tuple[str, dict[str, int]]:
    """A query's segment and relevant chunks (1 to 4, graded 1 to 3), drawn from ``rng``
    in a fixed order: a new query's, or a text's once."""
    segment = rng.choices(segments, weights)[0]
    n_relevant = rng.choices((1, 2, 3, 4), RELEVANT_COUNT_WEIGHTS)[0]
    relevant: dict[str, int] = {}
    while len(relevant) < n_relevant:
        chunk = chunk_id(rng.randrange(corpus_chunks))
        relevant.setdefault(chunk, rng.choices((1, 2, 3), GRADE_WEIGHTS)[0])
    return segment, relevant


def normal_cdf(x: float) -> float:
    """The standard normal distribution function."""
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


class TextCatalog:
    """The texts of a run, drawn by Zipf weight and made on first use."""

    def __init__(
        self,
        model: TextModel,
        seed: int,
        segments: Sequence[tuple[str, float]],
        chunk_id: Callable[[int], str],
        corpus_chunks: int,
    ) -> None:
        self.model = model
        self.seed = seed
        self.segments = [name for name, _ in segments]
        self.segment_weights = [weight for _, weight in segments]
        self.corpus_chunks = corpus_chunks
        self.chunk_id = chunk_id
        weights = (1.0 / (i**model.exponent) for i in range(1, model.texts + 1))
        self._cumulative = list(itertools.accumulate(weights))
        self._made: dict[int, QueryText] = {}
        self.rho = math.sqrt(model.persistence)
        self.noise = math.sqrt(1.0 - model.persistence)

    def draw(self, rng: random.Random) -> QueryText:
        """A text by its Zipf weight (one draw of ``rng``)."""
        u = rng.random() * self._cumulative[-1]
        rank = min(bisect.bisect_right(self._cumulative, u), self.model.texts - 1) + 1
        made = self._made.get(rank)
        if made is None:
            made = self._made[rank] = self._make(rank)
        return made

    def found(self, rng: random.Random, text: QueryText, chunk: str, find_rate: float) -> bool:
        """Whether a retriever with ``find_rate`` finds ``chunk`` for this query of
        ``text`` (one draw of ``rng``): probability ``find_rate``, correlated over the
        text's repeats through the chunk's difficulty."""
        return self._uniform(rng, text.latent[chunk]) < find_rate

    def placed(self, rng: random.Random, text: QueryText, chunk: str) -> float:
        """The uniform that places a found ``chunk`` in the ranking (one draw of ``rng``):
        uniform over the queries, correlated over the text's repeats as finding it is."""
        return self._uniform(rng, text.placement[chunk])

    def _uniform(self, rng: random.Random, z: float) -> float:
        return normal_cdf(self.rho * z + self.noise * rng.gauss(0.0, 1.0))

    def _make(self, rank: int) -> QueryText:
        own = random.Random(f"{self.seed}/text/{rank}")  # (a str seed is hashed stably)
        segment, relevant = draw_truth(
            own, self.segments, self.segment_weights, self.chunk_id, self.corpus_chunks
        )
        latent = {chunk: own.gauss(0.0, 1.0) for chunk in relevant}
        placement = {chunk: own.gauss(0.0, 1.0) for chunk in relevant}
        return QueryText(rank, f"query text {rank}", segment, relevant, latent, placement)
