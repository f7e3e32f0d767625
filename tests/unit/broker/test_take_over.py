"""A partition taken over is never idle before its lag is known.

After a take-over (a rebalance, or a rebuild from the last commit) the consumer loop
measures each topic partition's lag once a second. Until then a topic that sent nothing
must not count as idle: queries re-read quickly would move the watermark on their own
and close windows before the feedback still to be read arrives (their labels lost).
"""

from __future__ import annotations

from service.broker.commits import CommitProtocol
from service.broker.publisher import AtLeastOncePublisher
from service.core.monitor import Monitor, MonitorConfig
from service.core.state import ServiceState
from service.sim.simulator import HOUR_MS
from service.stream.events import QueryEvent
from service.stream.join_state import JoinConfig
from service.stream.pipeline import PipelineConfig
from service.stream.topics import FEEDBACK
from service.stream.watermark import NEVER
from tests.unit.broker.fakes import (
    TOPIC_NAMES,
    WINDOWS_TOPIC,
    FakeBroker,
    FakeConsumer,
    FakeTransport,
)

START = 1_796_083_200_000
IDLE_MS = 2_000
CONFIG = PipelineConfig(join=JoinConfig(idle_timeout_ms=IDLE_MS, max_out_of_orderness_ms=0))


def test_a_topic_that_sent_nothing_since_the_take_over_is_behind_until_measured() -> None:
    clock = [START + HOUR_MS]
    monitor = Monitor(MonitorConfig(CONFIG), now_ms=lambda: clock[0])
    broker = FakeBroker()
    consumer = FakeConsumer(broker, [], 0, partitions=1)
    protocol = CommitProtocol(
        ServiceState(monitor, lambda: clock[0]),
        AtLeastOncePublisher(FakeTransport(broker, transactional=False), WINDOWS_TOPIC, "dlq"),
        consumer,
        TOPIC_NAMES,
    )
    protocol.take_over(consumer.assignment(), consumer.committed_all())
    pipeline = monitor.pipeline
    for i in range(100):  # queries re-read fast; the feedback partition not fetched yet
        query = QueryEvent(
            query_id=f"q{i}",
            timestamp=(START + i * 10_000) / 1000,
            retriever="r",
            results=["a", "b"],
        )
        assert pipeline.query(0, i, query) is None
    clock[0] += 10 * IDLE_MS  # long past the idle timeout
    watermark = pipeline.streams[0].watermark
    assert watermark.update() == NEVER  # feedback is behind: the watermark waits for it
    assert pipeline.advance() == []
    # the lag, once measured, says the feedback partition has nothing to read: idle
    watermark.set_backlog(FEEDBACK, False)
    assert watermark.update() == START + 99 * 10_000
