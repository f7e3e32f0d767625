"""Fixed-point moments: exact merges, means, variances, the published form."""

from __future__ import annotations

import numpy as np
import pytest

from service.metrics.aggregates import SCALE, Moments, aggregate, aggregate_groups


def test_nan_values_stay_out_and_no_data_has_no_mean() -> None:
    result = aggregate({"a": np.array([np.nan, 0.5, 1.0]), "b": np.array([np.nan, np.nan, np.nan])})
    assert result["a"].count == 2
    assert result["a"].mean == 0.75
    assert "b" not in result
    empty = Moments()
    assert empty.mean is None
    assert empty.estimate() is None


def test_mean_and_variance_match_numpy() -> None:
    values = np.random.default_rng(1).random(1001)
    moments = aggregate({"m": values})["m"]
    assert moments.mean == pytest.approx(values.mean(), abs=1e-15)
    assert moments.variance == pytest.approx(values.var(ddof=1), abs=1e-14)
    assert moments.sum == pytest.approx(values.sum(), abs=1e-12)
    assert moments.sum_sq == pytest.approx((values**2).sum(), abs=1e-12)


def test_variance_of_identical_values_is_zero_to_rounding() -> None:
    moments = aggregate({"m": np.full(10_000, 1 / 3)})["m"]
    assert moments.variance is not None
    assert 0.0 <= moments.variance < 1e-15


def test_sums_are_exact_beyond_float_precision() -> None:
    """Adding 1.0 to 2**53 in float64 is lost; the fixed-point sum keeps every unit."""
    many = Moments(count=1, sum_fx=SCALE, sum_sq_fx=SCALE)
    total = Moments()
    for _ in range(5):
        total = total + many
    assert total.sum_fx == 5 * SCALE
    assert total.mean == 1.0


def test_published_form_round_trips() -> None:
    moments = aggregate({"m": np.array([0.25, 0.5, 1 / 3])})["m"]
    assert moments.to_dict() == {"count": 3, "sum": moments.sum, "sum_sq": moments.sum_sq}
    assert Moments.from_dict(moments.to_dict()) == moments


def test_values_outside_unit_interval_are_a_programming_error() -> None:
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        aggregate({"m": np.array([1.5])})


def test_grouping_is_independent_of_batch_composition() -> None:
    rng = np.random.default_rng(5)
    values = rng.random(500)
    groups = rng.integers(0, 7, 500)
    together = aggregate_groups({"m": values}, groups, 7)
    halves = [
        aggregate_groups({"m": values[s]}, groups[s], 7) for s in (slice(0, 250), slice(250, None))
    ]
    for g in range(7):
        assert together[g]["m"] == halves[0][g]["m"] + halves[1][g]["m"]
