"""Benchmark: reading window records back into the global view (what every replica of
``run`` does with every window of the windows topic), against ``orjson.loads`` of the
same records.

The windows come from a replay of simulated traffic (``--events``; the default traffic
of ``bench_replay.py``: 2 retrievers, 3 segments, a deploy), each encoded as ``run``
publishes it (``ClosedWindow.to_record``: 22 metrics, with exact fixed-point sums),
spread over ``--partitions`` input partitions. Timed, in this process, ``--repeat``
times each, interleaved (medians):

* ``bare``: ``orjson.loads`` of every record value;
* ``decode``: the follower's ``decode_windows`` (JSON, then a ``ClosedWindow`` with its
  ``Moments`` rebuilt from the fixed-point sums);
* ``view``: ``WindowView.add`` of the decoded windows into a fresh global view (rolling
  views, the repeat check, the detector), in polls of ``--poll`` records.

Figures, not assertions (machines here are noisy):

    python tests/benchmarks/bench_window_records.py [--events 200000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import bench_replay  # (this directory: the same simulated traffic)
import orjson

from service.broker.follower import decode_windows
from service.core.monitor import Monitor, MonitorConfig
from service.replay import replay
from service.sim.simulator import generate
from service.stream.windows import ClosedWindow


@dataclass
class Record:
    """The parts of a windows-topic record that the follower reads."""

    value: bytes
    timestamp: int
    offset: int
    partition: int


def window_records(n_events: int, partitions: int) -> tuple[list[Record], list[ClosedWindow], int]:
    """Window records of a replay of ``n_events`` simulated events, the windows they were
    made of, and the replay's clock."""
    config = bench_replay.simulation(n_events)
    now_ms = config.end_ms + 3_600_000
    windows: list[ClosedWindow] = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "events.jsonl"
        with open(path, "wb") as sink:
            for event in itertools.islice(generate(config), n_events):
                sink.write(orjson.dumps({"topic": event.topic, "event": event.event}) + b"\n")
        monitor, _ = replay([str(path)], MonitorConfig(), windows.extend, now_ms=lambda: now_ms)
    keys = monitor.pipeline.metric_keys
    records, spread = [], []
    for i, window in enumerate(windows):  # as if the traffic had come on several partitions
        spread.append(replace(window, partition=i % partitions))
        value = orjson.dumps(spread[-1].to_record(keys))
        records.append(Record(value, window.end_ms, i, i % partitions))
    return records, spread, now_ms


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--poll", type=int, default=50, help="records per poll of the view")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    records, written, now_ms = window_records(args.events, args.partitions)
    size = statistics.mean(len(r.value) for r in records)
    print(f"data: {len(records)} window records of {size:,.0f} bytes on average")
    times: dict[str, list[float]] = {"bare": [], "decode": [], "view": []}
    decoded: list[ClosedWindow] = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        for record in records:
            orjson.loads(record.value)
        times["bare"].append(time.perf_counter() - start)

        start = time.perf_counter()
        decoded, bad, _ = decode_windows(records)
        times["decode"].append(time.perf_counter() - start)
        if bad or len(decoded) != len(records):
            raise SystemExit(f"{bad} records were not read back as windows")

        view = Monitor(MonitorConfig(), lambda: now_ms, global_view=True).view
        start = time.perf_counter()
        for i in range(0, len(decoded), args.poll):
            view.add(decoded[i : i + args.poll])
        times["view"].append(time.perf_counter() - start)
    print(f"every record read back as the window written: {decoded == written}")
    n = len(records)
    per = {name: 1e6 * statistics.median(runs) / n for name, runs in times.items()}
    for name, label in (
        ("bare", "orjson.loads"),
        ("decode", "decode_windows"),
        ("view", "WindowView.add"),
    ):
        ratio = per[name] / per["bare"]
        print(f"{label:16} median {per[name]:8.1f} us per record   ({ratio:.2f} x bare)")
    print(f"read back in all: {per['decode'] + per['view']:.1f} us per record")


if __name__ == "__main__":
    main()
