"""Mergeable aggregates of per-query metric values: count, sum and sum of squares.

Sums are kept in fixed point: each value v in [0, 1] is rounded once to an integer
number of units of 2**-52 (the spacing of float64 just below 1), and sums of those
integers are exact Python ints. Merging is therefore exactly associative and
commutative: windows, partitions and replicas merge to the same bits in any order,
and a streaming run equals the offline evaluation of the same events exactly, not
just to a tolerance. Each value is off by at most 2**-53 from its float64 value.

numpy does the per-batch work: the 52-bit integers are split into two 26-bit limbs
whose sums cannot overflow int64 (or lose bits in a float64 ``bincount``) for any
batch below 2**26 values.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec
import numpy as np
from numpy.typing import NDArray

from service.metrics.ir import MetricKey
from service.metrics.stats import MeanEstimate, mean_estimate

SCALE_BITS = 52
SCALE = 1 << SCALE_BITS
_LIMB_BITS = 26
_LIMB_MASK = (1 << _LIMB_BITS) - 1
_MAX_BATCH = 1 << _LIMB_BITS
"""At most this many values are summed in one limb (exact below 2**53)."""
_TABLE_QUERIES = 1 << 12
"""Queries aggregated at a time (or as many as there are groups, if more): every
metric's values of this many are one table, a few MB at most."""


class Moments(msgspec.Struct, frozen=True, gc=False):
    """Count, sum and sum of squares of one metric; ``*_fx`` are fixed point (units of 2**-52).

    A frozen msgspec struct rather than a frozen dataclass: every window read back,
    merged or finalised makes a few dozen of them, and a struct is made 8 times faster.
    """

    count: int = 0
    sum_fx: int = 0
    sum_sq_fx: int = 0

    def __add__(self, other: Moments) -> Moments:
        return Moments(
            self.count + other.count,
            self.sum_fx + other.sum_fx,
            self.sum_sq_fx + other.sum_sq_fx,
        )

    @property
    def sum(self) -> float:
        """The sum as a float (correctly rounded from the exact fixed-point sum)."""
        return self.sum_fx / SCALE

    @property
    def sum_sq(self) -> float:
        """The sum of squares as a float."""
        return self.sum_sq_fx / SCALE

    @property
    def mean(self) -> float | None:
        """The mean, or None when there is no data (never 0 for "no data")."""
        return self.sum_fx / (self.count * SCALE) if self.count else None

    @property
    def variance(self) -> float | None:
        """Unbiased sample variance, computed without cancellation from the exact sums."""
        if self.count < 2:
            return None
        # n*sum_sq - sum^2 over n(n-1), with sum_sq and sum in units of 2**-52.
        numerator = self.count * self.sum_sq_fx * SCALE - self.sum_fx * self.sum_fx
        return max(numerator, 0) / (self.count * (self.count - 1) * SCALE * SCALE)

    def estimate(self) -> MeanEstimate | None:
        """Mean with a 95% confidence interval, or None when there is no data."""
        mean = self.mean
        if mean is None:
            return None
        return mean_estimate(mean, self.variance, self.count)

    def to_dict(self) -> dict[str, float | int]:
        """The published form: ``{"count": n, "sum": s, "sum_sq": q}``."""
        return {"count": self.count, "sum": self.sum, "sum_sq": self.sum_sq}

    @classmethod
    def from_dict(cls, data: Mapping[str, float | int]) -> Moments:
        """Inverse of :meth:`to_dict` (exact while sums stay below 2 or so; else within 2**-52)."""
        return cls(
            int(data["count"]),
            round(float(data["sum"]) * SCALE),
            round(float(data["sum_sq"]) * SCALE),
        )


MetricAggregates = dict[MetricKey, Moments]
"""Metric key (``recall@5``) -> its moments."""


def to_fixed(values: NDArray[np.float64]) -> NDArray[np.int64]:
    """Round values in [0, 1] to integer units of 2**-52."""
    if values.size and (np.nanmin(values) < 0.0 or np.nanmax(values) > 1.0):
        raise ValueError("metric values must lie in [0, 1]")
    return np.rint(values * SCALE).astype(np.int64)


def _limb_sums(
    fixed: NDArray[np.int64], cells: NDArray[np.int64], n_cells: int, present: NDArray[np.int64]
) -> list[int]:
    """Exact sums of fixed-point integers below 2**53 per cell, for the ``present`` cells."""
    hi = np.bincount(cells, weights=fixed >> _LIMB_BITS, minlength=n_cells)[present]
    lo = np.bincount(cells, weights=fixed & _LIMB_MASK, minlength=n_cells)[present]
    # (as Python floats first: exact integers below 2**53, and far cheaper than numpy scalars)
    return [(int(h) << _LIMB_BITS) + int(w) for h, w in zip(hi.tolist(), lo.tolist(), strict=True)]


def aggregate_groups(
    values: Mapping[str, NDArray[np.float64]],
    groups: NDArray[np.int64],
    n_groups: int,
) -> list[MetricAggregates]:
    """Aggregate per-query metric values into ``n_groups`` groups; NaN values are left out.

    ``groups[i]`` is the group index of query i. Returns one mapping per group, with a
    key only for metrics that have at least one value in that group.

    Every metric's values of a part of the queries are one table, summed in one
    ``bincount`` per sum over its (metric, group) cells.
    """
    result: list[MetricAggregates] = [{} for _ in range(n_groups)]
    keys = list(values)
    n_cells = len(keys) * n_groups  # (metric, group) pairs, metric first
    step = min(max(_TABLE_QUERIES, n_groups), _MAX_BATCH)
    for start in range(0, len(groups) if keys else 0, step):
        part = slice(start, start + step)
        table = np.stack([values[key][part] for key in keys])
        metric, query = np.nonzero(~np.isnan(table))  # (ordered by metric, then query)
        if len(metric) == 0:
            continue
        cells = metric * n_groups + groups[part][query]
        v = table[metric, query]
        counts = np.bincount(cells, minlength=n_cells)
        present = np.flatnonzero(counts)
        sums = _limb_sums(to_fixed(v), cells, n_cells, present)
        sums_sq = _limb_sums(to_fixed(v * v), cells, n_cells, present)
        for c, n, total, total_sq in zip(
            present.tolist(), counts[present].tolist(), sums, sums_sq, strict=True
        ):
            key, gi = keys[c // n_groups], c % n_groups
            add = Moments(n, total, total_sq)
            current = result[gi].get(key)
            result[gi][key] = add if current is None else current + add
    return result


def aggregate(values: Mapping[str, NDArray[np.float64]]) -> MetricAggregates:
    """Aggregate per-query metric values into one group."""
    n = len(next(iter(values.values()))) if values else 0
    return aggregate_groups(values, np.zeros(n, dtype=np.int64), 1)[0]


def merge(parts: Iterable[Mapping[str, Moments]]) -> MetricAggregates:
    """Merge aggregates key by key (exact, associative and commutative)."""
    merged: MetricAggregates = {}
    for part in parts:
        merge_into(merged, part)
    return merged


def merge_into(target: MetricAggregates, part: Mapping[str, Moments]) -> None:
    """Merge ``part`` into ``target`` in place (its moments are immutable: safe to share)."""
    for key, moments in part.items():
        current = target.get(key)
        target[key] = moments if current is None else current + moments
