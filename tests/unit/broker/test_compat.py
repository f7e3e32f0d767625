"""The kafka-python versions the Kafka edge accepts (its internals are version-specific),
and the bounded waits it builds from them."""

from __future__ import annotations

import socket
import time

import kafka
import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaTimeoutError

from service.broker.compat import (
    check_version,
    fetch_state,
    last_committed,
    partitions_for_topic,
)
from service.errors import ConfigError


def test_the_installed_version_is_accepted() -> None:
    check_version()  # the one pyproject.toml pins
    assert kafka.__version__.startswith("3.0.")


@pytest.mark.parametrize("version", ["3.0.0", "3.0.12", "3.0.99"])
def test_every_3_0_release_is_accepted(version: str) -> None:
    check_version(version)


@pytest.mark.parametrize("version", ["3.1.0", "2.2.15", "4.0.0", "dev"])
def test_another_version_is_refused_with_the_fix(version: str) -> None:
    with pytest.raises(ConfigError) as raised:
        check_version(version)
    message = str(raised.value)
    assert f"kafka-python {version} is installed" in message
    assert "kafka-python>=3.0.12,<3.1" in message


def test_a_partition_lookup_gives_up_when_the_broker_never_answers() -> None:
    """A listener that accepts connections and never answers (a paused broker): the
    lookup raises after its bound, where kafka-python's own waits for ever."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        host, port = silent.getsockname()
        consumer = KafkaConsumer(bootstrap_servers=f"{host}:{port}", api_version=(3, 5))
        try:
            started = time.monotonic()
            with pytest.raises(KafkaTimeoutError):
                partitions_for_topic(consumer, "retrieval.queries", timeout_ms=800)
            assert 0.7 < time.monotonic() - started < 10
        finally:
            consumer.close(timeout_ms=100)


def test_a_last_committed_fetch_gives_up_when_the_broker_never_answers() -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        host, port = silent.getsockname()
        consumer = KafkaConsumer(
            bootstrap_servers=f"{host}:{port}", api_version=(3, 5), group_id="g"
        )
        try:
            started = time.monotonic()
            with pytest.raises(KafkaTimeoutError):
                last_committed(consumer, {TopicPartition("retrieval.queries", 0)}, 800)
            assert 0.7 < time.monotonic() - started < 10
        finally:
            consumer.close(timeout_ms=100)


def test_the_fetch_state_of_a_partition_reads_the_fetcher() -> None:
    """What the log line says of a partition that goes unfetched (no broker here: the
    partition has no position yet, so it is not fetchable)."""
    consumer = KafkaConsumer(bootstrap_servers="127.0.0.1:1", api_version=(3, 5))
    try:
        tp = TopicPartition("retrieval.feedback", 2)
        assert fetch_state(consumer, tp) == "not assigned"
        consumer.assign([tp])
        state = fetch_state(consumer, tp)
        assert "paused False" in state
        assert "valid position False" in state
        assert "fetchable False" in state
        consumer.pause(tp)
        assert "paused True" in fetch_state(consumer, tp)
    finally:
        consumer.close(timeout_ms=100)
