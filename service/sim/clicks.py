"""How simulated users and the answer generator react to a ranked list: the feedback.

Clicks follow a position-biased, dependent-click cascade. The user reads the list
top-down. Rank 1 is always examined; after each rank the user goes on with probability
``examine_decay``, so rank r is examined with probability ``examine_decay ** (r - 1)``
unless the user already stopped. An examined result of true grade g (0 = not relevant)
is clicked with probability ``click_by_grade[g]``; a click on a grade-g result
satisfies the user, who then stops, with probability ``stop_by_grade[g]``. Clicks on
relevant results are mostly long (dwell >= 30 s), clicks on non-relevant ones (noise)
are short.

Timing: the first click comes log-uniformly between ``first_click_delay_ms`` bounds
after the query (a ``straggler_rate`` share comes back to the tab later, up to the
caller's ``max_delay_ms``); each later click follows the previous one after its dwell
and a short pause. Delays never exceed ``max_delay_ms``.

Citations: one generated answer (1..10 s after the query by default) cites relevant
chunks among the first ``context_k`` results with ``citation_rate``, non-relevant ones
with ``citation_noise_rate``, and sometimes a relevant chunk that was not retrieved.
Judgments: a few queries get an explicit grade for each of their first ``context_k``.

Label shifts (:class:`service.sim.shape.TrafficShape`) multiply each click's and each
citation's probability by a scale; the draws stay the same in number and order (the
threshold moves, not the draw), so a shift changes nothing before its time.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from service.errors import ConfigError

LONG_DWELL_MS = 30_000
"""The contract's long-click threshold: a click with at least this dwell has grade 2."""


class Click(NamedTuple):
    """One click: 1-based rank in the logged list, dwell and delay after the query (ms)."""

    rank: int
    dwell_ms: int
    delay_ms: int


def check_rate(name: str, value: float) -> None:
    """Raise ConfigError unless ``value`` is a probability."""
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f"{name} must be a probability in [0, 1], got {value!r}")


@dataclass(frozen=True, slots=True)
class ClickModel:
    """Parameters of the cascade; tuples ``*_by_grade`` are indexed by true grade 0..3."""

    examine_decay: float = 0.8
    click_by_grade: tuple[float, float, float, float] = (0.03, 0.45, 0.65, 0.85)
    stop_by_grade: tuple[float, float, float, float] = (0.0, 0.3, 0.5, 0.7)
    long_dwell_rate: float = 0.85
    """Share of clicks on relevant results whose dwell is long (>= 30 s)."""
    first_click_delay_ms: tuple[int, int] = (2_000, 120_000)
    straggler_rate: float = 0.02
    """Share of clicking users whose first click comes after ``first_click_delay_ms``."""

    def __post_init__(self) -> None:
        check_rate("examine_decay", self.examine_decay)
        check_rate("long_dwell_rate", self.long_dwell_rate)
        check_rate("straggler_rate", self.straggler_rate)
        for name in ("click_by_grade", "stop_by_grade"):
            values = getattr(self, name)
            if len(values) != 4:
                raise ConfigError(f"{name} needs 4 probabilities (grades 0..3), got {values!r}")
            for value in values:
                check_rate(name, value)
        low, high = self.first_click_delay_ms
        if not 1 <= low <= high:
            raise ConfigError(
                f"first_click_delay_ms must be (low, high) with 1 <= low <= high, "
                f"got {self.first_click_delay_ms!r}"
            )


def _dwell_ms(rng: random.Random, long: bool) -> int:
    if long:  # 30 s to ~5 min, most around a minute
        return LONG_DWELL_MS + int(rng.expovariate(1 / 45_000))
    return rng.randint(1_000, LONG_DWELL_MS - 1_000)


def simulate_clicks(
    rng: random.Random,
    grades: Sequence[int],
    model: ClickModel,
    max_delay_ms: int,
    *,
    scale: float = 1.0,
) -> list[Click]:
    """The clicks of one user on a list whose true grades are ``grades`` (rank 1 first);
    ``scale`` multiplies every click probability (a label shift: 0.5 halves the clicks)."""
    clicks: list[Click] = []
    delay_ms = 0
    for index, grade in enumerate(grades):
        if index and rng.random() >= model.examine_decay:
            break
        if rng.random() >= model.click_by_grade[grade] * scale:
            continue
        if not clicks:
            low, high = model.first_click_delay_ms
            if rng.random() < model.straggler_rate:
                delay_ms = rng.randint(high, max(high, max_delay_ms))
            else:
                delay_ms = int(math.exp(rng.uniform(math.log(low), math.log(high))))
        else:
            delay_ms += clicks[-1].dwell_ms + rng.randint(2_000, 10_000)
        long = grade > 0 and rng.random() < model.long_dwell_rate
        clicks.append(Click(index + 1, _dwell_ms(rng, long), min(delay_ms, max_delay_ms)))
        if rng.random() < model.stop_by_grade[grade]:
            break
    return clicks


class FeedbackModel(Protocol):
    """What the feedback of one query depends on (``SimulationConfig`` has it all)."""

    @property
    def clicks(self) -> ClickModel: ...
    @property
    def max_feedback_delay_ms(self) -> int: ...
    @property
    def context_k(self) -> int: ...
    @property
    def citation_delay_ms(self) -> tuple[int, int]: ...
    @property
    def citation_rate(self) -> float: ...
    @property
    def citation_noise_rate(self) -> float: ...
    @property
    def unretrieved_citation_rate(self) -> float: ...
    @property
    def judgment_rate(self) -> float: ...


def simulate_feedback(
    rng: random.Random,
    results: list[str],
    relevant: Mapping[str, int],
    config: FeedbackModel,
    *,
    clicks_scale: float = 1.0,
    citations_scale: float = 1.0,
) -> Iterator[tuple[int, str, str, dict[str, object]]]:
    """(delay_ms, chunk_id, signal, extra fields) of each feedback event of one query;
    the scales multiply each click's and each citation's probability (label shifts)."""
    c = config
    grades = [relevant.get(chunk, 0) for chunk in results]
    clicks = simulate_clicks(rng, grades, c.clicks, c.max_feedback_delay_ms, scale=clicks_scale)
    for click in clicks:
        yield click.delay_ms, results[click.rank - 1], "click", {"dwell_ms": click.dwell_ms}
    context = results[: c.context_k]
    answer_ms = rng.randint(*c.citation_delay_ms)  # one answer cites all of its chunks
    for chunk, grade in zip(context, grades, strict=False):
        if rng.random() < (c.citation_rate if grade else c.citation_noise_rate) * citations_scale:
            yield answer_ms, chunk, "citation", {}
    if rng.random() < c.unretrieved_citation_rate * citations_scale:
        missing = sorted(set(relevant) - set(results))  # sorted: set order varies by process
        if missing:
            yield answer_ms, rng.choice(missing), "citation", {}
    if rng.random() < c.judgment_rate:
        judged_ms = rng.randint(min(30_000, c.max_feedback_delay_ms), c.max_feedback_delay_ms)
        for chunk, grade in zip(context, grades, strict=False):
            yield judged_ms, chunk, "judgment", {"grade": grade}
