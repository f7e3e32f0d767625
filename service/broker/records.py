"""Record batches unpacked in one lean pass (kafka-python's own unpacking, made cheap).

kafka-python turns every fetched record into Python objects through a chain of calls per
record: a generator step, ``DefaultRecordBatch.__next__`` and ``_read_msg``, seven calls
of ``decode_varint``, a ``DefaultRecord`` read back through seven properties, two
deserialiser calls and a header size sum before the ``ConsumerRecord``. In a bare
consume-and-decode loop that is most of the time (the profile in docs/benchmarks.md),
and the service pays it for every event and every window record it follows.

:class:`LeanPartitionRecords` is kafka-python's ``Fetcher.PartitionRecords`` with that
one step replaced for message format v2 batches (every broker since Kafka 0.11): each
batch is checked and skipped exactly as kafka-python does (CRC-32C, aborted
transactions, control batches), then its records are read by :func:`unpack_batch`, a
single loop whose varints are read inline in their one-byte case. The records are the
same ``ConsumerRecord`` tuples, field for field, with the same errors for a corrupt
batch (``tests/unit/broker/test_records.py`` holds both on randomised batches, every
codec included). Older message formats, deserialisers and anything else unusual go the
library's own way. It is installed per consumer by :func:`compat.lean_records`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from kafka.consumer.fetcher import ConsumerRecord, Fetcher
from kafka.errors import CorruptRecordError
from kafka.protocol.consumer import IsolationLevel
from kafka.record.default_records import DefaultRecordBatch
from kafka.record.util import decode_varint

_TIMESTAMP_TYPE_MASK = DefaultRecordBatch.TIMESTAMP_TYPE_MASK
_CONTROL_MASK = DefaultRecordBatch.CONTROL_MASK
_READ_COMMITTED = IsolationLevel.READ_COMMITTED


def unpack_batch(  # noqa: PLR0912, PLR0915 - one loop, written out: it runs per record
    batch: DefaultRecordBatch, topic: str, partition: int
) -> tuple[list[Any], list[int]]:
    """Every record of a (checked) v2 batch as ``ConsumerRecord`` tuples, in order, and
    each record's size in bytes (kafka-python's ``size_in_bytes``: its length field).

    Reads exactly what ``DefaultRecordBatch._read_msg`` reads and raises the same
    ``CorruptRecordError`` where it would; the records read before a corrupt one are
    attached to the error as ``unpacked`` (kafka-python hands those out first).
    """
    header = batch._header_data  # (base offset, ..., count), unpacked once by kafka-python
    base_offset, leader_epoch, attributes = header[0], header[2], header[5]
    first_ts, max_ts, count = header[7], header[8], header[12]
    log_append = attributes & _TIMESTAMP_TYPE_MASK
    ts_type = 1 if log_append else 0
    batch._maybe_uncompress()  # kafka-python's codecs
    buf = bytes(batch._buffer)  # slices of bytes are bytes: one copy per key or value
    pos = batch._pos
    out: list[Any] = []
    sizes: list[int] = []
    append = out.append
    size = sizes.append
    new, record_type = tuple.__new__, ConsumerRecord
    try:
        for _ in range(count):
            # Length => Varint (zigzag, as every varint here); a record over 63 bytes
            # takes two or more
            b = buf[pos]
            if b < 0x80:
                length = (b >> 1) ^ -(b & 1)
                pos += 1
            elif buf[pos + 1] < 0x80:
                b = (b & 0x7F) | (buf[pos + 1] << 7)
                length = (b >> 1) ^ -(b & 1)
                pos += 2
            else:
                length, pos = decode_varint(buf, pos)
            start = pos
            # Attributes => Int8, but written as a varint; unused
            if buf[pos] < 0x80:
                pos += 1
            else:
                _, pos = decode_varint(buf, pos)
            # TimestampDelta => Varlong
            b = buf[pos]
            if b < 0x80:
                ts_delta = (b >> 1) ^ -(b & 1)
                pos += 1
            elif buf[pos + 1] < 0x80:
                b = (b & 0x7F) | (buf[pos + 1] << 7)
                ts_delta = (b >> 1) ^ -(b & 1)
                pos += 2
            else:
                ts_delta, pos = decode_varint(buf, pos)
            # OffsetDelta => Varint
            b = buf[pos]
            if b < 0x80:
                offset_delta = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                offset_delta, pos = decode_varint(buf, pos)
            # Key => Bytes (length -1: null)
            b = buf[pos]
            if b < 0x80:
                key_len = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                key_len, pos = decode_varint(buf, pos)
            if key_len >= 0:
                key: bytes | None = buf[pos : pos + key_len]
                pos += key_len
                key_size = key_len
            else:
                key, key_size = None, -1
            # Value => Bytes (length -1: null)
            b = buf[pos]
            if b < 0x80:
                value_len = (b >> 1) ^ -(b & 1)
                pos += 1
            elif buf[pos + 1] < 0x80:
                b = (b & 0x7F) | (buf[pos + 1] << 7)
                value_len = (b >> 1) ^ -(b & 1)
                pos += 2
            else:
                value_len, pos = decode_varint(buf, pos)
            if value_len >= 0:
                value: bytes | None = buf[pos : pos + value_len]
                pos += value_len
                value_size = value_len
            else:
                value, value_size = None, -1
            # Headers => [HeaderKey HeaderValue]
            b = buf[pos]
            if b == 0:
                pos += 1
                headers: list[tuple[str, bytes | None]] = []
                header_size = -1
            else:
                pos, headers = _read_headers(buf, pos)
                header_size = _header_size(headers)
            if pos - start != length:
                raise CorruptRecordError(
                    f"Invalid record size: expected to read {length} bytes in record "
                    f"payload, but instead read {pos - start}"
                )
            size(length)
            append(
                new(  # ConsumerRecord(...) without the call of its generated __new__
                    record_type,
                    (
                        topic,
                        partition,
                        leader_epoch,
                        base_offset + offset_delta,
                        max_ts if log_append else first_ts + ts_delta,
                        ts_type,
                        key,
                        value,
                        headers,
                        None,
                        key_size,
                        value_size,
                        header_size,
                    ),
                )
            )
        if pos != len(buf):
            raise CorruptRecordError(
                f"{len(buf) - pos} unconsumed bytes after all records consumed"
            )
    except CorruptRecordError as error:
        error.unpacked = (out, sizes)
        raise
    except (ValueError, IndexError) as err:
        corrupt = CorruptRecordError(f"Found invalid record structure: {err!r}")
        corrupt.unpacked = (out, sizes)
        raise corrupt from None
    return out, sizes


def _read_headers(buf: bytes, pos: int) -> tuple[int, list[tuple[str, bytes | None]]]:
    """A record's headers from their count on (the rare case: a record with headers)."""
    count, pos = decode_varint(buf, pos)
    if count < 0:
        raise CorruptRecordError(f"Found invalid number of record headers {count}")
    headers: list[tuple[str, bytes | None]] = []
    for _ in range(count):
        key_len, pos = decode_varint(buf, pos)
        if key_len < 0:
            raise CorruptRecordError(f"Invalid negative header key size {key_len}")
        key = buf[pos : pos + key_len].decode("utf-8")
        pos += key_len
        value_len, pos = decode_varint(buf, pos)
        value: bytes | None = None
        if value_len >= 0:
            value = buf[pos : pos + value_len]
            pos += value_len
        headers.append((key, value))
    return pos, headers


def _header_size(headers: list[tuple[str, bytes | None]]) -> int:
    """kafka-python's ``serialized_header_size``: -1 for no headers."""
    if not headers:
        return -1
    return sum(len(k.encode("utf-8")) + (len(v) if v is not None else 0) for k, v in headers)


class LeanPartitionRecords(Fetcher.PartitionRecords):  # type: ignore[misc]
    """kafka-python's fetched records of one partition, v2 batches read by :func:`unpack_batch`."""

    def _unpack_records(
        self, tp: Any, records: Any, key_deserializer: Any, value_deserializer: Any
    ) -> Iterator[Any]:
        if key_deserializer is not None or value_deserializer is not None:
            yield from super()._unpack_records(tp, records, key_deserializer, value_deserializer)
            return
        topic, partition = tp.topic, tp.partition
        batch = records.next_batch()
        last_batch = None
        while batch is not None:
            last_batch = batch
            if batch.magic != 2:  # message format v0/v1 (brokers before 0.11): the library's way
                yield from super()._unpack_records(tp, _Rest(batch, records), None, None)
                return
            if self.check_crcs and not batch.validate_crc():
                raise CorruptRecordError(
                    f"Record batch for partition {self.topic_partition} at offset "
                    f"{batch.base_offset} failed crc check"
                )
            self.leader_epoch = batch.leader_epoch
            if self._skipped(batch):
                self.next_fetch_offset = batch.next_offset
                batch = records.next_batch()
                continue
            corrupt = None
            try:
                records_of, sizes = unpack_batch(batch, topic, partition)
            except CorruptRecordError as error:  # what came before it is handed out first
                (records_of, sizes), corrupt = error.unpacked, error
            # one by one, the position and counts following each (a poll may stop
            # inside a batch)
            for record, size in zip(records_of, sizes, strict=True):
                self.records_read += 1
                self.bytes_read += size
                self.next_fetch_offset = record.offset + 1
                yield record
            if corrupt is not None:
                raise corrupt
            batch = records.next_batch()
        # as kafka-python: the next fetch starts after the last batch, even if compaction
        # removed its last records
        if last_batch is not None and last_batch.magic == 2:
            self.next_fetch_offset = last_batch.next_offset
        self.drain()

    def _skipped(self, batch: DefaultRecordBatch) -> bool:
        """True for a control batch or one of an aborted transaction (kafka-python's rules)."""
        if self.isolation_level == _READ_COMMITTED and batch.has_producer_id():
            self._consume_aborted_transactions_up_to(batch.last_offset)
            if self._contains_abort_marker(batch):
                self.aborted_producer_ids.discard(batch.producer_id)
            elif self._is_batch_aborted(batch):
                return True
        return bool(batch.attributes & _CONTROL_MASK)


class _Rest:
    """A batch already taken out of ``MemoryRecords``, then the rest of them."""

    def __init__(self, first: Any, records: Any) -> None:
        self._first: Any = first
        self._records = records

    def next_batch(self) -> Any:
        if self._first is not None:
            first, self._first = self._first, None
            return first
        return self._records.next_batch()
