"""Benchmark: how much of a deploy comparison's variance each query's text history removes.

Issue 34, item 4. Where texts repeat, a query's metric is partly its text's: a hard text
stays hard whatever the version. CUPED (Deng et al., 2013) subtracts that part: with
``X`` the text's mean metric over the old version's history (before the switch) and
``theta = cov(X, Y) / var(X)``, the comparison uses ``Y - theta (X - mean X)``, whose
mean difference is the same in expectation (``X`` is fixed before the switch and the
texts are drawn alike on both sides) and whose variance is ``1 - rho ** 2`` times the
plain one. A sequential test's delay for a given drop grows with the variance, so that
ratio is about the delay ratio CUPED could give the detector.

Each run is ``bench_detector.py``'s week (7 days of the old version at 1,500 queries/h,
three segments, a daily cycle, then the event day), with ``--query-texts`` repeating
texts (``service.sim.texts``). Every query's live metric is computed as the pipeline
does (its feedback within the 30-minute attribution window, graded by the default label
policy, then ``compute_metrics``). At each look ``t`` after the switch it compares the
new version's labelled queries of ``[switch, switch + t)`` with the old version's of the
same hours on each of the 7 days before (the detector's baseline), plainly and with the
text covariate (the old version's queries use their text's mean without themselves).

Printed per metric and look: the median over runs of the variance ratio (CUPED / plain,
the delay ratio to expect), of the two z of a 5-point drop, and over the no-change runs
the mean z, plain and with CUPED (near 0 for both: no bias). Nothing is asserted.

Run: ``python tests/benchmarks/bench_cuped.py [--runs 4] [--texts 20000] [--exponent 1.0]
[--persistence 0.5]`` (about a minute per run and core).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from service.metrics.ir import compute_metrics, judge_batch  # noqa: E402
from service.sim.simulator import simulate_queries  # noqa: E402
from service.sim.texts import TextModel  # noqa: E402
from service.stream.events import FeedbackEvent, feedback_from  # noqa: E402
from service.stream.labels import LabelPolicy  # noqa: E402
from service.times import DAY_MS, MINUTE_MS  # noqa: E402
from tests.benchmarks.bench_detector import simulation  # noqa: E402

METRICS = ("hit_rate@5", "recall@5", "mrr")
LOOKS_MIN = (30, 60, 120)
HISTORY_DAYS = 7
ATTRIBUTION_MS = 30 * MINUTE_MS
SKEW_MS = 5_000


@dataclass(frozen=True, slots=True)
class Queries:
    """One run's labelled queries: time, new version or not, text (an id), metric values."""

    switch_ms: int
    ts: np.ndarray
    new: np.ndarray
    text: np.ndarray
    values: dict[str, np.ndarray]


def labelled_queries(kind: str, seed: int, model: TextModel) -> Queries:
    """Every labelled query of one run with its live metric values."""
    sim = replace(simulation(kind, seed, 1500.0, history_days=HISTORY_DAYS), texts=model)
    policy = LabelPolicy()
    rankings, judgments, ts, new, text = [], [], [], [], []
    text_ids: dict[str, int] = {}  # each text as a small integer, in order of appearance
    for q in simulate_queries(sim):
        grades: dict[str, int] = {}
        for event in q.events[1:]:
            if event.topic != "feedback":
                continue
            fb = feedback_from(event.event)
            if isinstance(fb, FeedbackEvent) and (
                q.timestamp_ms - SKEW_MS <= fb.timestamp_ms <= q.timestamp_ms + ATTRIBUTION_MS
            ):
                grades[fb.chunk_id] = max(policy.grade(fb), grades.get(fb.chunk_id, -1))
        if not any(g >= 1 for g in grades.values()):
            continue  # unlabelled: no metric value
        rankings.append(list(q.results))
        judgments.append(grades)
        ts.append(q.timestamp_ms)
        new.append(q.retriever != sim.before.name)
        text.append(text_ids.setdefault(str(q.events[0].event["query"]), len(text_ids)))
    metrics = compute_metrics(judge_batch(rankings, judgments, ideal_depth=10), (5, 10))
    assert sim.switch_at_ms is not None
    return Queries(
        sim.switch_at_ms,
        np.asarray(ts, dtype=np.int64),
        np.asarray(new, dtype=bool),
        np.asarray(text, dtype=np.int64),
        {m: np.nan_to_num(metrics[m]) for m in METRICS},
    )


def covariate(q: Queries, y: np.ndarray) -> np.ndarray:
    """Each query's text mean over the old version's queries before the switch (without
    the query itself); the history's mean where the text has no other such query."""
    history = (q.ts < q.switch_ms) & ~q.new
    size = int(q.text.max()) + 1
    sums = np.bincount(q.text[history], weights=y[history], minlength=size)
    counts = np.bincount(q.text[history], minlength=size).astype(np.float64)
    s, n = sums[q.text], counts[q.text]
    s = np.where(history, s - y, s)
    n = np.where(history, n - 1, n)
    fallback = float(y[history].mean())
    return np.where(n > 0, s / np.maximum(n, 1), fallback)


def compare(q: Queries, metric: str, look_ms: int) -> tuple[float, float, float]:
    """(plain z, CUPED z, variance ratio) of new minus old at ``look_ms`` after the switch."""
    y = q.values[metric]
    x = covariate(q, y)
    cand = q.new & (q.ts >= q.switch_ms) & (q.ts < q.switch_ms + look_ms)
    base = np.zeros_like(cand)
    for d in range(1, HISTORY_DAYS + 1):
        lo = q.switch_ms - d * DAY_MS
        base |= ~q.new & (q.ts >= lo) & (q.ts < lo + look_ms)
    both = cand | base
    theta = float(np.cov(x[both], y[both])[0, 1] / np.var(x[both], ddof=1))
    adjusted = y - theta * (x - x[both].mean())

    def z(v: np.ndarray) -> tuple[float, float]:
        diff = v[cand].mean() - v[base].mean()
        var = v[cand].var(ddof=1) / cand.sum() + v[base].var(ddof=1) / base.sum()
        return float(diff / np.sqrt(var)), float(var)

    (z_plain, var_plain), (z_cuped, var_cuped) = z(y), z(adjusted)
    return z_plain, z_cuped, var_cuped / var_plain


def one(args: tuple[str, int, TextModel]) -> tuple[str, dict[tuple[str, int], tuple[float, ...]]]:
    kind, seed, model = args
    q = labelled_queries(kind, seed, model)
    return kind, {(m, look): compare(q, m, look * MINUTE_MS) for m in METRICS for look in LOOKS_MIN}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=4, help="runs per kind (drop, no-change)")
    parser.add_argument("--texts", type=int, default=20_000)
    parser.add_argument("--exponent", type=float, default=1.0)
    parser.add_argument("--persistence", type=float, default=0.5)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    model = TextModel(args.texts, args.exponent, args.persistence)
    kinds = ("drop", "no-change")
    jobs = [
        (kind, 1000 * (i + 1) + r, model) for i, kind in enumerate(kinds) for r in range(args.runs)
    ]
    results: dict[str, list[dict[tuple[str, int], tuple[float, ...]]]] = defaultdict(list)
    with ProcessPoolExecutor(args.workers) as pool:
        for kind, found in pool.map(one, jobs):
            results[kind].append(found)
    print(
        f"CUPED on repeated texts: {args.texts} texts, Zipf exponent {args.exponent}, "
        f"persistence {args.persistence}; {args.runs} runs per kind, 7 days of history, "
        "1,500 queries/h"
    )
    print(
        "| metric | look | variance ratio | drop: plain z | drop: CUPED z "
        "| no change: plain z | no change: CUPED z |"
    )
    print("|---|---|---|---|---|---|---|")
    for m in METRICS:
        for look in LOOKS_MIN:
            drop = [r[m, look] for r in results["drop"]]
            null = [r[m, look] for r in results["no-change"]]
            ratio = statistics.median(v[2] for v in drop + null)
            print(
                f"| {m} | {look} min | {ratio:.2f} | "
                f"{statistics.median(v[0] for v in drop):.2f} | "
                f"{statistics.median(v[1] for v in drop):.2f} | "
                f"{statistics.fmean(v[0] for v in null):+.2f} | "
                f"{statistics.fmean(v[1] for v in null):+.2f} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
