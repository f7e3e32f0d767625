"""What the audited estimates are worth on simulated traffic: coverage, error and width.

For ``--seeds`` seeds and each of four retriever versions of known true quality (true
recall@5 from about 0.5 to 0.85), a day of traffic (``--hours`` at ``--per-hour`` queries
an hour) from the real simulator (:mod:`service.sim.simulator`). Per query:

* ``f`` and ``g`` from its live feedback events (every one of them: no attribution window)
  with the service's own label rules (:class:`service.stream.labels.LabelPolicy`: click 1,
  long click 2, citation 2, judgment its grade, the maximum per chunk) and metric code
  (``judge_batch`` + ``compute_metrics``): f the metric, 0 without a relevant live label;
* ``y`` and ``a`` from the hidden truth, as a careful judge would grade it (R =
  ``SimQuery.relevant``); with probability ``--unanswerable`` (0.1) the judge finds
  nothing (y = 0, a = 0), though the query keeps its live labels, so that the
  answerable share matters.

The audit sample is ``in_audit_sample(query_id, rate)`` at rates 0.01 and 0.05 (the same
queries reused for both), and the estimate is ``service.audit.estimate`` on exact sums.
The truth theta is the mean y over the version's answerable queries. Per (metric, audit
rate), over the (seed, version) cases: the share of 95% intervals covering theta, their
mean width, the width of the audit sample's own interval (``audit_only``), the mean
absolute error of the estimate, the mean absolute bias of ``observed`` (today's live mean
over labelled queries) against theta, and MAE / bias. Target (the issue): coverage 93% to
97%, MAE at most a quarter of the live bias, intervals narrower than the audit alone.

Run: ``python tests/benchmarks/bench_audit_estimates.py [--seeds 40] [--jobs 2]`` (11 CPU
minutes, about 6 on 2 idle cores; ``--small`` for a smoke run of seconds). Prints markdown tables;
not a test: figures, not assertions.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections import defaultdict
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from service.audit.estimate import AuditSums, LiveSums, audit_only, estimate
from service.audit.sample import in_audit_sample
from service.metrics.aggregates import aggregate
from service.metrics.ir import compute_metrics, judge_batch
from service.sim.simulator import RetrieverProfile, SimulationConfig, simulate_queries
from service.stream.events import feedback_from
from service.stream.labels import LabelPolicy
from service.times import HOUR_MS

PROFILES = (
    RetrieverProfile("v-weak", find_rate=0.66, rank_decay=0.7),
    RetrieverProfile("v-fair", find_rate=0.73, rank_decay=0.6),
    RetrieverProfile("v-good", find_rate=0.8, rank_decay=0.5),
    RetrieverProfile("v-best", find_rate=0.88, rank_decay=0.4),
)
RATES = (0.01, 0.05)
DEFAULT_METRICS = ("hit_rate@5", "recall@5", "mrr")


@dataclass(frozen=True, slots=True)
class Case:
    """One (seed, version, metric, audit rate): the truth and what the service would show."""

    metric: str
    rate: float
    version: str
    theta: float
    observed: float
    estimate: float | None
    ci_low: float | None
    ci_high: float | None
    alone: tuple[float, float, float] | None
    audited: int
    answerable: float
    """The true answerable share of the version's queries."""
    answerable_hat: float | None


def _ks(metrics: Sequence[str]) -> tuple[int, ...]:
    ks = {int(m.split("@")[1]) for m in metrics if "@" in m}
    return tuple(sorted(ks)) or (1,)


def run_version(
    seed: int, index: int, hours: float, per_hour: float, metrics: Sequence[str], p_none: float
) -> list[Case]:
    """Every case of one seed's simulated day of one version."""
    profile = PROFILES[index]
    config = SimulationConfig(
        seed=1000 * index + seed,
        duration_ms=round(hours * HOUR_MS),
        queries_per_hour=per_hour,
        before=profile,
        id_prefix=f"s{seed}-{profile.name}-",
    )
    policy = LabelPolicy()
    rankings: list[list[str]] = []
    live: list[dict[str, int]] = []
    truth: list[dict[str, int]] = []
    context_ks: list[int | None] = []
    sampled: dict[float, list[bool]] = {rate: [] for rate in RATES}
    queries = list(simulate_queries(config))
    nothing = np.random.default_rng([seed, index]).random(len(queries)) < p_none
    for query, unanswerable in zip(queries, nothing.tolist(), strict=True):
        grades: dict[str, int] = {}
        for event in query.events[1:]:
            feedback = feedback_from(event.event)
            grade = policy.grade(feedback)
            grades[feedback.chunk_id] = max(grade, grades.get(feedback.chunk_id, -1))
        rankings.append(list(query.results))
        live.append(grades)
        truth.append({} if unanswerable else dict(query.relevant))
        context_ks.append(config.context_k)
        for rate in RATES:
            sampled[rate].append(in_audit_sample(query.query_id, rate))
    ks = _ks(metrics)
    live_values = compute_metrics(judge_batch(rankings, live, context_ks, max(ks)), ks)
    true_batch = judge_batch(rankings, truth, context_ks, max(ks))
    true_values = compute_metrics(true_batch, ks)
    a = true_batch.labelled.astype(np.float64)
    cases = []
    for metric in metrics:
        f_live = live_values[metric]
        g = (~np.isnan(f_live)).astype(np.float64)
        f = np.nan_to_num(f_live, nan=0.0)
        y = np.nan_to_num(true_values[metric], nan=0.0)
        moments = aggregate({metric: f_live})[metric]
        live_sums = LiveSums(len(f), moments.sum_fx, moments.sum_sq_fx, moments.count)
        theta = float(y[a > 0].mean())
        for rate in RATES:
            mask: NDArray[np.bool_] = np.asarray(sampled[rate], dtype=bool)
            audit = AuditSums()
            for row in zip(*(v[mask].tolist() for v in (y, a, f, g)), strict=True):
                audit += AuditSums.of(*row)
            got = estimate(live_sums, audit)
            assert got.observed is not None
            cases.append(
                Case(
                    metric,
                    rate,
                    profile.name,
                    theta,
                    got.observed,
                    got.estimate,
                    got.ci_low,
                    got.ci_high,
                    audit_only(audit),
                    audit.n,
                    float(a.mean()),
                    got.answerable_share,
                )
            )
    return cases


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _covers(low: float | None, high: float | None, value: float) -> bool:
    return low is not None and high is not None and low <= value <= high


def summarise(cases: Sequence[Case], expected: Mapping[tuple[str, str], float]) -> dict[str, float]:
    """The figures over the cases (those with an estimate and an audit-alone interval);
    ``expected``: each (metric, version)'s mean theta over the seeds."""
    done = [c for c in cases if c.estimate is not None and c.alone is not None]
    alone = [c.alone for c in done if c.alone is not None]
    return {
        "cases": len(done),
        "all": len(cases),
        "audited": statistics.fmean(c.audited for c in cases),
        "coverage": statistics.fmean(_covers(c.ci_low, c.ci_high, c.theta) for c in done),
        "coverage_expected": statistics.fmean(
            _covers(c.ci_low, c.ci_high, expected[(c.metric, c.version)]) for c in done
        ),
        "coverage_alone": statistics.fmean(
            _covers(lo, hi, c.theta) for c, (_, lo, hi) in zip(done, alone, strict=True)
        ),
        "width": statistics.fmean((c.ci_high or 0.0) - (c.ci_low or 0.0) for c in done),
        "width_alone": statistics.fmean(hi - lo for _, lo, hi in alone),
        "mae": statistics.fmean(abs((c.estimate or 0.0) - c.theta) for c in done),
        "mae_alone": statistics.fmean(
            abs(t - c.theta) for c, (t, _, _) in zip(done, alone, strict=True)
        ),
        "bias": statistics.fmean(abs(c.observed - c.theta) for c in cases),
    }


def row(label: str, rate: str, x: Mapping[str, float]) -> str:
    return (
        f"| {label} | {rate} | {x['cases']:.0f}/{x['all']:.0f} | {x['audited']:.0f} | "
        f"{_pct(x['coverage'])} | {_pct(x['coverage_expected'])} | {_pct(x['coverage_alone'])} "
        f"| {x['width']:.4f} | {x['width_alone']:.4f} | {_pct(1 - x['width'] / x['width_alone'])} "
        f"| {x['mae']:.4f} | {x['mae_alone']:.4f} | {x['bias']:.4f} | {x['mae'] / x['bias']:.3f} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=40)
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--per-hour", type=float, default=1500.0, help="queries an hour")
    parser.add_argument("--metrics", default=",".join(DEFAULT_METRICS))
    parser.add_argument("--unanswerable", type=float, default=0.1, help="judge finds nothing")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--small", action="store_true", help="2 seeds of 3 hours (a smoke run)")
    args = parser.parse_args()
    if args.small:
        args.seeds, args.hours = 2, 3.0
    metrics = tuple(m.strip() for m in args.metrics.split(",") if m.strip())
    tasks = [(s, i) for s in range(args.seeds) for i in range(len(PROFILES))]
    cases: list[Case] = []
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [
            pool.submit(run_version, s, i, args.hours, args.per_hour, metrics, args.unanswerable)
            for s, i in tasks
        ]
        for future in futures:
            cases.extend(future.result())
    print(
        f"{args.seeds} seeds x {len(PROFILES)} versions, {args.hours:g} h at "
        f"{args.per_hour:g} queries/h each, {_pct(args.unanswerable)} unanswerable\n"
    )
    print(
        "| version | find rate | rank decay | answerable | "
        + " | ".join(f"true {m} | observed {m}" for m in metrics)
        + " |"
    )
    print("|---|---|---|---|" + "---|---|" * len(metrics))
    for profile in PROFILES:
        mine = [c for c in cases if c.version == profile.name and c.rate == RATES[0]]
        share = statistics.fmean(c.answerable for c in mine if c.metric == metrics[0])
        cells = []
        for m in metrics:
            ofm = [c for c in mine if c.metric == m]
            theta = statistics.fmean(c.theta for c in ofm)
            cells.append(f"{theta:.3f} | {statistics.fmean(c.observed for c in ofm):.3f}")
        print(
            f"| {profile.name} | {profile.find_rate} | {profile.rank_decay} | {share:.3f} | "
            + " | ".join(cells)
            + " |"
        )
    by_version: dict[tuple[str, str], list[float]] = defaultdict(list)
    for c in cases:
        if c.rate == RATES[0]:
            by_version[(c.metric, c.version)].append(c.theta)
    expected = {key: statistics.fmean(values) for key, values in by_version.items()}
    print(
        "\n| metric | audit rate | cases with an estimate | audited / case | coverage (95%) "
        "| coverage of E[theta] | audit-alone coverage | mean width | audit-alone width "
        "| narrower than audit alone | MAE | audit-alone MAE | live bias | MAE / bias |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    groups: dict[tuple[str, float], list[Case]] = defaultdict(list)
    for c in cases:
        groups[(c.metric, c.rate)].append(c)
    for m in metrics:
        for rate in RATES:
            print(row(m, f"{rate:g}", summarise(groups[(m, rate)], expected)))
    total = summarise(cases, expected)
    print(row("**overall**", "both", total))
    print(
        "\ncoverage: of theta, the mean over the version's answerable queries in that seed; "
        "of E[theta], the version's mean over all seeds (the expected quality)"
    )
    print(f"overall coverage: {_pct(total['coverage'])} (target 93% to 97%)")
    print(f"overall MAE / live bias: {total['mae'] / total['bias']:.3f} (target at most 0.25)")
    print(
        f"overall width / audit-alone width: {total['width'] / total['width_alone']:.3f} "
        "(target below 1)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
