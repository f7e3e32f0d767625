"""A broker, a producer transport and a consumer in memory, for the real commit protocol.

Kafka is simulated: a record is (topic, partition, offset, event) in one global arrival
order; the consumer serves, in that order, every record at or after its position in each
topic partition (a seek moves the position back), and only records of the log "so far"
(``limit``). The transactional transport keeps what it was sent, and the offsets, until
a commit moves them to the broker together; a new transport (a restarted process, or a
replaced producer) starts with nothing open, as ``init_transactions`` aborts what the old
one left. The at-least-once transport writes every record to the broker at once.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from kafka.errors import KafkaConnectionError
from kafka.structs import OffsetAndMetadata, TopicPartition

from service.stream.events import FeedbackEvent, QueryEvent
from service.stream.topics import Topic
from service.stream.windows import ClosedWindow

TOPIC_NAMES = ("queries", "feedback")
WINDOWS_TOPIC = "windows"
EARLY_TOPIC = "windows.early"


@dataclass(frozen=True, slots=True)
class Record:
    """One input record in the global arrival order."""

    topic: Topic
    partition: int
    offset: int
    event: QueryEvent | FeedbackEvent

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(TOPIC_NAMES[self.topic], self.partition)


@dataclass
class FakeBroker:
    """What survives a process: committed records and committed offsets."""

    records: list[tuple[str, bytes | None, bytes | None]] = field(default_factory=list)
    offsets: dict[TopicPartition, OffsetAndMetadata] = field(default_factory=dict)
    fail_commits: list[int] = field(default_factory=list)
    """Transaction commits (counted from 1 over all transports) that fail."""
    commits: int = 0

    def windows(self, of: str = WINDOWS_TOPIC) -> list[ClosedWindow]:
        """Every window record (of the early windows' topic: early window) in the order it
        became visible."""
        return [
            ClosedWindow.from_record(orjson.loads(value))
            for topic, _, value in self.records
            if topic == of and value is not None
        ]


class FakeTransport:
    """A producer: transactional (records visible at commit) or not (visible at once)."""

    def __init__(self, broker: FakeBroker, transactional: bool) -> None:
        self.broker = broker
        self.transactional = transactional
        self.pending: list[tuple[str, bytes | None, bytes | None]] = []
        self.pending_offsets: dict[TopicPartition, OffsetAndMetadata] = {}

    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Any,
        partition: int | None = None,
    ) -> None:
        (self.pending if self.transactional else self.broker.records).append((topic, key, value))

    def flush(self) -> None:
        pass

    def begin(self) -> None:
        assert not self.pending

    def add_offsets(self, offsets: Mapping[Any, Any], group_metadata: Any, timeout_ms: int) -> None:
        self.pending_offsets.update(offsets)

    def commit(self, timeout_ms: int) -> None:
        self.broker.commits += 1
        if self.broker.commits in self.broker.fail_commits:
            raise KafkaConnectionError("the broker went away during the commit")
        self.broker.records.extend(self.pending)
        self.broker.offsets.update(self.pending_offsets)
        self.abort(timeout_ms)

    def abort(self, timeout_ms: int) -> None:
        self.pending, self.pending_offsets = [], {}

    def discard(self) -> None:
        self.abort(0)

    def close(self) -> None:
        pass


Tamper = Callable[[str | None], str | None]


class FakeConsumer:
    """Serves the log in arrival order from per-partition positions; commits to the broker."""

    def __init__(
        self,
        broker: FakeBroker,
        log: Sequence[Record],
        limit: int,
        partitions: int,
        tamper: Tamper | None = None,
    ) -> None:
        self.broker = broker
        self.tamper = tamper
        self.by_tp: dict[TopicPartition, list[tuple[int, Record]]] = {}
        for index, record in enumerate(log[:limit]):
            self.by_tp.setdefault(record.tp, []).append((index, record))
        self.tps = {TopicPartition(t, p) for t in TOPIC_NAMES for p in range(partitions)}
        self.positions = dict.fromkeys(self.tps, 0)
        self.delivered = 0

    # -- what the commit protocol calls ----------------------------------------------------

    def group_metadata(self) -> str:
        return "generation-1"

    def commit(self, offsets: Mapping[Any, Any]) -> None:
        self.broker.offsets.update(offsets)

    def committed(self, tp: Any, metadata: bool, timeout_ms: int) -> OffsetAndMetadata | None:
        found = self.broker.offsets.get(tp)
        if found is None or self.tamper is None:
            return found
        return OffsetAndMetadata(found.offset, self.tamper(found.metadata), found.leader_epoch)

    def committed_all(self) -> dict[TopicPartition, OffsetAndMetadata]:
        """What a rebalance fetches for the whole assignment."""
        out = {tp: self.committed(tp, True, 0) for tp in self.tps}
        return {tp: m for tp, m in out.items() if m is not None}

    def assignment(self) -> set[TopicPartition]:
        return set(self.tps)

    def seek(self, tp: Any, offset: int) -> None:
        self.positions[tp] = offset

    def seek_to_beginning(self, *tps: Any) -> None:
        for tp in tps:
            self.positions[tp] = 0

    # -- what the loop calls -------------------------------------------------------------------

    def poll(self, max_records: int) -> list[Record]:
        """The next records in arrival order, at or after each partition's position."""
        heads = []
        for tp, items in self.by_tp.items():
            i = self.positions[tp]
            if i < len(items):
                heads.append((items[i][0], tp))
        heapq.heapify(heads)
        out: list[Record] = []
        while heads and len(out) < max_records:
            _, tp = heapq.heappop(heads)
            items = self.by_tp[tp]
            out.append(items[self.positions[tp]][1])
            self.positions[tp] += 1
            i = self.positions[tp]
            if i < len(items):
                heapq.heappush(heads, (items[i][0], tp))
        self.delivered += len(out)
        return out
