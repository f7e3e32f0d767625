"""How a deploy's baseline of several days holds its false-alarm rate when days differ.

A no-change deploy compares today's hours with the previous version's same hours on
earlier days. Besides sampling noise, each day's mean over those hours has a day effect
(standard deviation ``sigma_B``): other users, a busy Monday, a weekly pattern. This
draws, for each spread of day effects, many no-change comparisons (each day's and
today's means from ``n`` values of variance ``s^2``, as the detector's sums would give)
and prints, for three baselines, the share of comparisons whose z passes the one-sided
0.1% and 1% points of the normal (what a test that trusts its variance expects), and the
baseline's cost in standard error against the ideal one (seven days, ``sigma_B`` known):

* ``one day``: the previous day's sums as they are (the detector before
  ``REGRESSION_BASELINE_DAYS``);
* ``7 days, plain``: the seven days' sums as one sample (day effects ignored);
* ``7 days, counted``: :func:`service.detect.days.pooled_days`, the detector's.

Then a weekly pattern: two days of the week better by ``e``; today a weekday or a
weekend day.

Run: ``python tests/benchmarks/bench_day_baseline.py`` (about a minute; ``--reps``).
Prints tables; nothing is asserted (the unit tests assert the spread in
``tests/unit/detect/test_days.py``).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from service.detect.days import pooled_days
from service.detect.history import sample_moments
from service.metrics.aggregates import Moments

N = 500
"""Values per day over the compared hours."""
S2 = 0.16
"""Their variance (a metric near 0.8)."""
Z_POINTS = (3.09, 2.33)
"""One-sided normal points of 0.1% and 1%."""


def _day(mean: float) -> Moments:
    return sample_moments(N, mean, S2 / N)


def comparisons(effects: np.ndarray, noise: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """z and standard error of each comparison for each baseline; row 0 is today."""
    means = 0.8 + effects + noise
    out: dict[str, tuple[list[float], list[float]]] = {
        "one day": ([], []),
        "7 days, plain": ([], []),
        "7 days, counted": ([], []),
    }
    v_today = S2 / N
    for row in means:
        today, days = row[0], [_day(m) for m in row[1:]]
        bases = {
            "one day": days[0],
            "7 days, plain": sum(days, Moments()),
            "7 days, counted": pooled_days(days),
        }
        for name, base in bases.items():
            se = math.sqrt(v_today + (base.variance or 0.0) / base.count)
            out[name][0].append((today - (base.mean or 0.0)) / se)
            out[name][1].append(se)
    return {k: (np.array(z), np.array(se)) for k, (z, se) in out.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    started = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    noise_sd = math.sqrt(S2 / N)
    print(
        f"{args.reps} no-change comparisons per row, {N} values a day, sd of a day's mean "
        f"from sampling {noise_sd:.4f}; today against 7 previous days"
    )
    print()
    header = "| day effect sd | baseline | z < -3.09 (0.1% expected) | z < -2.33 (1%) |"
    print(header + " standard error: used / true | true / one day's true |")
    print("|---|---|---|---|---|---|")
    for ratio in (0.0, 0.25, 0.5, 1.0, 2.0, 4.0):
        sigma = ratio * noise_sd
        effects = rng.normal(0.0, sigma, (args.reps, 8))
        noise = rng.normal(0.0, noise_sd, (args.reps, 8))
        one_day = math.sqrt(2 * (S2 / N + sigma**2))
        for name, (z, se) in comparisons(effects, noise).items():
            days = 1 if name == "one day" else 7
            true = math.sqrt((S2 / N + sigma**2) * (1 + 1 / days))
            tails = " | ".join(f"{np.mean(z < -p):.2%}" for p in Z_POINTS)
            label = f"{sigma:.4f} ({ratio:g} x sampling)"
            print(
                f"| {label} | {name} | {tails} | {np.mean(se) / true:.2f} | {true / one_day:.2f} |"
            )
    print()
    print("| weekly pattern: two days better by | today | baseline | z (mean) | z < -3.09 |")
    print("|---|---|---|---|---|")
    for e in (0.02, 0.05, 0.08):
        week = np.array([0, 0, 0, 0, 0, e, e])
        for today, label in ((0.0, "a weekday"), (e, "a weekend day")):
            reps = args.reps // 10
            effects = np.zeros((reps, 8))
            effects[:, 0] = today
            effects[:, 1:] = np.array([np.roll(week, -k) for k in range(7)])[
                rng.integers(0, 7, reps)
            ]
            noise = rng.normal(0.0, noise_sd, (reps, 8))
            for name, (z, _) in comparisons(effects, noise).items():
                print(
                    f"| {e:.2f} | {label} | {name} | {np.mean(z):+.2f} | {np.mean(z < -3.09):.1%} |"
                )
    print(f"\n{time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
