"""Benchmark: `evaluate` against pytrec_eval (trec_eval) on the same files, in the same run.

Each variant runs in its own subprocess (so its peak resident memory is its own):

* ``ours``: what `retrieval-monitor evaluate` does: read the TREC qrels and run files,
  order the run as trec_eval does, compute every metric at k = 1,3,5,10,20, aggregate.
* ``pytrec_eval``: pytrec_eval.parse_qrel + parse_run on the same files, then
  RelevanceEvaluator(success, recall, P, ndcg_cut at the same k, recip_rank).evaluate.

The figure of merit is the ratio pytrec_eval time / our time (>= 1.0: we are no slower),
printed with both wall times and peak RSS. A second pair, ``*-core``, times only the
evaluation of data already in memory (our metric core against trec_eval's C code).
Not a test: figures, not assertions.

    python tests/benchmarks/bench_evaluate.py [--queries 100000] [--results 100] [--repeat 3]
        [--breakdown]
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KS = (1, 3, 5, 10, 20)


def make_files(
    directory: Path, n_queries: int, n_results: int, seed: int = 42
) -> tuple[Path, Path]:
    rng = random.Random(seed)
    qrels_path, run_path = directory / "qrels.txt", directory / "run.txt"
    with open(qrels_path, "w") as qrels, open(run_path, "w") as run:
        for q in range(n_queries):
            docs = [f"d{q % 977}-{i}" for i in rng.sample(range(n_results * 3), n_results)]
            for rank, doc in enumerate(docs, start=1):
                run.write(f"q{q} Q0 {doc} {rank} {-rank} bench\n")
            judged = rng.sample(docs, rng.randint(0, 6)) + [
                f"unretrieved-{q}-{j}" for j in range(rng.randint(0, 3))
            ]
            for doc in judged:
                qrels.write(f"q{q} 0 {doc} {rng.choice((0, 1, 1, 2, 3))}\n")
    return qrels_path, run_path


MEASURES = {f"{m}.{','.join(map(str, KS))}" for m in ("success", "recall", "P", "ndcg_cut")}
MEASURES.add("recip_rank")


def run_variant(variant: str, qrels: Path, run: Path) -> dict[str, float]:
    """Time one variant in this process; the ``-core`` variants load their input untimed."""
    core = variant.endswith("-core")
    start = time.perf_counter()
    if variant.startswith("ours"):
        from service.offline.files import load_judgments, load_run
        from service.offline.golden import evaluate

        judgments, ranking = load_judgments(qrels), load_run(run)
        if core:
            start = time.perf_counter()
        check = evaluate(judgments, ranking, KS).mean("ndcg@10")
    else:
        import pytrec_eval

        with open(qrels) as f:
            qrel = pytrec_eval.parse_qrel(f)
        with open(run) as f:
            scores = pytrec_eval.parse_run(f)
        if core:
            start = time.perf_counter()
        result = pytrec_eval.RelevanceEvaluator(qrel, MEASURES).evaluate(scores)
        labelled = [
            r["ndcg_cut_10"] for q, r in result.items() if any(g > 0 for g in qrel[q].values())
        ]
        check = statistics.fmean(labelled)
    seconds = time.perf_counter() - start
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"seconds": seconds, "peak_rss_mib": peak_mib, "ndcg@10": float(check or 0.0)}


VARIANTS = ("pytrec_eval", "ours", "pytrec_eval-core", "ours-core")


def breakdown(qrels: Path, run: Path, lines: int) -> None:
    """Where our end-to-end time goes, in us per run line, in one fresh process."""
    code = (
        "import json, sys, time\n"
        "t0 = time.perf_counter()\n"
        "from service.offline.files import load_judgments, load_run\n"
        "from service.offline.golden import evaluate\n"
        "t1 = time.perf_counter(); j = load_judgments(sys.argv[1])\n"
        "t2 = time.perf_counter(); r = load_run(sys.argv[2])\n"
        f"t3 = time.perf_counter(); evaluate(j, r, {KS!r}).mean('ndcg@10')\n"
        "t4 = time.perf_counter()\n"
        "print(json.dumps([t1 - t0, t2 - t1, t3 - t2, t4 - t3]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(qrels), str(run)],
        capture_output=True,
        text=True,
        check=True,
    )
    parts = json.loads(out.stdout)
    names = ("imports", "read qrels", "read run", "evaluate (judge, metrics, means)")
    print(f"where our time goes (us per run line, {lines} lines):")
    for name, seconds in zip(names, parts, strict=True):
        print(f"  {name:<34} {seconds / lines * 1e6:6.3f}")
    print(f"  {'in all':<34} {sum(parts) / lines * 1e6:6.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--queries", type=int, default=100_000)
    parser.add_argument("--results", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--breakdown", action="store_true", help="also time our parts (us per run line)"
    )
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--qrels", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--run", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(run_variant(args.variant, args.qrels, args.run)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        qrels, run = make_files(Path(tmp), args.queries, args.results)
        size_mib = run.stat().st_size / 2**20
        print(
            f"data: {args.queries} queries x {args.results} results (run file {size_mib:.0f} MiB)"
        )
        if args.breakdown:
            breakdown(qrels, run, args.queries * args.results)
        if args.repeat < 1:
            return
        figures: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
        for _ in range(args.repeat):
            for variant in VARIANTS:  # interleaved, so drift hits both sides
                out = subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--variant",
                        variant,
                        "--qrels",
                        str(qrels),
                        "--run",
                        str(run),
                    ],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                figures[variant].append(json.loads(out.stdout))
    for variant, rows in figures.items():
        times = [r["seconds"] for r in rows]
        print(
            f"{variant:<17} median {statistics.median(times):7.2f} s   "
            f"(runs: {', '.join(f'{t:.2f}' for t in times)})   "
            f"peak RSS {max(r['peak_rss_mib'] for r in rows):6.0f} MiB"
        )
    checks = {rows[0]["ndcg@10"] for rows in figures.values()}
    print(f"mean ndcg@10 equal in all variants (1e-9): {max(checks) - min(checks) < 1e-9}")
    for suffix, what in (
        ("", "end to end, files to metrics"),
        ("-core", "evaluation of in-memory data"),
    ):
        ours = statistics.median(r["seconds"] for r in figures["ours" + suffix])
        theirs = statistics.median(r["seconds"] for r in figures["pytrec_eval" + suffix])
        target = "2.0" if suffix == "" else "1.0"
        ratio = theirs / ours
        print(f"ratio pytrec_eval time / our time, {what}: {ratio:.2f} (target >= {target})")
    ours_rss = max(r["peak_rss_mib"] for r in figures["ours"])
    theirs_rss = max(r["peak_rss_mib"] for r in figures["pytrec_eval"])
    print(
        f"peak RSS, end to end: ours {ours_rss:.0f} MiB, pytrec_eval {theirs_rss:.0f} MiB "
        f"(ratio {ours_rss / theirs_rss:.2f})"
    )


if __name__ == "__main__":
    main()
