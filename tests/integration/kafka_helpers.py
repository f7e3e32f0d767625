"""Helpers for the integration tests: produce, read back, run the service as a process."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from service.simulator import HOUR_MS, HYBRID_V7, HYBRID_V8, SimEvent, SimulationConfig

BOOTSTRAP = os.environ.get("RETRIEVAL_MONITOR_TEST_KAFKA", "127.0.0.1:9092")
PARTITIONS = 4


@dataclass(frozen=True)
class Topics:
    queries: str
    feedback: str
    windows: str
    deadletter: str
    group: str

    def env(self) -> dict[str, str]:
        return {
            "RETRIEVAL_MONITOR_KAFKA_BOOTSTRAP_SERVERS": BOOTSTRAP,
            "RETRIEVAL_MONITOR_QUERIES_TOPIC": self.queries,
            "RETRIEVAL_MONITOR_FEEDBACK_TOPIC": self.feedback,
            "RETRIEVAL_MONITOR_WINDOWS_TOPIC": self.windows,
            "RETRIEVAL_MONITOR_DEADLETTER_TOPIC": self.deadletter,
            "RETRIEVAL_MONITOR_GROUP_ID": self.group,
        }


def deploy_traffic(bad: bool, seed: int, hours: int = 5) -> SimulationConfig:
    """Traffic ending now; half way hybrid-v8 replaces hybrid-v7, worse when ``bad``."""
    now = int(time.time() * 1000)
    start = now - hours * HOUR_MS
    return SimulationConfig(
        seed=seed,
        start_ms=start,
        duration_ms=hours * HOUR_MS,
        queries_per_hour=2400,
        before=HYBRID_V7,
        after=replace(HYBRID_V8, rank_decay=0.75) if bad else HYBRID_V8,
        switch_at_ms=start + hours * HOUR_MS // 2,
        quality_drop=0.15 if bad else 0.0,
        id_prefix=f"e2e{seed}-",
    )


def partition_of(query_id: str) -> int:
    """The partition both topics use for a query (producers key by query id)."""
    return zlib.crc32(query_id.encode()) % PARTITIONS


def produce(
    topics: Topics, events: Iterable[SimEvent], raw: Iterable[tuple[str, bytes]] = ()
) -> int:
    """Produce simulated events (and optional raw values) co-partitioned by query id."""
    producer = KafkaProducer(bootstrap_servers=BOOTSTRAP, acks="all", linger_ms=10)
    n = 0
    for event in events:
        topic = topics.queries if event.topic == "queries" else topics.feedback
        producer.send(
            topic,
            key=event.key.encode(),
            value=json.dumps(event.event).encode(),
            partition=partition_of(event.key),
        )
        n += 1
    for topic, value in raw:
        producer.send(topic, value=value, partition=0)
    producer.flush()
    producer.close()
    return n


def read_all(topic: str, timeout_s: float = 20) -> list[Any]:
    """Every record of a topic, from the beginning to its current end."""
    consumer = KafkaConsumer(
        bootstrap_servers=BOOTSTRAP, enable_auto_commit=False, isolation_level="read_committed"
    )
    parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
    consumer.assign(parts)
    consumer.seek_to_beginning(*parts)
    end = consumer.end_offsets(parts)
    records: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while any(consumer.position(tp) < end[tp] for tp in parts) and time.monotonic() < deadline:
        for batch in consumer.poll(timeout_ms=500).values():
            records.extend(batch)
    consumer.close()
    return records


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServiceProcess:
    """``python -m service run`` as a child process, configured through env vars."""

    started: ClassVar[list[ServiceProcess]] = []
    """Every process started, so that a failing test still stops them (see conftest)."""

    def __init__(self, topics: Topics, log_path: Path, **settings: str) -> None:
        self.port = free_port()
        env = {**os.environ, **topics.env()}
        env["RETRIEVAL_MONITOR_HTTP_PORT"] = str(self.port)
        for name, value in settings.items():
            env[f"RETRIEVAL_MONITOR_{name.upper()}"] = value
        self.log_path = log_path
        self._log = log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "service", "run"], env=env, stdout=self._log, stderr=self._log
        )
        ServiceProcess.started.append(self)

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()
        except OSError:
            return 0, b""

    def wait_until(self, condition: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(
                    f"the service exited ({self.process.returncode}): {self.tail()}"
                )
            if condition():
                return
            time.sleep(0.25)
        raise AssertionError(f"timed out waiting for {what}: {self.tail()}")

    def wait_ready(self, timeout_s: float = 60) -> None:
        self.wait_until(lambda: self.get("/readyz")[0] == 200, timeout_s, "/readyz")

    def samples(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        status, body = self.get("/metrics")
        if status != 200:
            return {}
        out = {}
        for family in text_string_to_metric_families(body.decode()):
            for sample in family.samples:
                out[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
        return out

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 60) -> int:
        self.process.send_signal(sig)
        code = self.process.wait(timeout=timeout_s)
        self._log.close()
        return code

    def tail(self, lines: int = 30) -> str:
        self._log.flush()
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])


def total(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    """Sum of a series over every label set that contains ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))
