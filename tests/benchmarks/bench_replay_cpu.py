"""Benchmark: the CPU time of `replay` in two trees, alternated on the same file.

On a noisy host the events/s ratios of ``bench_replay.py`` move more between runs than a
change of a few per cent; CPU time (user + system, of the replay and of its reader
process) moves less. This runs ``replay FILE --windows-out /dev/null`` by each tree's own
command, in pairs whose order alternates (so that neither tree always runs first), and
prints the medians, the mean difference per pair with its standard error, and the ratio
of the medians. ``--before`` and ``--after`` are checkouts, each with its own ``.venv``
(``make venv``). The file is ``bench_replay.py``'s, simulated once with this tree's code.

    python tests/benchmarks/bench_replay_cpu.py --before DIR [--after .] [--events 600000]
        [--pairs 20] [--one-process]

Not a test: figures, not assertions.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.benchmarks.bench_replay import make_file


def cpu_seconds(tree: Path, path: Path, extra: list[str]) -> float:
    """User + system time of one replay by ``tree``'s command, its children included."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    command = [str(tree / ".venv" / "bin" / "retrieval-monitor"), "replay", str(path)]
    subprocess.run(
        [*command, "--windows-out", "/dev/null", *extra],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--before", type=Path, required=True, help="the tree to compare with")
    parser.add_argument("--after", type=Path, default=Path("."), help="this tree by default")
    parser.add_argument("--events", type=int, default=600_000)
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--one-process", action="store_true", help="replay without its reader")
    args = parser.parse_args()
    if args.events <= 0 or args.pairs < 2:
        parser.error("--events must be positive and --pairs at least 2")
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    for name, tree in trees.items():
        if not (tree / ".venv" / "bin" / "retrieval-monitor").exists():
            parser.error(f"--{name} {tree}: no .venv/bin/retrieval-monitor (run make venv there)")
    extra = ["--one-process"] if args.one_process else []
    seconds: dict[str, list[float]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "events.jsonl"
        make_file(path, args.events)
        for pair in range(args.pairs):
            order = ("before", "after") if pair % 2 == 0 else ("after", "before")
            for name in order:
                seconds[name].append(cpu_seconds(trees[name], path, extra))
    before, after = seconds["before"], seconds["after"]
    differences = [a - b for a, b in zip(after, before, strict=True)]
    error = statistics.stdev(differences) / len(differences) ** 0.5
    flags = " ".join(extra)
    print(f"{args.pairs} alternated pairs of replay of {args.events} events {flags}".rstrip())
    for name, values in (("before", before), ("after", after)):
        median, mean = statistics.median(values), statistics.mean(values)
        print(f"{name:7} CPU s median {median:.3f}  mean {mean:.3f}")
    print(f"after - before per pair: mean {statistics.mean(differences):+.3f} s (s.e. {error:.3f})")
    ratio = statistics.median(after) / statistics.median(before)
    print(f"ratio of medians after / before: {ratio:.3f}")


if __name__ == "__main__":
    main()
