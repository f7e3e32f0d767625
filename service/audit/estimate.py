"""Audited estimates of the true metrics: prediction-powered inference from exact sums.

For a slice over a span take the N finalised queries, each with ``f`` (the metric under
its live labels, 0 when it has no relevant live label) and ``g`` (1 when it has one), and
the n audited ones among them, each also with ``y`` (the metric with R = the audit's
chunks graded >= 1, 0 when there are none) and ``a`` (1 when the audit found a relevant
chunk: the query is answerable). The estimand is the mean true value over answerable
queries, ``theta = E[y] / E[a]``, the true counterpart of today's live mean over labelled
queries (``observed``).

Prediction-powered means (Angelopoulos et al., Science 2023) with the power tuning of
PPI++ (Angelopoulos, Duchi, Zrnic 2023)::

    m_y = lambda mean_N(f) + mean_n(y - lambda f)      m_a = lambda mean_N(g) + mean_n(a - lambda g)
    theta_hat = m_y / m_a

unbiased for any fixed lambda because the audit sample is a random sample of the
queries, whatever the bias of the live labels. The delta method gives the variance, with
``z = lambda (f - theta g)`` over all N and ``w = (y - theta a) - z`` over the n audited::

    Var(theta_hat) ~ (Var(z) / N + Var(w) / n) / m_a ** 2

and the lambda that minimises it (PPI++'s power tuning, for this ratio)::

    lambda = Cov(y - t a, f - t g) / ((1 + n/N) Var(f - t g))

on the audited queries, with ``t`` the audit sample's own ratio ``mean_n(y) / mean_n(a)``
as the pilot, clipped to [0, 1]: as tight as the live labels allow and never much worse
than the audit sample alone (lambda 0). (The mean-of-y lambda ``Cov(y, f) / ((1 + n/N)
Var(f))`` is not that: where y - theta a varies little but f and g follow whether a query
is answerable, it tunes lambda near 1 and the interval can be twice the audit alone's.)

Everything is a function of sums, kept exact in fixed point (units of 2**-52, as
:mod:`service.metrics.aggregates`), so windows, partitions and replicas merge bit for bit
and any span's estimate is computed from merged sums: per metric key, over the audited
queries, n and the first and second moments of (y, a, f, g) (:class:`AuditSums`); over
all finalised queries, N, the sums of f and f**2 and of g (:class:`LiveSums`, read off the
window's own aggregates: ``f g = f`` and ``g g = g`` there).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

SCALE = 1 << 52
"""Fixed-point units per 1 (as the window aggregates)."""
Z95 = 1.959963984540054
"""The 97.5% quantile of the standard normal: a 95% two-sided interval."""
FEW_AUDITED = 30
"""Below this many audited queries an interval is shown but flagged as few."""

AUDIT_TERMS = ("y", "a", "f", "g", "yy", "ya", "yf", "yg", "aa", "af", "ag", "ff", "fg", "gg")
"""The fixed-point sums of :class:`AuditSums` after its count, in this order."""
_PAIRS = tuple((t[0], t[1]) for t in AUDIT_TERMS[4:])


@dataclass(frozen=True, slots=True)
class AuditSums:
    """Over the audited queries of a span, for one metric key: the count and the exact
    fixed-point sums of (y, a, f, g) and of their pairwise products (``AUDIT_TERMS``)."""

    n: int = 0
    sums: tuple[int, ...] = (0,) * len(AUDIT_TERMS)

    def __add__(self, other: AuditSums) -> AuditSums:
        # (map over operator.add: half the time of a generator, and views merge many)
        return AuditSums(self.n + other.n, tuple(map(operator.add, self.sums, other.sums)))

    def __sub__(self, other: AuditSums) -> AuditSums:
        """A retraction (a judge's later audit of a query replaces its earlier one)."""
        return AuditSums(self.n - other.n, tuple(map(operator.sub, self.sums, other.sums)))

    @classmethod
    def of(cls, y: float, a: float, f: float, g: float) -> AuditSums:
        """One audited query's contribution (every value in [0, 1])."""
        values = {"y": y, "a": a, "f": f, "g": g}
        for name, value in values.items():
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name}={value!r}: audited values must lie in [0, 1]")
        first = [round(values[t] * SCALE) for t in AUDIT_TERMS[:4]]
        second = [round(values[p] * values[q] * SCALE) for p, q in _PAIRS]
        return cls(1, (*first, *second))

    def mean(self, term: str) -> float:
        """The mean of one term over the audited queries (n must be positive)."""
        return self.sums[AUDIT_TERMS.index(term)] / (SCALE * self.n)

    def to_record(self) -> list[int | str]:
        """The published form: ``[n, sum, ...]`` with the sums as decimal strings (exact;
        they outgrow 64 bits in long spans)."""
        return [self.n, *(str(s) for s in self.sums)]

    @classmethod
    def from_record(cls, record: Iterable[int | str]) -> AuditSums:
        values = [int(v) for v in record]
        if len(values) != 1 + len(AUDIT_TERMS):
            raise ValueError(f"an audit aggregate has {1 + len(AUDIT_TERMS)} values, got {values}")
        return cls(values[0], tuple(values[1:]))


@dataclass(frozen=True, slots=True)
class LiveSums:
    """Over every finalised query of a span for which the metric is defined: the count,
    the fixed-point sums of f and f**2 (f is 0 without a relevant live label), and the
    number with a relevant live label (the live aggregates' count)."""

    queries: int
    sum_fx: int
    sum_sq_fx: int
    labelled: int


@dataclass(frozen=True, slots=True)
class Estimate:
    """The audited estimate of one metric's true mean over answerable queries."""

    observed: float | None
    """The live mean over labelled queries (today's number)."""
    estimate: float | None
    ci_low: float | None
    ci_high: float | None
    audited: int
    queries: int
    answerable_share: float | None
    """The estimated share of queries with a relevant chunk (by the audit's judge)."""
    few: bool
    """Fewer than ``FEW_AUDITED`` audited queries: read the interval, not the point."""

    def to_dict(self) -> dict[str, float | int | bool | None]:
        return {
            "observed": self.observed,
            "estimate": self.estimate,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "audited": self.audited,
            "queries": self.queries,
            "answerable_share": self.answerable_share,
            "few_audited": self.few,
        }


def estimate(live: LiveSums, audit: AuditSums, tuned: bool = True) -> Estimate:
    """The prediction-powered estimate with its 95% interval (module docstring); without
    audited queries (or none answerable, or more audited than finalised queries in the
    span) only ``observed`` is known. ``tuned=False``: the
    plain PPI estimate (lambda 1)."""
    big_n, n = live.queries, audit.n
    observed = live.sum_fx / (SCALE * live.labelled) if live.labelled else None
    nothing = Estimate(observed, None, None, None, max(n, 0), big_n, None, n < FEW_AUDITED)
    if big_n <= 0 or n <= 0 or n > big_n:
        # (more audits than queries: audits count in the window of their own time, so a
        # short span can hold the audits of queries before it, of a version that has
        # stopped serving; the audited are then no sample of the span's queries)
        return nothing
    ef, eg = live.sum_fx / (SCALE * big_n), live.labelled / big_n
    eff = live.sum_sq_fx / (SCALE * big_n)
    m = {t: audit.mean(t) for t in AUDIT_TERMS}
    lam = _power(m, n, big_n) if tuned else 1.0
    m_y = lam * ef + m["y"] - lam * m["f"]
    m_a = lam * eg + m["a"] - lam * m["g"]
    if m_a <= 0.0:
        return nothing
    theta = m_y / m_a
    # Var(z) over all N, z = lambda (f - theta g), with f g = f and g g = g there
    ez = lam * (ef - theta * eg)
    ezz = lam * lam * (eff - 2.0 * theta * ef + theta * theta * eg)
    var_z = max(ezz - ez * ez, 0.0) * big_n / max(big_n - 1, 1)
    # Var(w) over the n audited, w = (y - theta a) - lambda (f - theta g)
    coef = {"y": 1.0, "a": -theta, "f": -lam, "g": lam * theta}
    ew = sum(c * m[t] for t, c in coef.items())
    eww = sum(coef[p] * coef[q] * m[p + q] * (1.0 if p == q else 2.0) for p, q in _PAIRS)
    var_w = max(eww - ew * ew, 0.0) * n / max(n - 1, 1)
    sd = math.sqrt(var_z / big_n + var_w / n) / m_a
    low, high = theta - Z95 * sd, theta + Z95 * sd
    return Estimate(
        observed,
        _unit(theta),
        _unit(low),
        _unit(high),
        n,
        big_n,
        _unit(m_a),
        n < FEW_AUDITED,
    )


def audit_only(audit: AuditSums) -> tuple[float, float, float] | None:
    """The estimate from the audit sample alone, ``sum y / sum a``, with its 95% interval
    (what the live labels add is measured against it); None without answerable audits."""
    n = audit.n
    if n < 1:
        return None
    m = {t: audit.mean(t) for t in AUDIT_TERMS}
    if m["a"] <= 0.0:
        return None
    theta = m["y"] / m["a"]
    var = m["yy"] - 2.0 * theta * m["ya"] + theta * theta * m["aa"]
    var -= (m["y"] - theta * m["a"]) ** 2
    sd = math.sqrt(max(var, 0.0) * n / max(n - 1, 1) / n) / m["a"]
    return theta, theta - Z95 * sd, theta + Z95 * sd


def _power(m: Mapping[str, float], n: int, big_n: int) -> float:
    """PPI++'s lambda for the ratio, ``Cov(y - t a, f - t g) / ((1 + n/N) Var(f - t g))``
    on the audited with the pilot ``t = mean(y) / mean(a)`` (0 without answerable audits),
    in [0, 1]."""
    t = m["y"] / m["a"] if m["a"] > 0.0 else 0.0

    def cov(p: str, q: str) -> float:
        return m[p + q] - m[p] * m[q]

    var = cov("f", "f") - 2.0 * t * cov("f", "g") + t * t * cov("g", "g")
    if var <= 1e-15:  # (f - t g) constant, to rounding: nothing to tune on
        return 0.0
    joint = cov("y", "f") - t * cov("y", "g") - t * cov("a", "f") + t * t * cov("a", "g")
    return min(1.0, max(0.0, joint / ((1.0 + n / big_n) * var)))


def _unit(value: float) -> float:
    """Clipped to [0, 1], where every metric lives."""
    return min(1.0, max(0.0, value))
