"""Benchmark: `replay` throughput against a bare read-and-decode loop on the same JSONL file.

The file is simulated once (queries with 20 results, about 1.5 feedback events per
query, a deploy half-way) into a temporary directory. Each variant runs in its own
subprocess over that file, interleaved, ``--repeat`` times:

* ``bare``: read the lines and ``orjson.loads`` each (the floor for any Python consumer);
* ``validate``: ``service.replay.lines.decode_line`` on each line and nothing else (msgspec
  validation of the tagged union), to show how much of the time validation takes;
* ``replay``: ``service.replay.replay`` with the default ``PipelineConfig`` (and its
  reader process where there are two cores): validation,
  the event-time join, watermarks, and the finalisation of every window through the
  metric core. Its clock is fixed one hour after the last event (the future-timestamp
  guard passes everything; a replay has no wall-clock idleness).

and, timed from the outside as whole processes (startup included, as a user runs them):

* ``bare process``: ``python -c`` the bare loop over the file;
* ``replay process``: ``python -m service replay FILE --windows-out /dev/null`` (the
  command line, wall clock and all: the simulated events lie in the past);
* ``replay process, one process``: the same with ``--one-process`` (no reader process:
  what one core does).

With ``--mapped``, the same events are also written in a foreign shape (flat records,
epoch milliseconds, renamed signals: ``tests/foreign_shapes.py``) and replayed through
its input mapping (``mapped``), to show what reading users' own shapes costs.

The figures of merit are replay events/s / bare events/s, in process and as whole
processes (issue 16's target: >= 0.25 as whole processes on at least 600,000 events).
``--breakdown`` also prints where replay's time goes (us per event), ``--profile`` a
cProfile of one replay (top functions by own time). Not a test: figures, not
assertions.

    python tests/benchmarks/bench_replay.py [--events 600000] [--repeat 3] [--breakdown]
        [--profile] [--mapped]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from service.sim.simulator import HYBRID_V7, HYBRID_V8, SimulationConfig, generate
from service.times import HOUR_MS

QUERIES_PER_HOUR = 3600.0
ABANDON_RATE = 0.285
"""Tuned so that the mix is about 1.5 feedback events per query (the default 0.25 gives 1.6)."""
FEEDBACK_PER_QUERY = 1.5
TARGET = 0.25
VARIANTS = ("bare", "validate", "replay")
PROCESSES = ("bare process", "replay process", "replay process, one process")
BARE_SCRIPT = """
import sys, orjson
with open(sys.argv[1], "rb") as lines:
    for raw in lines:
        if raw.strip():
            orjson.loads(raw)
"""


def simulation(n_events: int) -> SimulationConfig:
    """Enough simulated hours for ``n_events`` (the stream is cut at exactly that many)."""
    hours = 1.1 * n_events / (QUERIES_PER_HOUR * (1 + FEEDBACK_PER_QUERY)) + 0.5
    return SimulationConfig(
        duration_ms=int(hours * HOUR_MS),
        queries_per_hour=QUERIES_PER_HOUR,
        abandon_rate=ABANDON_RATE,
        before=HYBRID_V7,
        after=HYBRID_V8,
    )


def make_file(path: Path, n_events: int) -> tuple[dict[str, int], int]:
    """Write the replay file; return the count per topic and the clock to replay with."""
    config = simulation(n_events)
    counts = {"queries": 0, "feedback": 0}
    with open(path, "w", encoding="utf-8") as sink:
        for event in itertools.islice(generate(config), n_events):
            counts[event.topic] += 1
            line = json.dumps({"topic": event.topic, "event": event.event}, separators=(",", ":"))
            sink.write(line + "\n")
    return counts, config.end_ms + HOUR_MS


def make_mapped_file(path: Path, mapping: Path, n_events: int) -> None:
    """The same events in a foreign shape, and the mapping that reads them."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.foreign_shapes import EPOCH_MS_MAPPING, to_epoch_ms

    events = list(itertools.islice(generate(simulation(n_events)), n_events))
    foreign, _ = to_epoch_ms(events)
    with open(path, "w", encoding="utf-8") as sink:
        for event in foreign:
            line = json.dumps({"topic": event.topic, "event": event.event}, separators=(",", ":"))
            sink.write(line + "\n")
    mapping.write_text(EPOCH_MS_MAPPING)


def run_variant(
    variant: str, path: Path, now_ms: int, mapping: Path | None = None
) -> dict[str, float]:
    """Time one variant over the file in this process."""
    out: dict[str, float] = {}
    if variant == "bare":
        import orjson

        start = time.perf_counter()
        n = 0
        with open(path, "rb") as lines:
            for raw in lines:
                if raw.strip():
                    orjson.loads(raw)
                    n += 1
    elif variant == "validate":
        from service.replay.lines import decode_line

        start = time.perf_counter()
        n = 0
        with open(path, "rb") as lines:
            for raw in lines:
                if raw.strip():
                    decode_line(raw)
                    n += 1
    else:
        from service.core.monitor import MonitorConfig
        from service.mapping.mapper import Mapper
        from service.mapping.spec import load_mapping
        from service.replay import replay
        from service.stream.windows import ClosedWindow

        finalised = [0]

        def on_windows(windows: list[ClosedWindow]) -> None:
            finalised[0] += sum(w.queries for w in windows)

        loaded = load_mapping(str(mapping)) if variant == "mapped" and mapping else None
        mapper = Mapper(loaded) if loaded is not None else None
        start = time.perf_counter()
        # (in one process for the breakdown, whose parts are timed in this process)
        one = {"reader": False} if variant == "one process" else {}
        _, report = replay(
            [str(path)], MonitorConfig(), on_windows, now_ms=lambda: now_ms, mapper=mapper, **one
        )
        n = report.lines
        out.update(invalid=report.invalid, windows=report.windows, finalised=finalised[0])
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "events": n, **out}


def profile(path: Path, now_ms: int, top: int = 20) -> None:
    """cProfile one replay and print the functions with the most own time."""
    import cProfile
    import pstats

    from service.core.monitor import MonitorConfig
    from service.replay import replay

    profiler = cProfile.Profile()
    profiler.enable()
    replay([str(path)], MonitorConfig(), lambda _: None, now_ms=lambda: now_ms)
    profiler.disable()
    stats = pstats.Stats(profiler, stream=sys.stdout)
    stats.strip_dirs().sort_stats("tottime").print_stats(top)


def breakdown(path: Path, now_ms: int) -> dict[str, float]:
    """Where one replay's time goes, in us per event, measured in this process (GC tuned
    as the command line does): reading and decoding the lines (a pass of its own), the
    finalisation of closed windows (``Pipeline.advance``), taking them in (counters,
    rolling views, the detector: ``Pipeline.deliver``), and the rest of the replay
    (the per-record join and bookkeeping, and the loop) by difference. The replay is run
    in one process (no reader process), so that every part is timed here."""
    from service.stream.pipeline import Pipeline

    try:  # (absent in a tree from before issue 16, measured for the "before" figures)
        from service.commands.runtime import tune_gc

        tune_gc()
    except ImportError:
        pass
    # (``deliver`` was ``published`` before issue 31: the "before" trees have that name)
    taken_in = "deliver" if hasattr(Pipeline, "deliver") else "published"
    spent = {"advance": 0.0, taken_in: 0.0}

    def timed(name: str) -> None:
        original = getattr(Pipeline, name)

        def wrapper(self: Pipeline, *args: object) -> object:
            start = time.perf_counter()
            try:
                return original(self, *args)
            finally:
                spent[name] += time.perf_counter() - start

        setattr(Pipeline, name, wrapper)

    timed("advance")
    timed(taken_in)
    decoded = run_variant("validate", path, now_ms)
    n, decode_s = decoded["events"], decoded["seconds"]
    total_s = run_variant("one process", path, now_ms)["seconds"]
    rest_s = total_s - decode_s - spent["advance"] - spent[taken_in]
    return {
        "read and decode": 1e6 * decode_s / n,
        "join and bookkeeping, the loop": 1e6 * rest_s / n,
        "finalisation (advance)": 1e6 * spent["advance"] / n,
        "taking windows in (published)": 1e6 * spent[taken_in] / n,
        "replay in all": 1e6 * total_s / n,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=600_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="also cProfile one replay")
    parser.add_argument(
        "--breakdown", action="store_true", help="also where replay's time goes, us per event"
    )
    parser.add_argument(
        "--mapped", action="store_true", help="also replay the events in a foreign shape"
    )
    parser.add_argument(
        "--variant", choices=(*VARIANTS, "mapped", "profile", "breakdown"), help=argparse.SUPPRESS
    )
    parser.add_argument("--file", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--mapping", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--now-ms", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.events < 1 or args.repeat < 1:
        parser.error("--events and --repeat must be positive")
    if args.variant == "profile":
        profile(args.file, args.now_ms)
        return
    if args.variant == "breakdown":
        print(json.dumps(breakdown(args.file, args.now_ms)))
        return
    if args.variant:
        print(json.dumps(run_variant(args.variant, args.file, args.now_ms, args.mapping)))
        return

    def child(variant: str) -> list[str]:
        mapped = ["--file", str(mapped_path), "--mapping", str(mapping)]
        return [
            sys.executable,
            __file__,
            "--variant",
            variant,
            *(mapped if variant == "mapped" else ["--file", str(path)]),
            "--now-ms",
            str(now_ms),
        ]

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "events.jsonl"
        mapped_path, mapping = Path(tmp) / "foreign.jsonl", Path(tmp) / "mapping.json"
        counts, now_ms = make_file(path, args.events)
        variants = VARIANTS
        if args.mapped:
            make_mapped_file(mapped_path, mapping, args.events)
            variants = (*VARIANTS, "mapped")
        n = sum(counts.values())
        print(
            f"data: {n} events ({counts['queries']} queries x 20 results, "
            f"{counts['feedback']} feedback: {counts['feedback'] / counts['queries']:.2f} "
            f"per query), {path.stat().st_size / 2**20:.0f} MiB of JSONL"
        )
        figures: dict[str, list[dict[str, float]]] = {v: [] for v in (*variants, *PROCESSES)}
        whole = {
            "bare process": [sys.executable, "-c", BARE_SCRIPT, str(path)],
            "replay process": [
                *(sys.executable, "-m", "service", "replay", str(path)),
                *("--windows-out", os.devnull),
            ],
            "replay process, one process": [
                *(sys.executable, "-m", "service", "replay", str(path)),
                *("--windows-out", os.devnull, "--one-process"),
            ],
        }
        for _ in range(args.repeat):
            for variant in variants:  # interleaved, so drift hits every variant
                out = subprocess.run(child(variant), capture_output=True, text=True, check=True)
                figures[variant].append(json.loads(out.stdout))
            for variant, command in whole.items():
                start = time.perf_counter()
                subprocess.run(command, capture_output=True, check=True)
                seconds = time.perf_counter() - start
                figures[variant].append({"seconds": seconds, "events": n})
        report(figures, n, counts)
        if args.breakdown:
            out = subprocess.run(child("breakdown"), capture_output=True, text=True, check=True)
            print("\nwhere replay's time goes (us per event, one run):")
            for part, us in json.loads(out.stdout).items():
                print(f"  {part:<32} {us:6.2f}")
        if args.profile:
            print("\ncProfile of one replay (own time):")
            sys.stdout.flush()
            subprocess.run(child("profile"), check=True)


def report(figures: dict[str, list[dict[str, float]]], n: int, counts: dict[str, int]) -> None:
    """Print the table and the ratio lines."""
    rates = {}
    for variant, rows in figures.items():
        times = [r["seconds"] for r in rows]
        rates[variant] = n / statistics.median(times)
        print(
            f"{variant:<27} median {statistics.median(times):7.3f} s  {rates[variant]:>11,.0f} "
            f"events/s   (runs: {', '.join(f'{t:.3f}' for t in times)})"
        )
    last = figures["replay"][-1]
    ok = all(r["events"] == n for rows in figures.values() for r in rows)
    ok = ok and last["invalid"] == 0 and last["finalised"] == counts["queries"]
    print(
        f"every variant read {n} events, none invalid, all {counts['queries']} queries "
        f"finalised in {last['windows']:.0f} windows: {ok}"
    )
    print(f"ratio replay / bare events/s, in process: {rates['replay'] / rates['bare']:.3f}")
    whole = rates["replay process"] / rates["bare process"]
    print(f"ratio replay / bare events/s, whole processes: {whole:.3f} (target >= {TARGET})")
    one = rates["replay process, one process"] / rates["bare process"]
    print(f"the same with --one-process (no reader process): {one:.3f}")
    print(f"ratio validate-only / bare events/s: {rates['validate'] / rates['bare']:.3f}")
    if "mapped" in figures:
        mapped = figures["mapped"][-1]
        same = mapped["finalised"] == last["finalised"] and mapped["windows"] == last["windows"]
        print(
            f"ratio replay through an input mapping / replay of the contract's shape: "
            f"{rates['mapped'] / rates['replay']:.3f} (same windows and queries: {same})"
        )
    print(
        f"share of replay time in validation: {rates['replay'] / rates['validate']:.0%}, "
        f"in read + JSON parse alone: {rates['replay'] / rates['bare']:.0%}"
    )


if __name__ == "__main__":
    main()
