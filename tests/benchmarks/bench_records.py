"""Benchmark: unpacking fetched record batches, kafka-python's way against the service's.

Simulated events (``--events``; the default traffic of ``bench_replay.py``) are encoded
as the Kafka records a producer would write: JSON values keyed by query id, create-time
timestamps a millisecond or so apart, ``--per-batch`` records per v2 batch (a producer
with ``linger_ms`` makes batches of that order at this traffic; the broker keeps them as
written), and the batches cut into fetch responses of at most 1 MiB of one partition
(the consumer's ``max_partition_fetch_bytes``). Each response is then drained as a
consumer's poll drains it, ``take(2000)`` at a time, in this process, ``--repeat``
times each, interleaved (medians):

* ``kafka-python``: ``Fetcher.PartitionRecords``, what a bare ``KafkaConsumer`` does;
* ``lean``: ``service.broker.records.LeanPartitionRecords``, what the service's
  consumers do (the same ``ConsumerRecord``s, checked here record for record);
* ``orjson.loads``: decoding every value once, the rest of a bare consume-and-decode
  loop, for scale.

No broker, no network: this is the per-record cost of turning fetched bytes into
records. Figures, not assertions (machines here are noisy):

    python tests/benchmarks/bench_records.py [--events 200000] [--per-batch 15] [--repeat 5]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import bench_replay  # (this directory: the same simulated traffic)
import orjson
from kafka.consumer.fetcher import Fetcher
from kafka.protocol.consumer import IsolationLevel
from kafka.record import MemoryRecords
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.structs import TopicPartition

from service.broker.records import LeanPartitionRecords
from service.commands.runtime import tune_gc
from service.sim.simulator import generate

FETCH_BYTES = 1 << 20
"""kafka-python's default ``max_partition_fetch_bytes``: one partition's share of a fetch."""
TAKE = 2000
"""Records handed out per poll (the service's ``max_poll_records``, and the bare loop's)."""
TP = TopicPartition("queries", 0)


def fetches(n_events: int, per_batch: int) -> tuple[list[bytes], int]:
    """The encoded fetch responses of one partition, and the number of records in them."""
    config = bench_replay.simulation(n_events)
    builder = None
    batches: list[bytes] = []
    offset = ts = 0
    n = 0
    for event in itertools.islice(generate(config), n_events):
        if builder is None:
            builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 24)
            delta = 0
        ts = max(ts + 1, config.start_ms + n // 3)  # create time: about 3 records a ms
        value = json.dumps(event.event, separators=(",", ":")).encode()
        builder.append(delta, timestamp=ts, key=event.key.encode(), value=value, headers=[])
        delta += 1
        n += 1
        if delta == per_batch:
            batches.append(_at(bytes(builder.build()), offset))
            offset += delta
            builder = None
    if builder is not None:
        batches.append(_at(bytes(builder.build()), offset))
    out: list[bytes] = []
    chunk: list[bytes] = []
    size = 0
    for batch in batches:
        if size + len(batch) > FETCH_BYTES and chunk:
            out.append(b"".join(chunk))
            chunk, size = [], 0
        chunk.append(batch)
        size += len(batch)
    out.append(b"".join(chunk))
    return out, n


def _at(batch: bytes, base_offset: int) -> bytes:
    """The batch with its base offset set (the broker assigns it)."""
    return base_offset.to_bytes(8, "big", signed=True) + batch[8:]


def drain(kind: type[Any], responses: list[bytes]) -> list[Any]:
    """Every record of the responses, taken as a consumer's polls take them."""
    out: list[Any] = []
    offset = 0
    for data in responses:
        records = kind(
            offset, TP, MemoryRecords(data), isolation_level=IsolationLevel.READ_COMMITTED
        )
        while records:
            out.extend(records.take(TAKE))
        offset = records.next_fetch_offset
    return out


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--per-batch", type=int, default=15)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    if min(args.events, args.per_batch, args.repeat) <= 0:
        parser.error("--events, --per-batch and --repeat must be positive")
    responses, n = fetches(args.events, args.per_batch)
    size = sum(map(len, responses))
    print(
        f"data: {n} records in {len(responses)} fetch responses of one partition "
        f"({size / 2**20:.0f} MiB, {args.per_batch} records a batch)"
    )
    theirs = drain(Fetcher.PartitionRecords, responses)
    ours = drain(LeanPartitionRecords, responses)
    same = len(ours) == n and ours == theirs
    same = same and all(type(r) is type(t) for r, t in zip(ours, theirs, strict=True))
    values = [r.value for r in theirs]
    del ours
    tune_gc()  # as the service does (and the records above are not re-examined)
    variants: dict[str, Callable[[], object]] = {
        "kafka-python": lambda: drain(Fetcher.PartitionRecords, responses),
        "lean": lambda: drain(LeanPartitionRecords, responses),
        "orjson.loads": lambda: [orjson.loads(v) for v in values],
    }
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.repeat):
        for name, fn in variants.items():  # interleaved, so drift hits every variant
            seconds[name].append(timed(fn))
    us = {name: 1e6 * statistics.median(s) / n for name, s in seconds.items()}
    for name, value in us.items():
        runs = ", ".join(f"{1e6 * s / n:.2f}" for s in seconds[name])
        print(f"{name:<13} median {value:7.2f} us per record   (runs: {runs})")
    print(f"ratio kafka-python / lean us per record: {us['kafka-python'] / us['lean']:.2f}")
    print(f"every record unpacked as kafka-python unpacks it: {same}")


if __name__ == "__main__":
    main()
