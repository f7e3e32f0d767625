"""The offline commands: ``evaluate`` and ``compare`` (golden sets, with their version),
and ``golden-set`` (a set mined from the labels output)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from service.config import parse_ks
from service.errors import ConfigError
from service.metrics.ir import DEFAULT_KS
from service.offline.files import load_judgments, load_run
from service.offline.golden import compare, evaluate
from service.offline.mine import file_version, mine, read_labels
from service.offline.report import find_vs_rank, render_comparison, render_evaluation


def ks_arg(text: str) -> tuple[int, ...]:
    try:
        return parse_ks(text)
    except ConfigError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def number(text: str) -> float:
    """A command-line number."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def print_json(data: dict[str, Any]) -> None:
    print(json.dumps(data, indent=2, allow_nan=False))


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-k",
        "--ks",
        type=ks_arg,
        default=DEFAULT_KS,
        metavar="K,K,...",
        help="cutoffs, comma-separated (default: 1,3,5,10,20)",
    )
    parser.add_argument("--format", choices=("table", "json"), default="table")


def add_offline_commands(commands: Any) -> None:
    """Register evaluate, compare and golden-set on the top-level subparsers."""
    ev = commands.add_parser(
        "evaluate",
        help="offline evaluation of a golden set",
        description="Evaluate a run against golden qrels (TREC or JSONL files).",
    )
    ev.add_argument("--qrels", required=True, help="golden relevance judgments (TREC or JSONL)")
    ev.add_argument("--run", required=True, help="ranked results per query (TREC or JSONL)")
    _add_common(ev)

    cmp = commands.add_parser(
        "compare",
        help="paired significance test between two runs",
        description="Compare run B (candidate) with run A (baseline) on the same golden set.",
    )
    cmp.add_argument("--qrels", required=True, help="golden relevance judgments (TREC or JSONL)")
    cmp.add_argument("run_a", metavar="RUN_A", help="baseline run")
    cmp.add_argument("run_b", metavar="RUN_B", help="candidate run")
    _add_common(cmp)
    cmp.add_argument(
        "--resamples", type=positive_int, default=10_000, help="randomisation resamples"
    )
    cmp.add_argument("--seed", type=int, default=0, help="seed of the randomisation test")
    cmp.add_argument("--alpha", type=float, default=0.05, help="significance level")

    gs = commands.add_parser(
        "golden-set",
        help="a golden set (JSONL qrels) mined from the labels output",
        description="Turn labels-output files (--labels-out, or a dump of --labels-topic) "
        "into a versioned golden set and the run its queries logged.",
    )
    gs.add_argument("labels", nargs="+", metavar="LABELS", help="labels-output JSONL files")
    gs.add_argument("--out", required=True, help="directory for golden-<version>.jsonl")
    gs.add_argument(
        "--min-grade", type=int, default=1, help="keep labels of at least this grade (1)"
    )
    gs.add_argument("--per-segment", type=positive_int, help="at most this many per segment")
    gs.add_argument("--seed", type=int, default=0, help="seed of the sample's order (0)")
    gs.add_argument("--retriever", help="only queries this retriever version served")
    gs.add_argument("--format", choices=("table", "json"), default="table")


def _evaluate(args: argparse.Namespace) -> int:
    version = file_version(args.qrels)
    ev = evaluate(load_judgments(args.qrels), load_run(args.run), args.ks)
    if args.format == "json":
        reading = {"reading": find_vs_rank(ev).to_dict()}
        print_json({"golden_set_version": version} | ev.to_dict() | reading)
    else:
        title = f"retrieval-monitor evaluate: run {args.run}"
        print(render_evaluation(ev, title + f"\ngolden set {args.qrels}, version {version}"))
    return 0


def _compare(args: argparse.Namespace) -> int:
    version = file_version(args.qrels)
    judgments = load_judgments(args.qrels)
    result = compare(
        judgments,
        load_run(args.run_a),
        load_run(args.run_b),
        args.ks,
        names=(args.run_a, args.run_b),
        n_resamples=args.resamples,
        seed=args.seed,
        alpha=args.alpha,
    )
    if args.format == "json":
        print_json({"golden_set_version": version} | result.to_dict())
    else:
        print(f"golden set {args.qrels}, version {version}")
        print(render_comparison(result, args.resamples))
    return 0


def _golden_set(args: argparse.Namespace) -> int:
    if args.min_grade < 1:
        raise ConfigError("--min-grade must be at least 1 (a grade below 1 is not relevant)")
    mined = mine(
        read_labels(args.labels),
        min_grade=args.min_grade,
        per_segment=args.per_segment,
        seed=args.seed,
        retriever=args.retriever,
    )
    if not mined.qrels:
        raise ConfigError("no labelled query is left: lower --min-grade, or check the files")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    version = mined.version
    qrels, run = out / f"golden-{version}.jsonl", out / f"logged-run-{version}.jsonl"
    qrels.write_bytes(mined.qrels)
    run.write_bytes(mined.run)
    queries = sum(mined.per_segment.values())
    if args.format == "json":
        print_json(
            {
                "version": version,
                "queries": queries,
                "per_segment": mined.per_segment,
                "qrels": str(qrels),
                "run": str(run),
            }
        )
    else:
        segments = ", ".join(f"{s} {n}" for s, n in mined.per_segment.items())
        print(f"golden set {version}: {queries} queries ({segments})")
        print(f"qrels: {qrels}\nthe run its queries logged: {run}")
    return 0


OFFLINE_HANDLERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "evaluate": _evaluate,
    "compare": _compare,
    "golden-set": _golden_set,
}
