"""Two versions compared metric by metric (``/api/v1/compare``): Welch, Holm, a verdict."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from service.metrics.aggregates import Moments
from service.metrics.ir import MetricKey
from service.metrics.stats import holm_adjust, welch_test


def compare_metrics(
    baseline: Mapping[MetricKey, Moments],
    candidate: Mapping[MetricKey, Moments],
    *,
    min_labelled: int,
    min_effect: float,
    alpha: float = 0.05,
) -> list[dict[str, Any]]:
    """Two-sided Welch tests per metric, Holm-adjusted, with a verdict each (``/api/v1/compare``).

    Verdicts: ``regression`` / ``improvement`` (adjusted p < alpha and |delta| >=
    min_effect), ``no_significant_difference``, or ``insufficient_data`` (fewer than
    ``min_labelled`` values on a side).
    """
    rows: list[dict[str, Any]] = []
    tested: list[int] = []
    p_values: list[float] = []
    for metric in sorted(set(baseline) | set(candidate)):
        b, c = baseline.get(metric, Moments()), candidate.get(metric, Moments())
        row: dict[str, Any] = {
            "metric": metric,
            "baseline": {"n": b.count, "mean": b.mean},
            "candidate": {"n": c.count, "mean": c.mean},
            "delta": None,
            "ci_low": None,
            "ci_high": None,
            "p_value": None,
            "verdict": "insufficient_data",
        }
        if b.count >= max(2, min_labelled) and c.count >= max(2, min_labelled):
            r = welch_test(
                (b.mean or 0.0, b.variance or 0.0, b.count),
                (c.mean or 0.0, c.variance or 0.0, c.count),
            )
            row.update(delta=r.delta, ci_low=r.ci[0], ci_high=r.ci[1])
            tested.append(len(rows))
            p_values.append(r.p_two_sided)
        rows.append(row)
    for index, p in zip(tested, holm_adjust(p_values), strict=True):
        row = rows[index]
        row["p_value"] = p
        delta = row["delta"]
        if p < alpha and abs(delta) >= min_effect:
            row["verdict"] = "regression" if delta < 0 else "improvement"
        else:
            row["verdict"] = "no_significant_difference"
    return rows
