"""``retrieval-monitor demo``: the whole pipeline and HTTP server fed by the simulator.

No Kafka: simulated events enter the same :class:`~service.pipeline.Pipeline` in
arrival order, in accelerated time (the pipeline's clock is the simulated clock, so
idleness and the future-timestamp guard behave as they would live). A new retriever
version with a quality drop is deployed part way, so a regression opens (``/metrics``,
``/api/v1/regressions``); near the end the old version is rolled back, so the regression,
open until then, closes as ``rolled_back``. The terminal shows a compact live summary:
the rolling metrics per version, then every regression, open or closed. The queries of
the audit sample are audited by a careful judge (the simulator's, :mod:`service.sim.audit`)
an hour after they come, so the audited estimates show beside the live values.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from service.core.monitor import Monitor, MonitorConfig
from service.core.state import ServiceState
from service.detect.model import Regression
from service.http.app import create_app
from service.http.server import serve_http, stop_on_signals
from service.metrics.aggregates import merge
from service.sim.audit import JudgeModel
from service.sim.shape import TrafficShape
from service.sim.simulator import HYBRID_V7, HYBRID_V8, SimEvent, SimulationConfig, generate
from service.stream.events import feedback_from, query_from
from service.stream.pipeline import Pipeline
from service.stream.rolling import SliceTotals
from service.stream.topics import FEEDBACK, QUERIES
from service.times import DAY_MS, HOUR_MS, rfc3339, wall_ms
from service.times import duration_label as span_label

DEMO_JUDGE = "human:demo-raters"
"""The demo's judge when ``AUDIT_JUDGE`` names none: it grades every result with its true
grade and adds the truly relevant chunks never retrieved (what lowers recall)."""
AUDIT_DELAY = (HOUR_MS, HOUR_MS)
"""Its audits come an hour after their query, as from a pipeline working through a queue."""


@dataclass(frozen=True, slots=True)
class DemoOptions:
    """How much to simulate and how fast."""

    hours: float = 9.5
    deploy_at_hours: float = 5.0
    rollback_at_hours: float | None = 7.5
    """When the old version takes all the traffic back (None: never). A rollback closes
    the regression once the new version has served nothing for ``REGRESSION_CANDIDATE``
    (1 h) and that boundary is final (30 min of event time later): leave 1.6 h after it."""
    quality_drop: float = 0.15
    queries_per_hour: float = 3600.0
    speed: float = 300.0
    """Simulated seconds per wall-clock second."""
    seed: int = 7
    exit_when_done: bool = False
    live: bool = True


class SimClock:
    """Simulated milliseconds: ``start + speed * elapsed``, then real time after ``fast_until``."""

    def __init__(self, start_ms: int, speed: float, fast_until_ms: int) -> None:
        self.start_ms = start_ms
        self.speed = speed
        self.fast_until_ms = fast_until_ms
        self._t0 = time.monotonic()

    def __call__(self) -> int:
        elapsed_ms = (time.monotonic() - self._t0) * 1000
        fast_ms = (self.fast_until_ms - self.start_ms) / self.speed
        if elapsed_ms <= fast_ms:
            return self.start_ms + int(elapsed_ms * self.speed)
        return self.fast_until_ms + int(elapsed_ms - fast_ms)


def _summary(monitor: Monitor, spans_ms: tuple[int, ...]) -> Table:
    pipeline = monitor.pipeline
    wm = pipeline.watermark_ms
    table = Table(title=f"watermark {rfc3339(wm) if wm is not None else '-'}", title_justify="left")
    columns = ("window", "retriever", "labelled", "unlabelled", "hit_rate@5", "recall@5", "mrr")
    for name in (*columns, "ndcg@10"):
        table.add_column(name, justify="left" if name in columns[:2] else "right")
    rows: dict[tuple[int, str], SliceTotals] = {}
    for span in spans_ms if wm is not None else ():
        for (retriever, _segment), totals in monitor.view.closed.rolling(span, wm or 0).items():
            merged = rows.setdefault((span, retriever), SliceTotals())
            merged.merge(totals)
    for (span, retriever), totals in sorted(rows.items()):
        cells = [span_label(span), retriever, str(totals.labelled)]
        ratio = totals.unlabelled_ratio
        cells.append("-" if ratio is None else f"{ratio:.0%}")
        metrics = merge([totals.metrics])
        for key in ("hit_rate@5", "recall@5", "mrr", "ndcg@10"):
            moments = metrics.get(key)
            mean = None if moments is None else moments.mean
            cells.append("-" if mean is None else f"{mean:.3f}")
        table.add_row(*cells)
    c = pipeline.counts
    table.caption = (
        f"events {sum(c.events.values())}  pending queries {pipeline.pending_queries}  "
        f"windows {c.windows_published}  late {sum(c.late.values())}  "
        f"unmatched {sum(c.unmatched.values())}"
    )
    return table


def _regressions(monitor: Monitor) -> Table:
    """Every regression the detector keeps, open ones first: one row per slice and baseline
    (and, for closed ones, per close), with the metrics that dropped, when it opened (event
    time) and when and why it closed."""
    detector = monitor.detector
    through = detector.through_ms
    table = Table(
        title="regressions (event time, UTC; evaluated through "
        f"{rfc3339(through) if through is not None else '-'})",
        title_justify="left",
    )
    for name in ("state", "slice", "vs", "drops", "opened_at", "closed_at", "reason"):
        table.add_column(name)
    rows: dict[tuple[bool, str, str, str, int, str], list[Regression]] = {}
    for r in (*detector.open.values(), *detector.closed):
        o = r.opening
        closed = r.closed_ms is not None
        reason = "" if r.closed_reason is None else str(r.closed_reason)
        key = (closed, o.retriever, o.segment, o.baseline, r.closed_ms or 0, reason)
        rows.setdefault(key, []).append(r)
    for (closed, retriever, segment, baseline, closed_ms, reason), group in sorted(rows.items()):
        group.sort(key=lambda r: (r.opened_ms, r.opening.metric))
        drops = ", ".join(f"{r.opening.metric} {r.opening.delta:+.3f}" for r in group)
        table.add_row(
            "[green]closed[/]" if closed else "[bold red]open[/]",
            f"{retriever}/{segment}",
            baseline,
            drops,
            _at(group[0].opened_ms),
            _at(closed_ms) if closed else "-",
            reason if closed else "-",
        )
    if not rows:
        table.caption = "no regressions"
    return table


def _at(ms: int) -> str:
    """``12-06 22:40``: an event time in the table (UTC, to the minute)."""
    return rfc3339(ms)[5:16].replace("T", " ")


def _screen(monitor: Monitor, spans_ms: tuple[int, ...]) -> Group:
    return Group(_summary(monitor, spans_ms), _regressions(monitor))


def feed(
    pipeline: Pipeline,
    state: ServiceState,
    pending: Iterator[SimEvent],
    clock: Callable[[], int],
    stop: threading.Event,
) -> None:
    """Push simulated events (in arrival order) into the pipeline as the simulated clock
    reaches them."""
    offsets = [0, 0]
    upcoming = next(pending, None)
    while not stop.is_set():
        now = clock()
        with state.lock:
            while upcoming is not None and upcoming.arrival_ms <= now:
                if upcoming.topic == "queries":
                    event = query_from(upcoming.event)
                    pipeline.query(0, offsets[QUERIES], event)
                    offsets[QUERIES] += 1
                else:
                    feedback = feedback_from(upcoming.event)
                    pipeline.feedback(0, offsets[FEEDBACK], feedback)
                    offsets[FEEDBACK] += 1
                upcoming = next(pending, None)
            pipeline.deliver(pipeline.advance())
            state.health.last_poll_ms = state.wall_ms()
        state.beat()
        stop.wait(0.05)


def run_demo(options: DemoOptions, host: str, port: int, config: MonitorConfig) -> int:
    """Simulate, process and serve until the simulation ends (or Ctrl-C)."""
    wall = wall_ms
    start_ms = wall() - int(options.hours * HOUR_MS)
    start_ms -= start_ms % 60_000
    rollback = (
        None
        if options.rollback_at_hours is None
        else start_ms + int(options.rollback_at_hours * HOUR_MS)
    )
    sim = SimulationConfig(
        seed=options.seed,
        start_ms=start_ms,
        duration_ms=int(options.hours * HOUR_MS),
        queries_per_hour=options.queries_per_hour,
        before=HYBRID_V7,
        # the bad deploy: finds fewer relevant chunks and ranks the found ones lower
        after=replace(HYBRID_V8, rank_decay=0.75),
        switch_at_ms=start_ms + int(options.deploy_at_hours * HOUR_MS),
        quality_drop=options.quality_drop,
        shape=None if rollback is None else TrafficShape(rollback_at_ms=rollback),
        # the sampled queries' audits, by a careful judge an hour later: the estimates fill in
        audit_rate=config.pipeline.audit.rate,
        judges=(JudgeModel(config.pipeline.audit.judge or DEMO_JUDGE, delay_ms=AUDIT_DELAY),),
    )
    join = config.pipeline.join
    end_ms = sim.end_ms + join.attribution_ms + 2 * join.window_ms
    events = generate(sim)
    clock = SimClock(start_ms, options.speed, end_ms)
    monitor = Monitor(config, clock)
    pipeline = monitor.pipeline
    pipeline.assign(0)
    state = ServiceState(monitor, wall, needs_assignment=False)
    state.health.assigned = 1
    server, thread = serve_http(create_app(state), host, port)
    bound = server.servers[0].sockets[0].getsockname()[1] if server.servers else port
    console = Console()
    console.print(
        f"[bold]retrieval-monitor demo[/]: {options.hours:g} simulated hours at "
        f"{options.speed:g}x, {options.queries_per_hour:g} queries/h; hybrid-v8 deployed at "
        f"hour {options.deploy_at_hours:g} with a {options.quality_drop:.0%} drop in find rate"
        + (
            ""
            if options.rollback_at_hours is None
            else f", rolled back to hybrid-v7 at hour {options.rollback_at_hours:g}"
        )
        + ".\n"
        f"  metrics: http://{host}:{bound}/metrics\n"
        f"  rolling: http://{host}:{bound}/api/v1/rolling?window=1h\n"
        f"  windows: http://{host}:{bound}/api/v1/windows\n"
        f"  regressions: http://{host}:{bound}/api/v1/regressions?state=all\n"
        f"  tests: http://{host}:{bound}/api/v1/tests?retriever=hybrid-v8\n"
        f"  audited estimates ({sim.audit_rate:.0%} of queries audited an hour later): "
        f"http://{host}:{bound}/api/v1/estimates?window=24h&segment=*&metric=recall@5\n"
        "Ctrl-C stops."
    )
    stop = threading.Event()
    stop_on_signals(stop, threading.Event())
    feeder = threading.Thread(target=feed, args=(pipeline, state, events, clock, stop), daemon=True)
    feeder.start()
    rolling = config.pipeline.rolling_ms
    spans = tuple(s for s in rolling if s in (HOUR_MS, DAY_MS)) or tuple(sorted(rolling))[-2:]
    try:
        with Live(console=console, refresh_per_second=2, transient=False) as live:
            while not stop.is_set():
                with state.lock:
                    screen = _screen(monitor, spans)
                if options.live:
                    live.update(screen)
                if options.exit_when_done and clock() >= end_ms:
                    break
                stop.wait(0.5)
            with state.lock:
                live.update(_screen(monitor, spans))
    finally:
        stop.set()
        feeder.join(timeout=5)
        server.should_exit = True
        thread.join(timeout=5)
    return 0
