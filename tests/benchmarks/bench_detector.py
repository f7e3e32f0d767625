"""False alarms, detection rate and delay of the regression detector, on traffic as harsh
as production, next to the per-look detector it replaced and a static threshold.

Every run simulates two days through the real pipeline (join, windows, detector) with
default settings: three segments (50/30/20% of the traffic), a daily cycle in volume
(0.5 to 1.5 times the mean of ``--queries-per-hour``) and in quality (the find rate
+-4 points, peak at 15:00 UTC), and on the second day one event at a random time
between 00:00 and 16:00 (night and day alike), whose kind sets the run:

* ``no-change``: a new version exactly as good as the old one, to all the traffic;
* ``no-change canary``: the same, first to 20% of the traffic beside the old version,
  promoted to all of it three hours later;
* ``drop``: a new version whose find rate is 5 points lower, to all the traffic;
* ``canary 20%`` / ``canary 10%``: that version beside the old one, never promoted;
* ``find rate only``: a version that finds the answer 15 points less often, where a
  miss leaves no label at all (the labels cannot see the misses; the labelled share can);
* ``rollback``: the bad version, rolled back after two hours;
* ``slow drift``: no deploy; every version's find rate decays by 8 points over six hours;
* ``citations halved`` / ``clicks halved``: no deploy, retrieval unchanged; from the
  event on, every citation (a prompt change) or every click (a page redesign) is half as
  likely. A ``label_shift`` should open (a ticket) and no retrieval regression (a page);
* ``later feedback`` (not in the default kinds): a new version exactly as good as the
  old one whose users act twice as late (every click, citation and judgment of its
  queries comes after twice the delay: up to 10 minutes, some of it after the 5-minute
  label age the detector compares): anything it opens is a false alarm;
* ``segment drop`` (not in the default kinds): a version 5 points worse in ``docs`` (30%
  of the traffic) only, as good elsewhere: pooled over the segments the drop is 1.5
  points, below ``REGRESSION_MIN_EFFECT``, so only the segment's own test can find it.

In the drop runs every relevant chunk the retriever missed is still surfaced later
(cited through another route or judged), so a find-rate drop lowers the measured
recall@5 by about 5 points; in the find-rate-only runs it is not.

False alarms are every regression opened in a no-change run, counted per 30 days of
monitored traffic (the second day of each run: the first is the history that deploy
baselines and drift need). A drop is detected when a regression of the new version
opens at or after the deploy (of any version after the drift starts); the delay is its
``opened_at`` minus the event's time, the label age included. The static rule
("the 1 h recall@5 of a slice is below T", with the same volume guard and label
maturity) is tuned on the no-change runs to the detector's false-alarm count.

With ``--short`` every run is 12 hours from any hour of the day with the event at hour 8
and two segments (50/50): the previous version has no day of history, so a deploy is
compared through a line in time across the switch (``service/detect/trend.py``), whose
estimated slope costs evidence and whose daily cycle's curvature biases it a little;
a no-change run counts as
half a monitored day. The drift kind needs a day of history and finds nothing there, and
the oracle's baseline is then the detector's trend (``trend``) rather than ``day``.

After the tables, the share of runs an oracle finds at each delay: one look, knowing the
time, the metric and the direction, at level 1/30 (see ``oracle_bound``); no detector
does better, so it says which delays this traffic allows at all. The detector compares
early windows at the label age of 5 minutes (``REGRESSION_LABEL_AGE``); the static rule
and the per-look detector read the final windows, 30 minutes after their end.
``--attribution 5`` runs everything with a 5-minute attribution window (the early
windows are then the final ones).

Run: ``python tests/benchmarks/bench_detector.py`` (``--runs 20``, ``--null-runs 60``
by default; about 25 minutes on 2 cores). Prints a table; nothing is asserted.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from service.core.monitor import Monitor, MonitorConfig
from service.sim.shape import TrafficShape
from service.sim.simulator import HYBRID_V7, SimulationConfig, generate
from service.stream.events import FeedbackEvent, QueryEvent, feedback_from, query_from
from service.stream.windows import ClosedWindow
from service.times import DAY_MS, HOUR_MS

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: make the tests package importable
    sys.path.insert(0, str(ROOT))

from tests.benchmarks.oracle_bound import oracle_z, power  # noqa: E402
from tests.benchmarks.per_look_detector import per_look_alarms  # noqa: E402

NEW = "hybrid-v8"
STATIC_METRIC = "recall@5"
SEGMENTS = (("support-kb", 0.5), ("docs", 0.3), ("billing", 0.2))
SHORT_SEGMENTS = (("support-kb", 0.5), ("docs", 0.5))
KINDS = (
    "drop",
    "canary 20%",
    "canary 10%",
    "find rate only",
    "rollback",
    "slow drift",
    "citations halved",
    "clicks halved",
)
NULL_KINDS = ("no-change", "no-change canary")
LATER_KINDS = ("later feedback",)
"""No change of quality, another timing of the labels: every alarm is false."""
LABEL_KINDS = ("citations halved", "clicks halved")
LABEL_SHIFT = "label_shift"
ORACLE_DELAYS = tuple(range(15, 301, 15))
"""Minutes after the event at which the oracle may make its one look."""
ORACLE_MATURITIES = (30, 5)
"""Minutes: the attribution window; 5 is the age of the simulator's last label, so a
comparison at equal maturity (both sides' labels counted up to 5 min) loses nothing."""
Alarm = tuple[str, str, str, int, str]


@dataclass(frozen=True, slots=True)
class RunResult:
    kind: str
    seed: int
    event_ms: int
    detector: list[Alarm]
    per_look: list[Alarm]
    static_series: list[tuple[str, str, int, float]]
    """(retriever, segment, opened_ms, 1 h recall@5) wherever the volume guard is met."""
    labelled_per_hour: float
    monitored_days: float
    """Every day after the first (drift needs a day before it); half a day per 12-hour
    run (``--short``)."""
    oracle: dict[tuple[str, int, int], tuple[float, float] | None]
    """(metric, delay min, maturity min) -> the oracle's (day, known) z (see oracle_bound)."""


def simulation(
    kind: str, seed: int, queries_per_hour: float, short: bool = False, history_days: int = 1
) -> SimulationConfig:
    """One run: ``history_days`` days of the old version, then the day of the event."""
    rng = random.Random(seed)
    start = 1_796_083_200_000 + seed * 7 * DAY_MS
    event = start + history_days * DAY_MS + rng.randrange(0, 16 * 12) * 300_000
    duration, segments = (history_days + 1) * DAY_MS, SEGMENTS
    if short:  # 12 h from any hour of the day, the event at hour 8, two segments
        start += rng.randrange(0, 24) * HOUR_MS
        event, duration, segments = start + 8 * HOUR_MS, 12 * HOUR_MS, SHORT_SEGMENTS
    shape = TrafficShape(volume_amplitude=0.5, quality_amplitude=0.04, peak_hour=15)
    after = replace(HYBRID_V7, name=NEW)
    drop, cited = 0.0, 1.0
    only: tuple[str, ...] = ()
    if kind == "no-change canary":
        shape = replace(shape, canary_share=0.2, promote_at_ms=event + 3 * HOUR_MS)
    elif kind == "drop":
        drop = 0.05
    elif kind == "segment drop":
        drop, only = 0.05, ("docs",)
    elif kind.startswith("canary"):
        drop = 0.05
        shape = replace(shape, canary_share=0.2 if kind == "canary 20%" else 0.1)
    elif kind == "find rate only":
        drop, cited = 0.15, 0.03
    elif kind == "rollback":
        drop = 0.05
        shape = replace(shape, rollback_at_ms=event + 2 * HOUR_MS)
    elif kind == "slow drift":
        shape = replace(shape, drift_start_ms=event, drift_ms=6 * HOUR_MS, drift_drop=0.08)
    elif kind == "citations halved":
        shape = replace(shape, citations_scale=0.5, citations_scale_at_ms=event)
    elif kind == "clicks halved":
        shape = replace(shape, clicks_scale=0.5, clicks_scale_at_ms=event)
    elif kind == "later feedback":
        after = replace(after, feedback_delay=2.0)
    unchanged = kind in ("slow drift", *LABEL_KINDS)
    return SimulationConfig(
        seed=seed,
        start_ms=start,
        duration_ms=duration,
        queries_per_hour=queries_per_hour,
        segments=segments,
        before=HYBRID_V7,
        after=None if unchanged else after,
        switch_at_ms=None if unchanged else event,
        quality_drop=drop,
        drop_segments=only,
        unretrieved_citation_rate=cited,
        shape=shape,
        id_prefix=f"b{seed}-",
    )


def _events(sim: SimulationConfig) -> Iterator[tuple[bool, int, QueryEvent | FeedbackEvent]]:
    for e in generate(sim):
        if e.topic == "queries":
            yield True, e.arrival_ms, query_from(e.event)
        else:
            yield False, e.arrival_ms, feedback_from(e.event)


def run_one(
    kind: str,
    seed: int,
    queries_per_hour: float,
    tau: float | None,
    short: bool,
    attribution_min: float | None = None,
    no_history_span_h: float | None = None,
    history_days: int = 1,
) -> RunResult:
    sim = simulation(kind, seed, queries_per_hour, short, history_days)
    now = [sim.start_ms]
    config = MonitorConfig()
    if tau is not None:
        config = replace(config, detector=replace(config.detector, tau=tau))
    if no_history_span_h is not None:
        span = int(no_history_span_h * HOUR_MS)
        config = replace(config, detector=replace(config.detector, no_history_span_ms=span))
    if attribution_min is not None:  # both the join's and the detector's
        ms = int(attribution_min * 60_000)
        join = replace(config.pipeline.join, attribution_ms=ms)
        config = replace(
            config,
            pipeline=replace(config.pipeline, join=join),
            detector=replace(config.detector, attribution_ms=ms),
        )
    monitor = Monitor(config, lambda: now[0])
    pipeline = monitor.pipeline
    pipeline.assign(0)
    windows: list[ClosedWindow] = []
    offsets = [0, 0]
    for i, (is_query, arrival, event) in enumerate(_events(sim)):
        now[0] = arrival
        if is_query:
            pipeline.query(0, offsets[0], event)  # type: ignore[arg-type]
            offsets[0] += 1
        else:
            pipeline.feedback(0, offsets[1], event)  # type: ignore[arg-type]
            offsets[1] += 1
        if i % 500 == 0:
            closed = pipeline.advance()
            windows += closed
            pipeline.deliver(closed)
    closed = pipeline.finish()
    windows += closed
    pipeline.deliver(closed)
    cfg = monitor.detector.config
    final_ms = config.pipeline.join.attribution_ms  # (when the final windows are out)
    detector = [
        (r.opening.retriever, r.opening.segment, r.opening.metric, r.opened_ms, r.opening.kind)
        for r in monitor.detector.opened
    ]
    per_look = per_look_alarms(windows, {NEW: HYBRID_V7.name}, cfg.window_ms, final_ms)
    shape = sim.shape or TrafficShape()
    event_ms = (
        sim.switch_at_ms
        or shape.drift_start_ms
        or shape.citations_scale_at_ms
        or shape.clicks_scale_at_ms
        or 0
    )
    oracle = {}
    if kind not in (*NULL_KINDS, *LATER_KINDS, *LABEL_KINDS, "slow drift"):
        concurrent = kind.startswith("canary")
        for metric in cfg.watched:
            for d in ORACLE_DELAYS:
                for m in ORACLE_MATURITIES:
                    oracle[metric, d, m] = oracle_z(
                        windows,
                        NEW,
                        HYBRID_V7.name,
                        event_ms,
                        concurrent,
                        d * 60_000,
                        m * 60_000,
                        metric,
                        sim.drop_segments[0] if sim.drop_segments else None,
                    )
    return RunResult(
        kind=kind,
        seed=seed,
        event_ms=event_ms,
        detector=detector,
        per_look=per_look,
        static_series=_static_series(windows, cfg.window_ms, final_ms),
        labelled_per_hour=sum(w.labelled for w in windows) / (sim.duration_ms / HOUR_MS),
        monitored_days=0.5 if short else float(history_days),
        oracle=oracle,
    )


def _static_series(
    windows: list[ClosedWindow], window_ms: int, attribution_ms: int
) -> list[tuple[str, str, int, float]]:
    """The 1 h recall@5 per slice at each boundary, stamped like the detector's alarms."""
    by_start: dict[tuple[str, str, int], tuple[int, int]] = {}
    for w in windows:
        m = w.metrics.get(STATIC_METRIC)
        if m is not None:
            count, total = by_start.get((w.retriever, w.segment, w.start_ms), (0, 0))
            by_start[w.retriever, w.segment, w.start_ms] = (count + m.count, total + m.sum_fx)
    slices = sorted({(r, s) for r, s, _ in by_start})
    starts = sorted({t for _, _, t in by_start})
    out = []
    for boundary in range(starts[0] + window_ms, starts[-1] + 2 * window_ms, window_ms):
        for retriever, segment in slices:
            count = total = 0
            for start in range(boundary - HOUR_MS, boundary, window_ms):
                c, t = by_start.get((retriever, segment, start), (0, 0))
                count, total = count + c, total + t
            if count >= 200:
                out.append((retriever, segment, boundary + attribution_ms, total / count / 2**52))
    return out


def static_alarms(series: list[tuple[str, str, int, float]], threshold: float) -> list[Alarm]:
    """An alarm when a slice's value goes below the threshold (one per excursion)."""
    alarms: list[Alarm] = []
    below: dict[tuple[str, str], bool] = {}
    for retriever, segment, at, value in series:
        is_below = value < threshold
        if is_below and not below.get((retriever, segment), False):
            alarms.append((retriever, segment, STATIC_METRIC, at, "static"))
        below[retriever, segment] = is_below
    return alarms


def tune_threshold(runs: list[RunResult], allowed: int) -> float:
    """The highest threshold whose no-change runs raise at most ``allowed`` alarms."""
    values = sorted({v for r in runs for *_, v in r.static_series})
    best, lo, hi = 0.0, 0, len(values) - 1
    while lo <= hi:  # the alarm count grows with the threshold
        mid = (lo + hi) // 2
        if sum(len(static_alarms(r.static_series, values[mid])) for r in runs) <= allowed:
            best, lo = values[mid], mid + 1
        else:
            hi = mid - 1
    return best


def delay(run: RunResult, alarms: list[Alarm]) -> int | None:
    """Time from the event to the first alarm that catches it (None: missed): a label
    shift for a change of the labels, a regression of retrieval for the others."""
    wanted = HYBRID_V7.name if run.kind in ("slow drift", *LABEL_KINDS) else NEW
    shift = run.kind in LABEL_KINDS
    after = [
        at - run.event_ms
        for r, _, _, at, kind in alarms
        if r == wanted and at >= run.event_ms and (kind == LABEL_SHIFT) == shift
    ]
    return min(after) if after else None


def row(label: str, rule: str, runs: list[RunResult], alarms: list[list[Alarm]]) -> str:
    delays = [delay(r, a) for r, a in zip(runs, alarms, strict=True)]
    found = [d for d in delays if d is not None]
    early = sum(1 for r, a in zip(runs, alarms, strict=True) for *_, at, _ in a if at < r.event_ms)
    median = f"{statistics.median(found) / 60_000:.0f} min" if found else "-"
    share = len(found) / len(runs) if runs else 0.0
    return f"| {label} | {rule} | {share:.0%} ({len(found)}/{len(runs)}) | {median} | {early} |"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="runs per kind of drop")
    parser.add_argument("--null-runs", type=int, default=60, help="no-change runs (days)")
    parser.add_argument("--queries-per-hour", type=float, default=1500.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated drop kinds")
    parser.add_argument("--tau", type=float, help="the detector's tau (default: its default)")
    parser.add_argument(
        "--attribution",
        type=float,
        metavar="MIN",
        help="the attribution window in minutes (default 30; at 5 or less the detector "
        "compares the final windows, which are then at its label age)",
    )
    parser.add_argument(
        "--no-history-span",
        type=float,
        metavar="H",
        help="the detector's no_history_span_ms in hours (default: its default, 4)",
    )
    parser.add_argument(
        "--short",
        action="store_true",
        help="12-hour runs from any hour, the event at hour 8 (no day of history), 2 segments",
    )
    parser.add_argument(
        "--history-days",
        type=int,
        default=1,
        metavar="D",
        help="days of the old version before the event's day (default 1; the detector "
        "compares a deploy with up to REGRESSION_BASELINE_DAYS of them)",
    )
    args = parser.parse_args()
    if args.short and args.history_days != 1:
        parser.error("--short runs have no day of history; leave out --history-days")
    kinds = [k for k in args.kinds.split(",") if k]
    started = time.perf_counter()
    jobs = [(NULL_KINDS[i % 2], i + 1) for i in range(args.null_runs)]
    jobs += [(kind, 1000 * (j + 1) + i) for j, kind in enumerate(kinds) for i in range(args.runs)]
    with ProcessPoolExecutor(args.workers) as pool:
        results = list(
            pool.map(
                run_one,
                [k for k, _ in jobs],
                [s for _, s in jobs],
                [args.queries_per_hour] * len(jobs),
                [args.tau] * len(jobs),
                [args.short] * len(jobs),
                [args.attribution] * len(jobs),
                [args.no_history_span] * len(jobs),
                [args.history_days] * len(jobs),
            )
        )
    elapsed = time.perf_counter() - started
    nulls = [r for r in results if r.kind in NULL_KINDS]
    days = sum(r.monitored_days for r in nulls)
    det_false = sum(len(r.detector) for r in nulls)
    per_look_false = sum(len(r.per_look) for r in nulls)
    threshold = tune_threshold(nulls, det_false)
    static_false = sum(len(static_alarms(r.static_series, threshold)) for r in nulls)
    per_30 = 30 / days if days else float("nan")
    labelled = statistics.mean(r.labelled_per_hour for r in results)
    print(
        f"{len(results)} runs of "
        f"{'12 simulated hours' if args.short else f'{args.history_days + 1} simulated days'} "
        f"({days:g} no-change days), {2 if args.short else 3} segments, daily cycles, "
        f"{args.queries_per_hour:.0f} queries/h on average ({labelled:.0f} labelled/h), "
        f"in {elapsed:.0f} s"
    )
    print()
    print("| rule | false alarms in the no-change days | per 30 days |")
    print("|---|---|---|")
    for rule, count in (
        ("**sequential detector**", det_false),
        ("per-look Welch detector (before)", per_look_false),
        (f"static threshold T = {threshold:.3f} (tuned on the no-change runs)", static_false),
    ):
        print(f"| {rule} | {count} in {days:g} days | {count * per_30:.2f} |")
    kinds_seen: dict[str, int] = {}
    for r in nulls:
        for *_, kind in r.detector:
            kinds_seen[kind] = kinds_seen.get(kind, 0) + 1
    print(f"\nsequential detector's false alarms by test: {kinds_seen or 'none'}")
    print()
    print("| event | rule | detected | median delay | alarms before the event |")
    print("|---|---|---|---|---|")
    for kind in (k for k in kinds if k not in (*LABEL_KINDS, *LATER_KINDS)):
        runs = [r for r in results if r.kind == kind]
        print(row(kind, "**sequential detector**", runs, [r.detector for r in runs]))
        print(row(kind, "per-look Welch detector", runs, [r.per_look for r in runs]))
        static = [static_alarms(r.static_series, threshold) for r in runs]
        print(row(kind, f"static threshold (T = {threshold:.3f})", runs, static))
    print_label_kinds(results, [k for k in kinds if k in LABEL_KINDS])
    print_later_kinds(results, [k for k in kinds if k in LATER_KINDS])
    changed = [r for r in results if r.kind in kinds and r.kind not in (*LABEL_KINDS, *LATER_KINDS)]
    shifted = sum(any(k == LABEL_SHIFT for *_, k in r.detector) for r in changed)
    print(
        f"\nruns where retrieval changed (labels not) with a label shift opened: "
        f"{shifted}/{len(changed)}"
    )
    print_oracle([r for r in results if r.oracle], kinds, args.short)
    return 0


def print_label_kinds(results: list[RunResult], kinds: list[str]) -> None:
    """Changes of the labels, not of retrieval: a label shift (a ticket) should open, and
    no regression of a retrieval metric (a page) at or after the change."""
    if not kinds:
        return
    print()
    print("| label change | label shift opened | median delay | runs with a page after it |")
    print("|---|---|---|---|")
    for kind in kinds:
        runs = [r for r in results if r.kind == kind]
        delays = [delay(r, r.detector) for r in runs]
        found = [d for d in delays if d is not None]
        median = f"{statistics.median(found) / 60_000:.0f} min" if found else "-"
        paged = sum(
            any(k != LABEL_SHIFT and at >= r.event_ms for *_, at, k in r.detector) for r in runs
        )
        print(f"| {kind} | {len(found)}/{len(runs)} | {median} | {paged}/{len(runs)} |")


def print_later_kinds(results: list[RunResult], kinds: list[str]) -> None:
    """No change of quality, later labels: what opened is a false alarm (the detector
    compares both sides at the same label age, not at the same label timing)."""
    if not kinds:
        return
    print()
    print("| no change, labels later | runs with an alarm after the event | alarms before it |")
    print("|---|---|---|")
    for kind in kinds:
        runs = [r for r in results if r.kind == kind]
        after = [
            f"{retriever} {segment} {metric} {test} +{(at - r.event_ms) // 60_000} min"
            for r in runs
            for retriever, segment, metric, at, test in r.detector
            if at >= r.event_ms
        ]
        hit = sum(1 for r in runs if any(at >= r.event_ms for *_, at, _ in r.detector))
        before = sum(1 for r in runs for *_, at, _ in r.detector if at < r.event_ms)
        print(f"| {kind} | {hit}/{len(runs)} {'; '.join(after)} | {before} |")


ORACLE_ALPHA = 1 / 30
"""The oracle's level: the whole budget of a deploy when one deploy a day may raise at
most one false alarm per 30 days."""


def oracle_shares(
    runs: list[RunResult], kind: str, maturity: int, baseline: int
) -> tuple[str, dict[int, float]]:
    """The oracle's best metric for these runs (the largest median drop z at its target
    delay: 180 min for a canary, else 60) and the share of runs it finds at each delay."""
    metrics = sorted({metric for r in runs for metric, _, _ in r.oracle})
    target = 180 if kind.startswith("canary") else 60
    best = max(
        metrics,
        key=lambda x: (
            -statistics.median(
                z if z is not None else 0.0 for z in _oracle_zs(runs, x, target, maturity, baseline)
            )
        ),
    )
    shares = {
        d: power(_oracle_zs(runs, best, d, maturity, baseline), ORACLE_ALPHA) for d in ORACLE_DELAYS
    }
    return best, shares


def first_delay(shares: dict[int, float], share: float) -> int | None:
    """The first delay (minutes) at which the oracle finds ``share`` of the runs."""
    return next((d for d in ORACLE_DELAYS if shares[d] >= share), None)


def print_oracle(results: list[RunResult], kinds: list[str], short: bool = False) -> None:
    """The oracle's one look (see oracle_bound) at one-sided level 1/30 (``short``:
    without a day of history, against the detector's trend baseline), then the detector's
    delays as ratios to the oracle's at the same baseline."""
    print(
        f"\nthe oracle's one look at level {ORACLE_ALPHA:.3f} (knows the time, the metric, "
        "the direction): share of runs it finds at each delay"
    )
    print()
    print("| event | maturity | baseline | metric | 60 min | 120 min | 180 min | 50% at | 95% at |")
    print("|---|---|---|---|---|---|---|---|---|")
    ratios = []
    for kind in kinds:
        runs = [r for r in results if r.kind == kind]
        if not runs:
            continue
        for maturity in ORACLE_MATURITIES:
            for b, base in enumerate(("trend" if short else "day", "known")):
                best, shares = oracle_shares(runs, kind, maturity, b)
                half, most = first_delay(shares, 0.5), first_delay(shares, 0.95)
                print(
                    f"| {kind} | {maturity} min | {base} | {best} | {shares[60]:.0%} | "
                    f"{shares[120]:.0%} | {shares[180]:.0%} | {_minutes(half)} | "
                    f"{_minutes(most)} |"
                )
                if b == 0:
                    ratios.append((kind, maturity, base, runs, half, most))
    print_ratios(ratios)


def print_ratios(
    ratios: list[tuple[str, int, str, list[RunResult], int | None, int | None]],
) -> None:
    """The detector's median delay over the oracle's (50% found), and the delay by which
    it found 95% of the runs over the oracle's 95%, at the detector's own baseline: how
    near the limit it detects (1.0 is the oracle's one look)."""
    if not ratios:
        return
    print(
        "\nthe sequential detector against the oracle (same runs, the detector's baseline): "
        "its median delay over the oracle's 50%, its 95% over the oracle's 95%"
    )
    print()
    print(
        "| event | oracle maturity | detector median | oracle 50% | ratio "
        "| detector 95% | oracle 95% | ratio |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for kind, maturity, _, runs, half, most in ratios:
        delays = sorted(d for r in runs if (d := delay(r, r.detector)) is not None)
        median = statistics.median(delays) / 60_000 if delays else None
        # the delay by which 95% of all runs were found (None: fewer were found)
        at95 = (
            delays[math.ceil(0.95 * len(runs)) - 1] / 60_000
            if len(delays) >= math.ceil(0.95 * len(runs))
            else None
        )
        print(
            f"| {kind} | {maturity} min | {_minutes(median)} | {_minutes(half)} | "
            f"{_ratio(median, half)} | {_minutes(at95)} | {_minutes(most)} | "
            f"{_ratio(at95, most)} |"
        )


def _minutes(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} min"


def _ratio(detector: float | None, oracle: int | None) -> str:
    return "-" if detector is None or not oracle else f"{detector / oracle:.1f}"


def _oracle_zs(
    runs: list[RunResult], metric: str, delay_min: int, maturity_min: int, baseline: int
) -> list[float | None]:
    """Each run's oracle z of one metric, delay, maturity and baseline (0 day, 1 known)."""
    return [
        (z[baseline] if (z := r.oracle[metric, delay_min, maturity_min]) else None) for r in runs
    ]


if __name__ == "__main__":
    sys.exit(main())
