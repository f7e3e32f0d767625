"""``simulate --kafka``: produce synthetic events to the input topics, keyed by query id."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson
from kafka import KafkaProducer

from service.config import Settings


def produce_events(settings: Settings, events: Iterable[Any]) -> int:
    """Produce simulated events to the input topics, keyed by query id; return the count."""
    producer = KafkaProducer(**settings.kafka_client_config(), acks="all", linger_ms=20)
    topics = {"queries": settings.queries_topic, "feedback": settings.feedback_topic}
    n = 0
    try:
        for event in events:
            producer.send(
                topics[event.topic], key=event.key.encode(), value=orjson.dumps(event.event)
            )
            n += 1
        producer.flush()
    finally:
        producer.close()
    return n
