"""The ``retrieval-monitor`` command line."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from service import __version__
from service.commands import STREAMING_HANDLERS, add_streaming_commands
from service.config import parse_ks
from service.errors import ConfigError, RetrievalMonitorError
from service.metrics.ir import DEFAULT_KS
from service.offline.files import load_judgments, load_run
from service.offline.golden import compare, evaluate
from service.offline.report import find_vs_rank, render_comparison, render_evaluation

EXIT_BAD_INPUT = 2


def _ks_arg(text: str) -> tuple[int, ...]:
    try:
        return parse_ks(text)
    except ConfigError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-k",
        "--ks",
        type=_ks_arg,
        default=DEFAULT_KS,
        metavar="K,K,...",
        help="cutoffs, comma-separated (default: 1,3,5,10,20)",
    )
    parser.add_argument("--format", choices=("table", "json"), default="table")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="retrieval-monitor",
        description="Watch retrieval quality (recall@k, hit rate, MRR, nDCG) live and offline.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

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
        "--resamples", type=_positive_int, default=10_000, help="randomisation resamples"
    )
    cmp.add_argument("--seed", type=int, default=0, help="seed of the randomisation test")
    cmp.add_argument("--alpha", type=float, default=0.05, help="significance level")
    add_streaming_commands(commands)
    return parser


def _print_json(data: dict[str, Any]) -> None:
    print(json.dumps(data, indent=2, allow_nan=False))


def _evaluate(args: argparse.Namespace) -> int:
    ev = evaluate(load_judgments(args.qrels), load_run(args.run), args.ks)
    if args.format == "json":
        _print_json(ev.to_dict() | {"reading": find_vs_rank(ev).to_dict()})
    else:
        print(render_evaluation(ev, f"retrieval-monitor evaluate: run {args.run}"))
    return 0


def _compare(args: argparse.Namespace) -> int:
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
        _print_json(result.to_dict())
    else:
        print(render_comparison(result, args.resamples))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handlers = {"evaluate": _evaluate, "compare": _compare, **STREAMING_HANDLERS}
    try:
        return handlers[args.command](args)
    except RetrievalMonitorError as error:
        print(f"retrieval-monitor {args.command}: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
