"""The ``simulate`` command's run, from its flags: versions, a deploy, label shifts, audits.

``--halve-citations-at`` and ``--halve-clicks-at`` (hours after the start, like
``--deploy-at``) halve every citation's or click's probability from then on, for every
version (a label shift, retrieval unchanged); each ``--judge NAME[:CONFUSION]`` audits the
queries of the audit sample (``--audit-rate``, the service's setting). ``--query-texts N``
makes queries repeat N texts (:mod:`service.sim.texts`).
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from service.commands.offline import number, positive_int
from service.errors import ConfigError
from service.sim.audit import JudgeModel
from service.sim.shape import TrafficShape
from service.sim.simulator import HYBRID_V7, HYBRID_V8, SimulationConfig
from service.sim.texts import DEFAULT_TEXTS, TextModel
from service.times import HOUR_MS, wall_ms

HALVED = 0.5
"""The scale of a ``--halve-*-at`` flag."""


def parse_judge(text: str) -> JudgeModel:
    """``NAME[:CONFUSION]``: the last ``:``-separated part is the confusion rate when it is
    a number (``llm:judge:0.15``), else part of the name (``human:careful``)."""
    name, colon, last = text.rpartition(":")
    try:
        confusion = float(last) if colon else None
    except ValueError:
        confusion = None
    if confusion is None:
        return JudgeModel(text)
    return JudgeModel(name, confusion_rate=confusion)


def _hours_in_run(start_ms: int, hours: float | None, total: float, flag: str) -> int | None:
    """The time of a flag given in hours after the start, or None when it is not set."""
    if hours is None:
        return None
    if not 0 <= hours <= total:
        raise ConfigError(f"{flag} must lie within --hours")
    return start_ms + int(hours * HOUR_MS)


def simulation_config(args: argparse.Namespace, audit_rate: float) -> SimulationConfig:
    """The run that ``simulate``'s flags describe; ConfigError on a bad combination. Its
    judges audit the sample at ``audit_rate`` (the service's setting, so that both agree
    on the sample); without ``--judge`` nothing is audited."""
    duration = int(args.hours * HOUR_MS)
    start = args.start if args.start is not None else wall_ms() - duration
    deploy = None if args.deploy_at is None else start + int(args.deploy_at * HOUR_MS)
    if args.judge and not audit_rate > 0:
        raise ConfigError("--judge needs --audit-rate above 0 (no query is audited at 0)")
    citations_at = _hours_in_run(start, args.halve_citations_at, args.hours, "--halve-citations-at")
    clicks_at = _hours_in_run(start, args.halve_clicks_at, args.hours, "--halve-clicks-at")
    shape = None
    if citations_at is not None or clicks_at is not None:
        shape = TrafficShape(
            citations_scale=HALVED if citations_at is not None else 1.0,
            citations_scale_at_ms=citations_at,
            clicks_scale=HALVED if clicks_at is not None else 1.0,
            clicks_scale_at_ms=clicks_at,
        )
    return SimulationConfig(
        seed=args.seed,
        start_ms=start,
        duration_ms=duration,
        queries_per_hour=args.queries_per_hour,
        before=HYBRID_V7,
        after=replace(HYBRID_V8, rank_decay=args.rank_decay) if deploy is not None else None,
        switch_at_ms=deploy,
        quality_drop=args.quality_drop,
        shape=shape,
        audit_rate=audit_rate if args.judge else 0.0,
        judges=tuple(parse_judge(text) for text in args.judge),
        texts=text_model(args),
    )


def add_text_flags(sim: argparse.ArgumentParser) -> None:
    """``--query-texts`` and its two companions."""
    sim.add_argument(
        "--query-texts",
        type=positive_int,
        default=None,
        metavar="N",
        help="queries repeat N texts, Zipf distributed (the event's 'query'), each keeping "
        "its segment, relevant chunks and difficulty (none: every query new, no text)",
    )
    sim.add_argument(
        "--zipf-exponent",
        type=number,
        default=DEFAULT_TEXTS.exponent,
        help="with --query-texts: the i-th text's weight is 1 / i ** this "
        f"({DEFAULT_TEXTS.exponent})",
    )
    sim.add_argument(
        "--text-persistence",
        type=number,
        default=DEFAULT_TEXTS.persistence,
        help="with --query-texts: the share of finding a text's chunks that is the text's "
        f"own, for every version, in [0, 1) ({DEFAULT_TEXTS.persistence})",
    )


def text_model(args: argparse.Namespace) -> TextModel | None:
    """``--query-texts`` and its two companions (which need it)."""
    if args.query_texts is None:
        if args.zipf_exponent != DEFAULT_TEXTS.exponent or (
            args.text_persistence != DEFAULT_TEXTS.persistence
        ):
            raise ConfigError("--zipf-exponent and --text-persistence need --query-texts N")
        return None
    return TextModel(args.query_texts, args.zipf_exponent, args.text_persistence)
