"""The lean unpacking of fetched record batches gives exactly what kafka-python gives.

Both ``Fetcher.PartitionRecords`` (kafka-python's) and ``LeanPartitionRecords`` (ours)
read the same fetched bytes: randomised v2 batches (keys, values and headers null,
empty, short and long enough for three-byte varints; gzip; log-append time;
transactions committed and aborted, with their control batches; a fetch that starts
inside a batch), legacy v0/v1 batches, and corrupt ones. They are drained by the same
sequence of ``take(n)`` calls, and after every call the records, the position
(``next_fetch_offset``), the counts kafka-python's fetch metrics read and any error must
be the same.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable
from typing import Any

import pytest
from kafka.consumer.fetcher import Fetcher
from kafka.errors import CorruptRecordError
from kafka.protocol.consumer import IsolationLevel
from kafka.record import MemoryRecords
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.legacy_records import LegacyRecordBatchBuilder
from kafka.record.util import calc_crc32c
from kafka.structs import TopicPartition

from service.broker.records import LeanPartitionRecords

TP = TopicPartition("queries", 3)
GZIP = DefaultRecordBatchBuilder.CODEC_GZIP
LOG_APPEND_TIME = DefaultRecordBatchBuilder.TIMESTAMP_TYPE_MASK
CONTROL = DefaultRecordBatchBuilder.CONTROL_MASK
ATTRIBUTES_AT = DefaultRecordBatchBuilder.ATTRIBUTES_OFFSET
CRC_AT = DefaultRecordBatchBuilder.CRC_OFFSET


class Aborted:
    """An aborted transaction as a fetch response lists it."""

    def __init__(self, producer_id: int, first_offset: int) -> None:
        self.producer_id = producer_id
        self.first_offset = first_offset


def blob(rng: random.Random) -> bytes | None:
    """A key or value: null, empty, short, or long enough for a 2- or 3-byte length."""
    size = rng.choice([-1, 0, 1, 5, 40, 63, 64, 200, 900, 8191, 8192, 20_000])
    return None if size < 0 else rng.randbytes(size)


def headers(rng: random.Random) -> list[tuple[str, bytes | None]]:
    if rng.random() < 0.6:
        return []
    keys = ["trace", "sjékel", "", "x" * 70]
    return [(rng.choice(keys), blob(rng)) for _ in range(rng.randint(1, 3))]


def batch(
    rng: random.Random,
    base_offset: int,
    n: int,
    *,
    compression: int = 0,
    producer_id: int = -1,
    transactional: bool = False,
    extra_attributes: int = 0,
    records: list[tuple[bytes | None, bytes | None, list[Any]]] | None = None,
) -> bytes:
    """One v2 batch at ``base_offset`` (offsets with gaps, as compaction leaves them)."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=compression,
        is_transactional=transactional,
        producer_id=producer_id,
        producer_epoch=0 if producer_id >= 0 else -1,
        base_sequence=0 if producer_id >= 0 else -1,
        batch_size=10_000_000,
    )
    first_ts = rng.randint(0, 2**41)
    delta = 0
    for i in range(n):
        key, value, hs = records[i] if records else (blob(rng), blob(rng), headers(rng))
        ts = first_ts + rng.choice([0, 1, 63, 64, 5_000, 10**7, -3])
        builder.append(delta, timestamp=ts, key=key, value=value, headers=hs)
        delta += rng.choice([1, 1, 1, 2, 70])
    data = bytearray(builder.build())
    struct.pack_into(">q", data, 0, base_offset)
    if extra_attributes:
        (attributes,) = struct.unpack_from(">h", data, ATTRIBUTES_AT)
        struct.pack_into(">h", data, ATTRIBUTES_AT, attributes | extra_attributes)
        struct.pack_into(">I", data, CRC_AT, calc_crc32c(memoryview(data)[ATTRIBUTES_AT:]))
    return bytes(data)


def marker(rng: random.Random, offset: int, producer_id: int, *, commit: bool) -> bytes:
    """The control batch that ends a transaction."""
    key = struct.pack(">hh", 0, 1 if commit else 0)
    record = (key, struct.pack(">hi", 0, 0), [])
    return batch(
        rng, offset, 1, producer_id=producer_id, transactional=True,
        extra_attributes=CONTROL, records=[record],
    )  # fmt: skip


def next_offset(data: bytes) -> int:
    (base,) = struct.unpack_from(">q", data, 0)
    (last_delta,) = struct.unpack_from(">i", data, 23)
    return int(base + last_delta + 1)


def fetched(rng: random.Random) -> tuple[bytes, list[Aborted]]:
    """A fetch response's records: several batches of every kind, in offset order."""
    out: list[bytes] = []
    aborted: list[Aborted] = []
    offset = rng.randint(0, 10**9)
    for _ in range(rng.randint(1, 6)):
        kinds = ["plain", "plain", "gzip", "append-time", "committed", "aborted"]
        kind = rng.choice(kinds) if out else "plain"
        n = rng.randint(1, 30)
        if kind in ("committed", "aborted"):
            pid = rng.randint(1, 5)
            data = batch(rng, offset, n, producer_id=pid, transactional=True)
            if kind == "aborted":
                aborted.append(Aborted(pid, offset))
            out.append(data)
            offset = next_offset(data)
            data = marker(rng, offset, pid, commit=kind == "committed")
        else:
            data = batch(
                rng, offset, n,
                compression=GZIP if kind == "gzip" else 0,
                extra_attributes=LOG_APPEND_TIME if kind == "append-time" else 0,
            )  # fmt: skip
        out.append(data)
        offset = next_offset(data)
    return b"".join(out), aborted


def drain(
    kind: Callable[..., Any], data: bytes, aborted: list[Aborted], takes: list[int], **kw: Any
) -> list[Any]:
    """What each ``take`` gives (records or the error), with the position and counts."""
    (first,) = struct.unpack_from(">q", data, 0) if data else (0,)
    records = kind(
        kw.pop("fetch_offset", first), TP, MemoryRecords(data),
        isolation_level=kw.pop("isolation_level", IsolationLevel.READ_COMMITTED),
        aborted_transactions=aborted, **kw,
    )  # fmt: skip
    seen: list[Any] = []
    for n in takes:
        if not records:  # drained: the fetcher takes no more (nor may it)
            break
        try:
            got: Any = records.take(n)
        except CorruptRecordError as error:
            # the one difference: the records are read from bytes, whose IndexError
            # says "index out of range" where kafka-python's bytearray's says
            # "bytearray index out of range"
            got = ("error", str(error).replace("bytearray index", "index"))
        seen.append((got, records.next_fetch_offset, records.records_read, records.bytes_read))
    seen.append(bool(records))
    return seen


def same(data: bytes, aborted: list[Aborted], takes: list[int], **kw: Any) -> list[Any]:
    ours = drain(LeanPartitionRecords, data, aborted, takes, **dict(kw))
    theirs = drain(Fetcher.PartitionRecords, data, aborted, takes, **dict(kw))
    assert ours == theirs
    return ours


@pytest.mark.parametrize("seed", range(40))
def test_randomised_batches_give_the_records_kafka_python_gives(seed: int) -> None:
    rng = random.Random(seed)
    data, aborted = fetched(rng)
    takes = [rng.choice([1, 3, 7, 50, 2000]) for _ in range(12)]
    seen = same(data, aborted, takes)
    records = [r for got, *_ in seen[:-1] for r in got]
    assert records, "every fetch here has records to hand out"


@pytest.mark.parametrize("seed", range(10))
def test_read_uncommitted_hands_out_aborted_records_as_kafka_python_does(seed: int) -> None:
    rng = random.Random(1000 + seed)
    data, aborted = fetched(rng)
    same(data, aborted, [2000] * 4, isolation_level=IsolationLevel.READ_UNCOMMITTED)


def test_a_fetch_from_inside_a_batch_starts_at_the_fetch_offset() -> None:
    rng = random.Random(7)
    data = batch(rng, 100, 20, compression=GZIP) + batch(rng, 5000, 5)
    seen = same(data, [], [4, 2000, 2000], fetch_offset=103)
    assert seen[0][0][0].offset >= 103


def test_the_fields_are_read_as_written() -> None:
    """Not only the same as kafka-python: what a producer wrote (an independent check)."""
    rng = random.Random(3)
    written = [
        (b"q-1", b'{"query_id": "q-1"}', []),
        (None, None, [("a", b"1"), ("b", None)]),
        (b"", b"x" * 20_000, []),
    ]
    data = batch(rng, 42, 3, records=written)
    (got, *_), *_ = drain(LeanPartitionRecords, data, [], [10])
    assert [(r.key, r.value, r.headers) for r in got] == written
    assert [(r.topic, r.partition) for r in got] == [("queries", 3)] * 3
    offsets = [r.offset for r in got]
    assert offsets[0] == 42
    assert offsets == sorted(set(offsets))
    assert [r.serialized_key_size for r in got] == [3, -1, 0]
    assert [r.serialized_value_size for r in got] == [19, -1, 20_000]
    assert [r.serialized_header_size for r in got] == [-1, 3, -1]


def test_legacy_message_formats_go_the_library_way() -> None:
    out = []
    for magic in (0, 1):
        builder = LegacyRecordBatchBuilder(magic=magic, compression_type=0, batch_size=10**6)
        for i in range(5):
            builder.append(i, timestamp=1_700_000_000_000 + i, key=b"k", value=b"v%d" % i)
        out.append(bytes(builder.build()))
    seen = same(b"".join(out[:1]), [], [3, 10])
    assert [r.value for r in seen[0][0]] == [b"v0", b"v1", b"v2"]
    same(out[1], [], [10, 10])


def corrupt(rng: random.Random, how: str) -> bytes:
    good = batch(rng, 10, 6, records=[(b"k", b"v" * 80, [])] * 6)
    if how == "crc":  # the last byte flipped, the CRC left as it was
        return good[:-1] + bytes([good[-1] ^ 0xFF])
    data = bytearray(good)
    header = DefaultRecordBatchBuilder.HEADER_STRUCT.size
    if how == "record length":  # the first record says it is one byte longer
        raw = (data[header] & 0x7F) | (data[header + 1] << 7)  # two bytes: over 63
        raw += 2  # zigzag: +2 is a length one more
        data[header], data[header + 1] = (raw & 0x7F) | 0x80, raw >> 7
    elif how == "trailing bytes":  # one record fewer counted than written
        struct.pack_into(">i", data, header - 4, 5)
    elif how == "truncated":  # one record more counted than written
        struct.pack_into(">i", data, header - 4, 7)
    elif how == "negative headers":  # the last record's header count is -1
        data[-1] = 0x01
    struct.pack_into(">I", data, CRC_AT, calc_crc32c(memoryview(data)[ATTRIBUTES_AT:]))
    return bytes(data)


@pytest.mark.parametrize(
    "how", ["crc", "record length", "trailing bytes", "truncated", "negative headers"]
)
def test_a_corrupt_batch_raises_what_kafka_python_raises(how: str) -> None:
    rng = random.Random(11)
    data = batch(rng, 0, 3) + corrupt(rng, how)
    seen = same(data, [], [2, 2000, 2000, 2000])
    assert any(got[0] == "error" for got, *_ in seen[:-1])


def test_crc_checks_can_be_left_off_as_in_kafka_python() -> None:
    rng = random.Random(12)
    same(corrupt(rng, "crc"), [], [2000, 2000], check_crcs=False)
