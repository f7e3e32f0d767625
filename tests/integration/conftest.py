"""Fixtures for tests against the real Apache Kafka broker started by the test command.

``make test`` runs ``make kafka-up`` first (a single KRaft node on 127.0.0.1:9092 from
Maven Central jars). A test here fails, never skips, when the broker is missing.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
from kafka.admin import KafkaAdminClient, NewTopic

from tests.integration.kafka_helpers import BOOTSTRAP, ServiceProcess, Topics
from tests.integration.monitoring_helpers import Daemon


@pytest.fixture(scope="session")
def admin() -> Iterator[KafkaAdminClient]:
    try:
        client = KafkaAdminClient(
            bootstrap_servers=BOOTSTRAP, request_timeout_ms=10_000, client_id="tests-admin"
        )
    except Exception as error:
        pytest.fail(
            f"no Kafka broker on {BOOTSTRAP} ({error}); start one with `make kafka-up` "
            "(`make test` does) or set RETRIEVAL_MONITOR_TEST_KAFKA"
        )
    yield client
    client.close()


def create_topics(admin: KafkaAdminClient) -> Topics:
    """Fresh input, windows, dead-letter and regressions topics (4 input partitions) and a
    group name."""
    suffix = uuid.uuid4().hex[:8]
    names = Topics(
        queries=f"it-{suffix}.queries",
        feedback=f"it-{suffix}.feedback",
        windows=f"it-{suffix}.windows",
        deadletter=f"it-{suffix}.deadletter",
        group=f"it-{suffix}",
    )
    admin.create_topics(
        [
            NewTopic(names.queries, num_partitions=4, replication_factor=1),
            NewTopic(names.feedback, num_partitions=4, replication_factor=1),
            NewTopic(names.windows, num_partitions=1, replication_factor=1),
            NewTopic(names.deadletter, num_partitions=1, replication_factor=1),
            NewTopic(
                names.regressions,
                num_partitions=1,
                replication_factor=1,
                topic_configs={"cleanup.policy": "compact"},
            ),
        ]
    )
    return names


def delete_topics(admin: KafkaAdminClient, names: Topics) -> None:
    if not os.environ.get("RETRIEVAL_MONITOR_KEEP_TOPICS"):
        admin.delete_topics(
            [names.queries, names.feedback, names.windows, names.deadletter, names.regressions]
        )


@pytest.fixture
def topics(admin: KafkaAdminClient) -> Iterator[Topics]:
    names = create_topics(admin)
    yield names
    delete_topics(admin, names)


@pytest.fixture(autouse=True)
def _stop_leftover_services() -> Iterator[None]:
    """A test that fails half way must not leave a service (or Prometheus) running."""
    yield
    while ServiceProcess.started:
        service = ServiceProcess.started.pop()
        if service.process.poll() is None:
            service.process.kill()
            service.process.wait(timeout=30)
    while Daemon.started:
        Daemon.started.pop().stop()
