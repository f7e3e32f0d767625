"""The ``retrieval-monitor`` command line: every command, and one exit-code policy.

``evaluate``, ``compare`` and ``golden-set`` (offline golden sets: ``offline_commands.py``),
``run`` (the service), ``demo``, ``replay``, ``simulate`` and ``check-input``. Exit codes
(``docs/configuration.md``): 0 success, 2 bad input or configuration (a
:class:`~service.errors.RetrievalMonitorError`, its message printed), 1 a failure while
running (the traceback printed).
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson

from service import __version__
from service.audit.book import estimate_rows
from service.commands.offline import (
    OFFLINE_HANDLERS,
    add_offline_commands,
    number,
    positive_int,
    print_json,
)
from service.commands.runtime import tune_gc
from service.commands.simulate import add_text_flags, simulation_config
from service.config import add_settings_flags, monitor_config, settings_from_args
from service.errors import EXIT_BAD_INPUT, EXIT_FAILURE, ConfigError, RetrievalMonitorError
from service.metrics.ir import metric_keys
from service.replay import replay
from service.sim.audit import CAREFUL_JUDGE
from service.sim.simulator import HYBRID_V8, generate, write_jsonl
from service.stream.audit_join import AuditRequest
from service.stream.mined import LabelRecorder
from service.stream.windows import ClosedWindow
from service.times import HOUR_MS, parse_aware_ms, parse_duration_ms, wall_ms


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="retrieval-monitor",
        description="Watch retrieval quality (recall@k, hit rate, MRR, nDCG) live and offline.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    add_offline_commands(commands)
    _add_streaming_commands(commands)
    return parser


def _duration_hours(text: str) -> float:
    try:
        return parse_duration_ms(text) / HOUR_MS
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _start_ms(text: str) -> int:
    """``now``, ``now-6h`` or an RFC 3339 time with an offset."""
    now = wall_ms()
    if text == "now":
        return now
    if text.startswith("now-"):
        try:
            return now - parse_duration_ms(text[4:])
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
    start_ms = parse_aware_ms(text)
    if start_ms is None:
        raise argparse.ArgumentTypeError(
            f"expected now, now-6h or RFC 3339 with an offset, got {text!r}"
        )
    return start_ms


def _add_streaming_commands(commands: Any) -> None:
    """Register run, demo, replay and simulate on the top-level subparsers."""
    run = commands.add_parser(
        "run",
        help="the service: consume Kafka, serve HTTP",
        description="Consume Kafka, serve HTTP.",
    )
    add_settings_flags(run)

    demo = commands.add_parser(
        "demo",
        help="the pipeline and HTTP server fed by the built-in simulator (no Kafka)",
        description="Simulated traffic with a bad deploy part way, rolled back near the end, "
        "in accelerated time.",
    )
    demo.add_argument("--hours", type=_duration_hours, default=9.5, help="simulated span (9.5h)")
    demo.add_argument("--deploy-at", type=_duration_hours, default=5.0, help="deploy time (5h)")
    rollback = demo.add_mutually_exclusive_group()
    rollback.add_argument(
        "--rollback-at",
        type=_duration_hours,
        default=None,
        help="when hybrid-v7 serves again (default: 2h before the end, if after the "
        "deploy); the regression closes about 1.5h later",
    )
    rollback.add_argument(
        "--no-rollback", action="store_true", help="keep the bad version to the end"
    )
    demo.add_argument("--quality-drop", type=number, default=0.15, help="find-rate drop (0.15)")
    demo.add_argument("--queries-per-hour", type=number, default=3600.0)
    demo.add_argument("--speed", type=number, default=300.0, help="simulated s per wall s (300)")
    demo.add_argument("--seed", type=int, default=7)
    demo.add_argument("--exit-when-done", action="store_true", help="stop when all is final")
    add_settings_flags(demo)

    replay = commands.add_parser(
        "replay",
        help="the same pipeline over JSONL event files",
        description='Replay {"topic": "queries"|"feedback", "event": {...}} lines in file order.',
    )
    replay.add_argument("files", nargs="+", metavar="FILE")
    replay.add_argument(
        "--windows-out", help="write closed windows as JSON lines here ('-': stdout)"
    )
    replay.add_argument(
        "--regressions-out",
        help="write every regression opened as a JSON line, with closed_at and closed_reason "
        "(null while still open at the end of the input) ('-': stdout)",
    )
    replay.add_argument(
        "--tests-out",
        help="write every comparison the detector holds at the end of the input, running or "
        "not and why not, as JSON lines ('-': stdout)",
    )
    replay.add_argument(
        "--estimates-out",
        help="write the audited estimates over the whole input, one JSON line per "
        "(retriever, segment, metric) ('-': stdout)",
    )
    replay.add_argument(
        "--audit-requests-out",
        help="write the audit sample's requests (one JSON line per finalised sampled "
        "query) ('-': stdout)",
    )
    replay.add_argument(
        "--labels-out", help="write the labels output (one line per labelled query) here"
    )
    replay.add_argument(
        "--one-process",
        action="store_true",
        help="read and decode the files in this process too (by default a second process "
        "does, when this one may use two cores or more)",
    )
    add_settings_flags(replay)

    sim = commands.add_parser(
        "simulate",
        help="write synthetic traffic to Kafka or JSONL",
        description="Synthetic queries and position-biased feedback, reproducible from a seed.",
    )
    target = sim.add_mutually_exclusive_group(required=True)
    target.add_argument("--jsonl", help="write the replay format to this file")
    target.add_argument("--kafka", action="store_true", help="produce to the input topics")
    sim.add_argument("--start", type=_start_ms, default=None, help="now, now-6h or RFC 3339")
    sim.add_argument("--hours", type=_duration_hours, default=6.0, help="simulated span (6h)")
    sim.add_argument("--queries-per-hour", type=number, default=3600.0)
    sim.add_argument("--deploy-at", type=_duration_hours, default=None, help="switch to v8 then")
    sim.add_argument("--quality-drop", type=number, default=0.0, help="find-rate drop at deploy")
    sim.add_argument(
        "--rank-decay",
        type=number,
        default=HYBRID_V8.rank_decay,
        help=f"rank decay of the deployed version ({HYBRID_V8.rank_decay}; higher ranks lower)",
    )
    sim.add_argument("--seed", type=int, default=7)
    sim.add_argument(
        "--judge",
        action="append",
        default=[],
        metavar="NAME[:CONFUSION]",
        help="audit the audit sample (--audit-rate, as the service samples it) with this "
        f"judge, e.g. {CAREFUL_JUDGE.name} or llm:judge:0.15 (repeatable; none: no audits)",
    )
    for labels in ("citations", "clicks"):
        sim.add_argument(
            f"--halve-{labels}-at",
            type=_duration_hours,
            default=None,
            help=f"from then on, every {labels[:-1]} is half as likely (a label shift)",
        )
    add_text_flags(sim)
    add_settings_flags(sim)

    check = commands.add_parser(
        "check-input",
        help="how well a sample of your records maps onto the events (--input-mapping)",
        description="Map a sample of records (replay-format files, or the input topics) "
        "and report, per topic, what maps, what does not and why, with one example each.",
    )
    check.add_argument("files", nargs="*", metavar="FILE")
    check.add_argument("--kafka", action="store_true", help="sample the input topics")
    check.add_argument("--sample", type=positive_int, default=1000, help="records per topic")
    check.add_argument("--format", choices=("table", "json"), default="table")
    add_settings_flags(check)


def _run(args: argparse.Namespace) -> int:
    from service.commands.run import run_service  # noqa: PLC0415 - Kafka, only for the commands that use it

    return run_service(settings_from_args(args))


def _demo(args: argparse.Namespace) -> int:
    from service.commands.demo import DemoOptions, run_demo  # noqa: PLC0415 - the HTTP app, the console

    settings = settings_from_args(args)
    if not 0 <= args.deploy_at <= args.hours:
        raise ConfigError("--deploy-at must lie within --hours")
    rollback_at = None if args.no_rollback else args.rollback_at
    if rollback_at is None and not args.no_rollback and args.hours - 2.0 > args.deploy_at:
        rollback_at = args.hours - 2.0  # time for the close to be decided before the end
    if rollback_at is not None and not args.deploy_at < rollback_at <= args.hours:
        raise ConfigError(
            "--rollback-at must lie after --deploy-at and within --hours (or pass --no-rollback)"
        )
    options = DemoOptions(
        hours=args.hours,
        deploy_at_hours=args.deploy_at,
        rollback_at_hours=rollback_at,
        quality_drop=args.quality_drop,
        queries_per_hour=args.queries_per_hour,
        speed=args.speed,
        seed=args.seed,
        exit_when_done=args.exit_when_done,
    )
    config = monitor_config(settings)
    return run_demo(options, settings.http_host, settings.http_port, config)


def _replay(args: argparse.Namespace) -> int:
    to_stdout = [
        flag
        for flag, value in (
            ("--windows-out", args.windows_out),
            ("--regressions-out", args.regressions_out),
            ("--tests-out", args.tests_out),
            ("--estimates-out", args.estimates_out),
            ("--audit-requests-out", args.audit_requests_out),
        )
        if value == "-"
    ]
    if len(to_stdout) > 1:
        raise ConfigError(f"{' and '.join(to_stdout)} cannot both be '-' (stdout): choose one")
    settings = settings_from_args(args)
    config = monitor_config(settings)
    out = None
    if args.windows_out == "-":
        out = sys.stdout.buffer
    elif args.windows_out:
        out = Path(args.windows_out).open("wb")  # noqa: SIM115 - closed below
    keys = metric_keys(config.pipeline.ks)

    labels_out = Path(args.labels_out).open("wb") if args.labels_out else None  # noqa: SIM115

    kept: list[ClosedWindow] = []  # (for the estimates: their sums, never their labels)
    requests: list[AuditRequest] | None = [] if args.audit_requests_out else None

    def write(windows: list[ClosedWindow]) -> None:
        if args.estimates_out:
            kept.extend(w.without_labels() for w in windows)
        for window in windows:
            if out is not None:
                out.write(orjson.dumps(window.to_record(keys)) + b"\n")
            if labels_out is not None:
                labels_out.writelines(orjson.dumps(r) + b"\n" for r in window.labels)

    try:
        mapper = None
        if settings.input_mapping:  # (its models are built only when a mapping is used)
            from service.mapping.mapper import load_mapper  # noqa: PLC0415

            mapper = load_mapper(settings.input_mapping)
        recorder = LabelRecorder(settings.labels_query_text) if labels_out else None
        monitor, report = replay(
            args.files,
            config,
            write,
            mapper=mapper,
            labels=recorder,
            reader=False if args.one_process else None,
            audit_requests=requests,
        )
    finally:
        if out is not None and out is not sys.stdout.buffer:
            out.close()
        if labels_out is not None:
            labels_out.close()
    detector = monitor.detector
    _write_lines(args.regressions_out, [r.to_record() for r in detector.opened])
    _write_lines(args.tests_out, [row.to_record() for row in detector.comparisons.select()])
    _write_lines(args.estimates_out, estimate_rows(kept, keys))
    _write_lines(args.audit_requests_out, [r.to_record() for r in requests or ()])
    c = monitor.pipeline.counts
    print(
        f"replayed {report.lines} lines: {report.invalid} invalid, "
        + (f"{report.ignored} skipped by the input mapping, " if report.ignored else "")
        + f"{report.windows} windows, "
        f"{sum(c.late.values())} late, {sum(c.duplicates.values())} duplicates, "
        f"{sum(c.unmatched.values())} unmatched feedback, "
        f"{len(detector.opened)} regressions opened ({len(detector.closed)} closed since)",
        file=sys.stderr,
    )
    return 0


def _write_lines(path: str | None, records: list[dict[str, Any]]) -> None:
    """JSON lines to a file, or to stdout for ``-`` (nothing without a path)."""
    if not path:
        return
    lines = b"".join(orjson.dumps(r) + b"\n" for r in records)
    if path == "-":
        sys.stdout.buffer.write(lines)
    else:
        Path(path).write_bytes(lines)


def _simulate(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    config = simulation_config(args, settings.audit_rate)
    if args.jsonl:
        n = write_jsonl(generate(config), args.jsonl)
        print(f"wrote {n} events to {args.jsonl}", file=sys.stderr)
        return 0
    from service.broker.produce import produce_events  # noqa: PLC0415 - Kafka

    n = produce_events(settings, generate(config))
    print(
        f"produced {n} events to {settings.queries_topic} and {settings.feedback_topic}",
        file=sys.stderr,
    )
    return 0


def _check_input(args: argparse.Namespace) -> int:
    from service.commands.check_input import check_input  # noqa: PLC0415 - the mapping's models

    settings = settings_from_args(args)
    report = check_input(settings, args.files, args.kafka, args.sample)
    names = (settings.queries_topic, settings.feedback_topic)
    if args.format == "json":
        print_json(report.to_json(names))
    else:
        print(report.render(names))
    return 0 if report.mapped else EXIT_BAD_INPUT


HANDLERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "check-input": _check_input,
    **OFFLINE_HANDLERS,
    "run": _run,
    "demo": _demo,
    "replay": _replay,
    "simulate": _simulate,
}


LONG_RUNNING = ("run", "replay", "demo")
"""Commands whose state is millions of objects (see :mod:`service.commands.runtime`)."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; return its exit code (argparse itself exits 2 on a bad flag)."""
    args = build_parser().parse_args(argv)
    if argv is None and args.command in LONG_RUNNING:  # (a process of its own, not a test)
        tune_gc()
    try:
        return HANDLERS[args.command](args)
    except RetrievalMonitorError as error:
        print(f"retrieval-monitor {args.command}: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as error:  # a failure while running: the traceback, then exit 1
        traceback.print_exc()
        print(f"retrieval-monitor {args.command}: failed: {error}", file=sys.stderr)
        return EXIT_FAILURE
