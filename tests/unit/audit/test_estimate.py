"""The audited estimates (service/audit/estimate.py): exact mergeable sums, the closed form
of the module docstring checked against numpy, unbiasedness whatever the live labels'
bias, the interval's coverage and width, and the degenerate cases."""

from __future__ import annotations

import random

import numpy as np
import pytest
from numpy.typing import NDArray

from service.audit.estimate import (
    AUDIT_TERMS,
    FEW_AUDITED,
    SCALE,
    Z95,
    AuditSums,
    LiveSums,
    audit_only,
    estimate,
)
from service.metrics.aggregates import aggregate

Array = NDArray[np.float64]


def live_sums(f: Array, g: Array) -> LiveSums:
    """Read off the live aggregates as the service keeps them (NaN: unlabelled)."""
    moments = aggregate({"m": np.where(g > 0, f, np.nan)}).get("m")
    if moments is None:
        return LiveSums(len(f), 0, 0, 0)
    return LiveSums(len(f), moments.sum_fx, moments.sum_sq_fx, moments.count)


def audit_sums(y: Array, a: Array, f: Array, g: Array) -> AuditSums:
    total = AuditSums()
    for values in zip(y.tolist(), a.tolist(), f.tolist(), g.tolist(), strict=True):
        total += AuditSums.of(*values)
    return total


def population(rng: np.random.Generator, size: int, bias: float = 0.3) -> dict[str, Array]:
    """A synthetic slice: a answerable (85%), y | a = 1 in {0, 0.5, 1} with mean 0.65 (so
    theta = 0.65 exactly), live labels more likely on good queries, and f = y + ``bias``
    (capped at 1) where labelled: live labels that overstate quality."""
    a = (rng.random(size) < 0.85).astype(np.float64)
    y = a * rng.choice([0.0, 0.5, 1.0], size=size, p=[0.2, 0.3, 0.5])
    g = np.where(a > 0, rng.random(size) < 0.3 + 0.5 * y, rng.random(size) < 0.2)
    g = g.astype(np.float64)
    f = g * np.where(a > 0, np.minimum(1.0, y + bias), 0.5)
    return {"y": y, "a": a, "f": f, "g": g}


THETA = 0.65


def sums_of(pop: dict[str, Array], audited: NDArray[np.bool_]) -> tuple[LiveSums, AuditSums]:
    parts = (pop[t][audited] for t in "yafg")
    return live_sums(pop["f"], pop["g"]), audit_sums(*parts)


def closed_form(
    pop: dict[str, Array], audited: NDArray[np.bool_], tuned: bool
) -> tuple[float, float, float, float]:
    """theta_hat, its sd, m_a and lambda straight from the module docstring's formulas."""
    f_all, g_all = pop["f"], pop["g"]
    y, a, f, g = (pop[t][audited] for t in "yafg")
    big_n, n = len(f_all), len(y)
    if tuned:  # PPI++ for the ratio: the lambda that minimises the delta-method variance
        pilot = y.mean() / a.mean()
        u, v = y - pilot * a, f - pilot * g
        cov = np.cov(u, v, ddof=0)[0, 1]
        lam = float(np.clip(cov / ((1 + n / big_n) * np.var(v)), 0.0, 1.0))
    else:
        lam = 1.0
    m_y = lam * f_all.mean() + (y - lam * f).mean()
    m_a = lam * g_all.mean() + (a - lam * g).mean()
    theta = m_y / m_a
    z = lam * (f_all - theta * g_all)
    w = (y - theta * a) - lam * (f - theta * g)
    sd = np.sqrt(z.var(ddof=1) / big_n + w.var(ddof=1) / n) / m_a
    return float(theta), float(sd), float(m_a), lam


# -- exact sums ------------------------------------------------------------------------


def test_of_keeps_every_term_in_fixed_point() -> None:
    one = AuditSums.of(0.5, 1.0, 0.25, 1.0)
    values = {"y": 0.5, "a": 1.0, "f": 0.25, "g": 1.0}
    expected = [v * SCALE for v in values.values()]
    expected += [values[t[0]] * values[t[1]] * SCALE for t in AUDIT_TERMS[4:]]
    assert one.n == 1
    assert list(one.sums) == [int(e) for e in expected]
    with pytest.raises(ValueError, match="y="):
        AuditSums.of(1.5, 1.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="f="):
        AuditSums.of(0.5, 1.0, -0.1, 0.0)


def test_parts_merge_to_the_whole_in_any_order_and_retract() -> None:
    pop = population(np.random.default_rng(3), 600)
    rows = [AuditSums.of(*v) for v in zip(*(pop[t].tolist() for t in "yafg"), strict=True)]
    whole = sum(rows, AuditSums())
    assert whole.n == 600
    shuffled = rows[:]
    random.Random(5).shuffle(shuffled)
    parts = [sum(shuffled[i : i + 37], AuditSums()) for i in range(0, 600, 37)]
    assert sum(reversed(parts), AuditSums()) == whole  # bit for bit
    # each sum is the exact sum of the rounded values
    assert whole.sums[0] == sum(round(v * SCALE) for v in pop["y"].tolist())
    # a later audit replaces an earlier one: retract the old contribution, add the new
    replaced = whole - rows[10] + AuditSums.of(1.0, 1.0, 0.0, 0.0)
    assert replaced.n == 600
    assert replaced == sum([*rows[:10], AuditSums.of(1.0, 1.0, 0.0, 0.0), *rows[11:]], AuditSums())
    assert whole - whole == AuditSums()
    assert whole.mean("y") == pytest.approx(pop["y"].mean(), abs=1e-15)
    assert whole.mean("yf") == pytest.approx((pop["y"] * pop["f"]).mean(), abs=1e-15)


def test_record_round_trip_is_exact_beyond_64_bits() -> None:
    big = sum([AuditSums.of(1.0, 1.0, 1.0, 1.0)] * 5000, AuditSums())
    assert big.sums[0] > 2**63  # the sums outgrow int64
    record = big.to_record()
    assert record[0] == 5000
    assert all(isinstance(v, str) for v in record[1:])
    assert AuditSums.from_record(record) == big
    assert AuditSums.from_record(AuditSums().to_record()) == AuditSums()
    with pytest.raises(ValueError, match="values"):
        AuditSums.from_record(record[:-1])


# -- the closed form -------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("tuned", [True, False])
def test_estimate_equals_the_docstring_formulas_computed_with_numpy(seed: int, tuned: bool) -> None:
    rng = np.random.default_rng(seed)
    pop = population(rng, 3000, bias=rng.uniform(0.0, 0.5))
    if seed % 2:  # live labels that track the truth only loosely: lambda inside (0, 1)
        noisy = np.clip(pop["f"] + rng.normal(0.0, 0.4, 3000), 0.0, 1.0) * pop["g"]
        pop["f"] = noisy
    audited = rng.random(3000) < 0.08
    live, audit = sums_of(pop, audited)
    got = estimate(live, audit, tuned=tuned)
    theta, sd, m_a, lam = closed_form(pop, audited, tuned)
    if seed % 2 and tuned:
        assert 0.05 < lam < 0.95, lam  # the clipping is not what the comparison checks
    assert got.estimate == pytest.approx(theta, abs=1e-9)
    assert got.ci_low == pytest.approx(theta - Z95 * sd, abs=1e-9)
    assert got.ci_high == pytest.approx(theta + Z95 * sd, abs=1e-9)
    assert got.answerable_share == pytest.approx(m_a, abs=1e-12)
    labelled = pop["g"] > 0
    assert got.observed == pytest.approx(pop["f"][labelled].mean(), abs=1e-12)
    assert got.audited == int(audited.sum())
    assert got.queries == 3000
    assert not got.few


def test_audit_only_is_the_ratio_of_the_sample_means_with_its_delta_interval() -> None:
    rng = np.random.default_rng(11)
    pop = population(rng, 400)
    y, a = pop["y"], pop["a"]
    got = audit_only(audit_sums(y, a, pop["f"], pop["g"]))
    assert got is not None
    theta = y.sum() / a.sum()
    sd = np.sqrt((y - theta * a).var(ddof=1) / len(y)) / a.mean()
    assert got == pytest.approx((theta, theta - Z95 * sd, theta + Z95 * sd), abs=1e-12)


# -- unbiased whatever the live labels' bias -------------------------------------------


def test_plain_ppi_means_are_exactly_unbiased_over_a_partition_into_samples() -> None:
    """Split a fixed population at random into N/n disjoint samples of n: each is a simple
    random sample, and the plain (lambda 1) prediction-powered means averaged over them are
    exactly the population means (their expectation), however wrong the live labels are."""
    rng = np.random.default_rng(21)
    size, n = 4000, 200
    pop = population(rng, size, bias=0.3)
    order = rng.permutation(size)
    m_y, m_a = [], []
    for block in range(size // n):
        audited = np.zeros(size, dtype=bool)
        audited[order[block * n : (block + 1) * n]] = True
        got = estimate(*sums_of(pop, audited), tuned=False)
        assert got.estimate is not None
        assert got.answerable_share is not None
        assert 0.0 < got.estimate < 1.0
        assert 0.0 < got.answerable_share < 1.0
        m_y.append(got.estimate * got.answerable_share)
        m_a.append(got.answerable_share)
    assert np.mean(m_y) == pytest.approx(pop["y"].mean(), abs=1e-12)
    assert np.mean(m_a) == pytest.approx(pop["a"].mean(), abs=1e-12)


@pytest.mark.parametrize("tuned", [False, True])
def test_the_estimate_is_centred_on_the_truth_where_observed_is_not(tuned: bool) -> None:
    rng = np.random.default_rng(8)
    size, rate = 20_000, 0.02
    pop = population(rng, size, bias=0.3)
    truth = pop["y"][pop["a"] > 0].mean()
    draws = []
    observed = None
    for _ in range(600):
        got = estimate(*sums_of(pop, rng.random(size) < rate), tuned=tuned)
        assert got.estimate is not None
        draws.append(got.estimate)
        observed = got.observed
    assert observed is not None
    assert observed - truth > 0.15
    mc_error = np.std(draws) / np.sqrt(len(draws))
    # the ratio m_y / m_a has a bias of order 1/n (n ~ 400 here), far below this bound
    assert abs(np.mean(draws) - truth) < 4 * mc_error + 0.002, (np.mean(draws), truth)


# -- the interval ----------------------------------------------------------------------


def _scenario(name: str, rng: np.random.Generator, size: int) -> dict[str, Array]:
    pop = population(rng, size, bias=0.3)
    if name == "near perfect":  # a label on every answerable query, f = y give or take 0.02
        pop["g"] = pop["a"].copy()
        pop["f"] = np.clip(pop["y"] + rng.normal(0.0, 0.02, size), 0.0, 1.0) * pop["g"]
    elif name == "noise":  # labels and values unrelated to the truth
        pop["g"] = (rng.random(size) < 0.6).astype(np.float64)
        pop["f"] = rng.random(size) * pop["g"]
    return pop


@pytest.mark.parametrize(
    ("name", "rate"),
    [
        ("biased", 0.05),  # live labels that overstate by 0.3 but track the truth
        ("near perfect", 0.02),  # the Var(z) / N term is most of the variance
        ("noise", 0.05),  # lambda near 0: the audit alone
    ],
)
def test_the_95_interval_covers_the_truth_95_percent_of_the_time(name: str, rate: float) -> None:
    """Fresh populations of 4,000 queries from a model with theta = 0.65, audited at
    ``rate``: the share of 400 intervals that cover theta (binomial sd 1.1 points)."""
    rng = np.random.default_rng(sum(map(ord, name)))
    covered = 0
    for _ in range(400):
        pop = _scenario(name, rng, 4000)
        got = estimate(*sums_of(pop, rng.random(4000) < rate))
        assert got.ci_low is not None
        assert got.ci_high is not None
        covered += got.ci_low <= THETA <= got.ci_high
    assert 0.92 <= covered / 400 <= 0.98, covered / 400


def _mean_widths(pop_of: dict[str, Array], rate: float, seed: int) -> tuple[float, float, float]:
    rng = np.random.default_rng(seed)
    size = len(pop_of["y"])
    ppi, alone, lams = [], [], []
    for _ in range(30):
        audited = rng.random(size) < rate
        live, audit = sums_of(pop_of, audited)
        got = estimate(live, audit)
        only = audit_only(audit)
        assert got.ci_low is not None
        assert got.ci_high is not None
        assert only is not None
        ppi.append(got.ci_high - got.ci_low)
        alone.append(only[2] - only[1])
        lams.append(closed_form(pop_of, audited, tuned=True)[3])
    return float(np.mean(ppi)), float(np.mean(alone)), float(np.mean(lams))


def test_the_interval_is_narrower_than_the_audit_alone_when_the_live_labels_track_the_truth() -> (
    None
):
    pop = population(np.random.default_rng(31), 10_000, bias=0.2)
    ppi, alone, lam = _mean_widths(pop, 0.03, 32)
    assert lam > 0.5
    assert ppi < 0.8 * alone, (ppi, alone)


def test_the_interval_is_not_much_wider_than_the_audit_alone_when_the_live_labels_are_noise() -> (
    None
):
    pop = _scenario("noise", np.random.default_rng(41), 10_000)
    ppi, alone, lam = _mean_widths(pop, 0.03, 42)
    assert lam < 0.15
    assert ppi < 1.1 * alone, (ppi, alone)


def test_the_tuning_is_for_the_ratio_not_for_the_mean_of_y() -> None:
    """Where the metric hardly varies over answerable queries but the live labels follow
    answerability (labels on 80% of the answerable, 10% of the others, with values unrelated
    to y), Cov(y, f) is large only through a: the mean-of-y lambda (about 0.9 here) made
    the interval 2.2 times the audit alone's; the ratio's lambda stays near 0."""
    rng = np.random.default_rng(61)
    size = 20_000
    a = (rng.random(size) < 0.8).astype(np.float64)
    y = a * np.clip(0.8 + rng.normal(0.0, 0.05, size), 0.0, 1.0)
    g = np.where(a > 0, rng.random(size) < 0.8, rng.random(size) < 0.1).astype(np.float64)
    pop = {"y": y, "a": a, "f": g * rng.uniform(0.3, 1.0, size), "g": g}
    ppi, alone, lam = _mean_widths(pop, 0.02, 62)
    assert lam < 0.2
    assert ppi < 1.05 * alone, (ppi, alone)


# -- degenerate cases ------------------------------------------------------------------


def test_without_audited_queries_only_observed_is_known() -> None:
    live = LiveSums(100, 30 * SCALE, 20 * SCALE, 50)
    got = estimate(live, AuditSums())
    assert got.observed == pytest.approx(0.6)
    assert (got.estimate, got.ci_low, got.ci_high, got.answerable_share) == (None,) * 4
    assert got.audited == 0
    assert got.queries == 100
    assert got.few
    assert audit_only(AuditSums()) is None
    nothing = estimate(LiveSums(0, 0, 0, 0), AuditSums())
    assert nothing.observed is None
    assert nothing.estimate is None
    assert nothing.to_dict()["few_audited"] is True


def test_with_no_answerable_audited_query_there_is_no_estimate() -> None:
    audit = sum([AuditSums.of(0.0, 0.0, 0.0, 0.0)] * 40, AuditSums())
    got = estimate(LiveSums(40, 0, 0, 0), audit)
    assert got.estimate is None
    assert got.audited == 40
    assert not got.few
    assert audit_only(audit) is None


def test_more_audited_than_finalised_queries_gives_no_estimate() -> None:
    """Audits count at their own time: a short span can hold the audits of queries before
    it (of a version that no longer serves). Those are no sample of its queries: only the
    live value is known."""
    audit = sum([AuditSums.of(1.0, 1.0, 1.0, 1.0)] * 3, AuditSums())
    got = estimate(LiveSums(2, 2 * SCALE, 2 * SCALE, 2), audit)
    assert got.observed == 1.0
    assert (got.estimate, got.ci_low, got.ci_high, got.answerable_share) == (None,) * 4
    assert got.audited == 3


def test_a_constant_live_metric_gives_lambda_zero_the_audit_alone() -> None:
    """With f the same on every audited query there is nothing to tune on: lambda is 0 and
    the estimate is the audit alone (its interval widened only by the n - 1 of Var(w))."""
    rng = np.random.default_rng(51)
    pop = population(rng, 2000)
    pop["g"] = np.ones(2000)
    pop["f"] = np.full(2000, 0.75)
    audited = rng.random(2000) < 0.1
    live, audit = sums_of(pop, audited)
    got = estimate(live, audit)
    only = audit_only(audit)
    assert only is not None
    assert got.estimate is not None
    assert got.estimate == pytest.approx(only[0], abs=1e-12)
    assert (got.ci_low, got.ci_high) == pytest.approx(only[1:], abs=1e-12)
    assert got.answerable_share == pytest.approx(pop["a"][audited].mean(), abs=1e-12)
    # plain PPI with a constant f and g: the live parts cancel (f - f = 0, g - g = 0)
    plain = estimate(live, audit, tuned=False)
    assert plain.estimate == pytest.approx(only[0], abs=1e-9)


def test_few_audited_queries_are_flagged_and_the_values_stay_in_the_unit_interval() -> None:
    audit = sum([AuditSums.of(1.0, 1.0, 0.0, 0.0)] * (FEW_AUDITED - 1), AuditSums())
    got = estimate(LiveSums(1000, 0, 0, 0), audit)
    assert got.few
    assert got.estimate == 1.0
    assert got.ci_high == 1.0
    assert got.ci_low is not None
    assert 0.0 <= got.ci_low <= 1.0
    enough = audit + AuditSums.of(1.0, 1.0, 0.0, 0.0)
    assert not estimate(LiveSums(1000, 0, 0, 0), enough).few
