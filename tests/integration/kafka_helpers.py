"""Helpers for the integration tests: produce, read back, run the service as a process."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from service.metrics.aggregates import merge
from service.sim.simulator import (
    HYBRID_V7,
    HYBRID_V8,
    SimEvent,
    SimulationConfig,
    generate,
)
from service.stream.events import feedback_from, query_from
from service.stream.reference import evaluate_event_log
from service.stream.windows import ClosedWindow
from service.times import HOUR_MS

BOOTSTRAP = os.environ.get("RETRIEVAL_MONITOR_TEST_KAFKA", "127.0.0.1:9092")
PARTITIONS = 4


@dataclass(frozen=True)
class Topics:
    queries: str
    feedback: str
    windows: str
    deadletter: str
    group: str
    bootstrap: str = BOOTSTRAP
    """The broker these topics live on (a test may start a broker of its own)."""

    @property
    def regressions(self) -> str:
        """The regressions topic (the detector's ledger): one per windows topic, so that a
        run never reads back another run's decisions."""
        return f"{self.windows}.regressions"

    @property
    def early(self) -> str:
        """The early windows' topic (the service's default: the windows topic's)."""
        return f"{self.windows}.early"

    @property
    def audit_state(self) -> str:
        """The audit state topic (the service makes it): one per windows topic too."""
        return f"{self.windows}.audit-state"

    def env(self) -> dict[str, str]:
        return {
            "RETRIEVAL_MONITOR_KAFKA_BOOTSTRAP_SERVERS": self.bootstrap,
            "RETRIEVAL_MONITOR_QUERIES_TOPIC": self.queries,
            "RETRIEVAL_MONITOR_FEEDBACK_TOPIC": self.feedback,
            "RETRIEVAL_MONITOR_WINDOWS_TOPIC": self.windows,
            "RETRIEVAL_MONITOR_REGRESSIONS_TOPIC": self.regressions,
            "RETRIEVAL_MONITOR_AUDIT_STATE_TOPIC": self.audit_state,
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
    producer = KafkaProducer(bootstrap_servers=topics.bootstrap, acks="all", linger_ms=10)
    n = send_events(producer, topics, events)
    for topic, value in raw:
        producer.send(topic, value=value, partition=0)
    producer.flush()
    producer.close()
    return n


def send_event(producer: KafkaProducer, topics: Topics, event: SimEvent) -> Any:
    """Send one simulated event to its query id's partition (not flushed); its future."""
    topic = topics.queries if event.topic == "queries" else topics.feedback
    return producer.send(
        topic,
        key=event.key.encode(),
        value=json.dumps(event.event).encode(),
        partition=partition_of(event.key),
    )


def send_events(producer: KafkaProducer, topics: Topics, events: Iterable[SimEvent]) -> int:
    """Send simulated events co-partitioned by query id (not flushed); return the count."""
    n = 0
    for event in events:
        send_event(producer, topics, event)
        n += 1
    return n


def read_all(topic: str, timeout_s: float = 20, bootstrap: str = BOOTSTRAP) -> list[Any]:
    """Every record of a topic, from the beginning to its current end."""
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, isolation_level="read_committed"
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


def rss_bytes(pid: int) -> int:
    """Resident set size of a process, from /proc/<pid>/status (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


PROGRESS = (
    "retrieval_events_total",
    "retrieval_windows_published_total",
    "retrieval_queries_finalized_total",
)
"""Counters that rise only when the service gets on with its work: records read,
windows committed, queries final. (Not ``retrieval_commits_total``: the loop commits
every interval, with nothing new too.)"""

STALL_S = 300.0
"""How long a progress wait allows with none of ``PROGRESS`` moving. Above the longest
pause of a healthy service that reads nothing meanwhile: after a crash, committed
offsets a transaction left pending hold the rebuild until the stable fetch has failed
for ``SETTLE_AFTER_S`` (90 s, service/broker/hanging.py), each fetch bounded by
``COMMITTED_WAIT_MS`` (30 s) and the settling commit by the transaction waits (30 s
each); plus starting up and joining the group, on a machine busy with other work."""

BOUND_S = 900.0
"""The overall bound of a progress wait: a service that keeps moving but never gets
there (reading the same records again and again) fails too, never hangs."""


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
        except (OSError, http.client.HTTPException):
            # not answering, or killed mid-answer (a failpoint's SIGKILL while a scrape's
            # body is on its way: IncompleteRead is an HTTPException, not an OSError)
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
        self._give_up(what, f"timed out after {timeout_s:.0f} s")

    def wait_progressing(
        self,
        condition: Callable[[], bool],
        what: str,
        others: Sequence[ServiceProcess] = (),
        stall_s: float = STALL_S,
        bound_s: float = BOUND_S,
    ) -> None:
        """Wait until ``condition()`` for as long as the service makes progress.

        For a wait whose length is the service's work (records to read, windows to
        publish): on a busy machine that work takes longer, and a fixed timeout then
        fails a test that was only slow. Gives up when none of ``PROGRESS`` has moved
        for ``stall_s`` (the service stopped getting on), when ``bound_s`` has passed
        in all, or when the service exits; the message says what progress it saw.
        ``others``: replicas whose work counts too (the condition needs theirs)."""
        self._wait(condition, what, others, stall_s, bound_s, exits=False)

    def wait_exit(
        self,
        what: str,
        stall_s: float = STALL_S,
        bound_s: float = BOUND_S,
        meanwhile: Callable[[], None] = lambda: None,
    ) -> int:
        """Wait, as :meth:`wait_progressing`, for the service to exit on its own (a
        failpoint's SIGKILL, an error); return its exit code. ``meanwhile`` is called on
        every look (to feed it input, say)."""

        def exited() -> bool:
            meanwhile()
            return self.process.poll() is not None

        self._wait(exited, what, (), stall_s, bound_s, True)
        return self.process.returncode

    def _wait(
        self,
        condition: Callable[[], bool],
        what: str,
        others: Sequence[ServiceProcess],
        stall_s: float,
        bound_s: float,
        exits: bool,
    ) -> None:
        seen = ProgressLog([self, *others])
        while True:
            if condition():
                return
            if not exits and self.process.poll() is not None:
                raise AssertionError(
                    f"the service exited ({self.process.returncode}) while waiting for {what}; "
                    f"{seen.summary()}\n{self.tail()}"
                )
            now = time.monotonic()
            if now - seen.last_move >= stall_s:
                self._give_up(what, f"no progress for {stall_s:.0f} s; {seen.summary()}")
            if now - seen.started >= bound_s:
                self._give_up(what, f"the bound of {bound_s:.0f} s passed; {seen.summary()}")
            time.sleep(0.25)
            if now - seen.looked >= 1:  # (a scrape costs the busy machine some CPU)
                seen.look()

    def _give_up(self, what: str, why: str) -> None:
        self.process.send_signal(signal.SIGUSR1)  # the service prints its threads' stacks
        time.sleep(1)
        _, body = self.get("/metrics")
        gauges = [
            line
            for line in body.decode(errors="replace").splitlines()
            if line.startswith(("retrieval_consumer", "retrieval_watermark", "retrieval_pending"))
        ]
        raise AssertionError(
            f"gave up waiting for {what}: {why}\n{self.tail(200)}\n" + "\n".join(gauges)
        )

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


class ProgressLog:
    """The ``PROGRESS`` counters of services, looked at over a wait: when one last rose
    above its highest value yet (a scrape that fails or a replica that stops is no
    progress), and the totals at the first and the last look (for the message of a wait
    that gives up). Before a service answers ``/metrics`` there is nothing to see."""

    def __init__(self, services: Sequence[ServiceProcess]) -> None:
        self.services = services
        self.started = self.last_move = self.looked = time.monotonic()
        self.first: dict[int, dict[str, float]] = {}
        self.peak: dict[int, dict[str, float]] = {}
        self.commits: dict[int, float] = {}
        self.lag: dict[int, float] = {}
        self.looks = 0
        self.look()

    def look(self) -> None:
        self.looks += 1
        self.looked = time.monotonic()
        for i, service in enumerate(self.services):
            samples = service.samples()
            if not samples:
                continue
            now = {name: total(samples, name) for name in PROGRESS}
            self.commits[i] = total(samples, "retrieval_commits_total")
            self.lag[i] = total(samples, "retrieval_consumer_lag")
            self.first.setdefault(i, now)
            peak = self.peak.get(i)
            if peak is None or any(now[n] > peak[n] for n in PROGRESS):  # (up counts)
                self.last_move = self.looked
                self.peak[i] = now if peak is None else {n: max(now[n], peak[n]) for n in now}

    def summary(self) -> str:
        at = time.monotonic()
        if not self.peak:
            alive = sum(s.process.poll() is None for s in self.services)
            return (
                f"in {at - self.started:.0f} s no service answered /metrics "
                f"({self.looks} looks; {alive} of {len(self.services)} processes alive)"
            )
        moves = ", ".join(
            f"{name.removeprefix('retrieval_')} {sum(f[name] for f in self.first.values()):.0f}"
            f" -> {sum(p[name] for p in self.peak.values()):.0f}"
            for name in PROGRESS
        )
        of = (
            f" ({len(self.peak)} of {len(self.services)} replicas)"
            if len(self.services) > 1
            else ""
        )
        return (
            f"in {at - self.started:.0f} s{of}: {moves}; {sum(self.commits.values()):.0f} "
            f"commits, {sum(self.lag.values()):.0f} records unread; "
            f"last moved {at - self.last_move:.0f} s ago"
        )


def total(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    """Sum of a series over every label set that contains ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


# -- running the service over simulated traffic, and the oracle -------------------------

"""Settings that make a test run quick: short idleness, commits, windows and sessions."""
FAST = {"idle_timeout": "2s", "commit_interval": "1s", "window": "5m", "session_timeout": "6s"}


def traffic(seed: int, hours: float = 1.5, queries_per_hour: float = 2400) -> list[SimEvent]:
    now = time.time_ns() // 1_000_000
    start = now - int((hours + 1) * HOUR_MS)
    sim = SimulationConfig(
        seed=seed,
        start_ms=start,
        duration_ms=int(hours * HOUR_MS),
        queries_per_hour=queries_per_hour,
        before=HYBRID_V7,
        after=HYBRID_V8,
        switch_at_ms=start + int(hours * HOUR_MS * 0.6),
        id_prefix=f"it{seed}-",
    )
    return list(generate(sim))


def expected_windows(events: list[SimEvent]) -> dict[str, ClosedWindow]:
    queries = [query_from(e.event) for e in events if e.topic == "queries"]
    feedback = [  # (audits are never live labels)
        feedback_from(e.event)
        for e in events
        if e.topic == "feedback" and e.event.get("signal") != "audit"
    ]
    mapping = {q.query_id: partition_of(q.query_id) for q in queries}
    return evaluate_event_log(queries, feedback, partition_of=mapping)


def published_windows(topics: Topics) -> tuple[dict[str, ClosedWindow], dict[str, set[bytes]]]:
    return windows_of(read_all(topics.windows, bootstrap=topics.bootstrap))


def windows_of(records: Iterable[Any]) -> tuple[dict[str, ClosedWindow], dict[str, set[bytes]]]:
    """The last window per key of windows-topic records, and every distinct value per key."""
    last: dict[str, ClosedWindow] = {}
    versions: dict[str, set[bytes]] = defaultdict(set)
    for record in records:
        key = record.key.decode()
        versions[key].add(record.value)
        window = ClosedWindow.from_record(json.loads(record.value))
        assert window.key == key
        last[key] = window
    return last, versions


def wait_all_final(service: ServiceProcess, n_queries: int) -> None:
    def done() -> bool:
        s = service.samples()
        finalized = total(s, "retrieval_queries_finalized_total")
        return finalized == n_queries and total(s, "retrieval_pending_queries") == 0

    service.wait_progressing(done, f"{n_queries} finalised queries")


def serve_until_final(
    topics: Topics, tmp_path: Path, n_queries: int
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Run the service until every query is final; stop it cleanly; return its /metrics."""
    service = ServiceProcess(topics, tmp_path / "service.log", **FAST)
    try:
        service.wait_ready()
        wait_all_final(service, n_queries)
        return service.samples()
    finally:
        assert service.stop() == 0, service.tail()


def wait_all_published(service: ServiceProcess, topics: Topics, n_windows: int) -> None:
    """Wait until nothing is pending and every window is on the windows topic (while the
    service gets on with it: :meth:`ServiceProcess.wait_progressing`)."""
    service.wait_progressing(
        lambda: (
            total(service.samples(), "retrieval_pending_queries") == 0
            and len(published_windows(topics)[0]) >= n_windows
        ),
        "every window published",
    )


def run_to_the_end(service: ServiceProcess, topics: Topics, n_windows: int) -> None:
    """Wait until nothing is pending and every window is on the topic; stop cleanly."""
    try:
        service.wait_ready()
        wait_all_published(service, topics, n_windows)
    finally:
        assert service.stop() == 0, service.tail()


# -- bulk input: millions of generated records, produced fast -----------------------------


@dataclass(frozen=True)
class BulkSpec:
    """``count`` generated events of one kind, event times spread evenly over a span.

    ``kind`` is ``"query"`` (a valid query event with ``results`` ranked chunk ids, whose
    id never gets feedback) or ``"orphan"`` (valid feedback whose query id never
    appears). Event ``i`` has id ``f"{prefix}{i}"``, is keyed and partitioned by that id
    (``partition_of``) and dated ``start_ms + i * span_ms // count``, so each partition's
    offsets run forward in event time.
    """

    kind: str
    topic: str
    prefix: str
    count: int
    start_ms: int
    span_ms: int
    results: int = 10
    bootstrap: str = BOOTSTRAP


def bulk_value(spec: BulkSpec, i: int) -> tuple[str, bytes]:
    """Event ``i`` of a spec: (query id, JSON bytes)."""
    from service.times import rfc3339_millis

    query_id = f"{spec.prefix}{i}"
    ts = rfc3339_millis(spec.start_ms + i * spec.span_ms // spec.count)
    if spec.kind == "query":
        results = ",".join(
            f'"doc-{(i * 7 + r * 131) % 50_000}#{r % 4}"' for r in range(spec.results)
        )
        text = (
            f'{{"query_id":"{query_id}","timestamp":"{ts}","retriever":"hybrid-v7",'
            f'"results":[{results}],"context_k":5,"segment":"support-kb"}}'
        )
    elif spec.kind == "orphan":
        signal = ('"signal":"click"', '"signal":"citation"', '"signal":"judgment","grade":2')[i % 3]
        text = (
            f'{{"query_id":"{query_id}","timestamp":"{ts}",'
            f'"chunk_id":"doc-{i % 50_000}#{i % 4}",{signal}}}'
        )
    else:
        raise ValueError(f"unknown kind {spec.kind!r}")
    return query_id, text.encode()


def _produce_bulk(spec: BulkSpec) -> tuple[list[int], float]:
    """Produce one spec (in a worker process); return (records per partition, seconds)."""
    producer = KafkaProducer(
        bootstrap_servers=spec.bootstrap,
        acks=1,
        linger_ms=50,
        batch_size=1 << 20,
        compression_type=None,
    )
    per_partition = [0] * PARTITIONS
    start = time.perf_counter()
    send = producer.send
    for i in range(spec.count):
        query_id, value = bulk_value(spec, i)
        key = query_id.encode()
        partition = zlib.crc32(key) % PARTITIONS
        send(spec.topic, key=key, value=value, partition=partition)
        per_partition[partition] += 1
    producer.flush()
    seconds = time.perf_counter() - start
    producer.close()
    return per_partition, seconds


def produce_bulk(specs: list[BulkSpec]) -> list[tuple[list[int], float]]:
    """Produce each spec from its own process (kafka-python's ``send`` costs some 25 µs of
    CPU per record, so one process tops out near 40,000 records/s); return, per spec, the
    records per partition and the seconds it took."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")  # no fork of the caller's client threads
    with context.Pool(len(specs)) as pool:
        return pool.map(_produce_bulk, specs)


def stop_and_scrape(service: ServiceProcess, timeout_s: float = 90) -> dict[Any, float]:
    """Clean stop with a last scrape: SIGTERM, wait until the handover is done (``/readyz``
    says stopped; needs ``shutdown_grace``), scrape ``/metrics``, end the grace."""
    service.process.send_signal(signal.SIGTERM)
    service.wait_until(
        lambda: b"stopped" in service.get("/readyz")[1], timeout_s, "the handover at stop"
    )
    samples = service.samples()
    assert samples, "no final scrape"
    assert service.stop() == 0, service.tail()  # a second SIGTERM ends the grace
    return samples


def group_assignment(bootstrap: str, group: str) -> dict[str, dict[str, set[int]]]:
    """Member id -> topic -> partitions, as the group coordinator has them now."""
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="tests-groups")
    try:
        described = admin.describe_groups([group])[group]
    finally:
        admin.close()
    out: dict[str, dict[str, set[int]]] = {}
    for member in described.get("members", []):
        assignment = member.get("member_assignment") or {}
        parts = assignment.get("assigned_partitions", []) if isinstance(assignment, dict) else []
        out[member["member_id"]] = {p["topic"]: set(p["partitions"]) for p in parts}
    return out


def check_counts(
    lifetimes: list[dict[Any, float]], expected: dict[str, ClosedWindow], duplicates: int = 0
) -> None:
    """Counter totals summed over process lifetimes equal the offline evaluation (and
    ``duplicates``, the query events the input holds twice)."""

    def summed(name: str, **labels: str) -> float:
        return sum(total(s, name, **labels) for s in lifetimes)

    n_queries = sum(w.queries for w in expected.values())
    assert summed("retrieval_queries_total") == n_queries
    assert summed("retrieval_queries_finalized_total") == n_queries
    assert summed("retrieval_duplicate_events_total") == duplicates
    assert summed("retrieval_late_events_total") == 0
    assert summed("retrieval_windows_published_total") == len(expected)
    for retriever in ("hybrid-v7", "hybrid-v8"):
        merged = merge(w.metrics for w in expected.values() if w.retriever == retriever)
        hits = merged["hit_rate@5"].count
        assert summed("retrieval_hit_count", retriever=retriever, k="5") == hits
        assert summed("retrieval_reciprocal_rank_count", retriever=retriever) == merged["mrr"].count


def check_windows(topics: Topics, expected: dict[str, ClosedWindow]) -> None:
    published, versions = published_windows(topics)
    assert published == expected
    assert all(len(v) == 1 for v in versions.values()), "a key carried two records"
    records = read_all(topics.windows, bootstrap=topics.bootstrap)
    assert len(records) == len(expected), "a window was published twice"


def report_figures(
    test: str, faults: str, records_in: int, topics: Topics, expected: dict[str, ClosedWindow]
) -> tuple[int, int]:
    """Print one line of the fault table in docs/reliability.md; return (lost, duplicated).

    Lost: expected windows missing from the topic or different there (last record per
    key). Duplicated: window records beyond one per key.
    """
    records = read_all(topics.windows, bootstrap=topics.bootstrap)
    last = {r.key.decode(): ClosedWindow.from_record(json.loads(r.value)) for r in records}
    lost = sum(1 for key, window in expected.items() if last.get(key) != window)
    duplicated = len(records) - len(last)
    print(
        f"\nFIGURES | {test} | {faults} | {records_in} | {len(records)} | {len(expected)} "
        f"| {lost} | {duplicated}"
    )
    return lost, duplicated


class Probes:
    """Reads /healthz and /readyz twice a second in a thread: (time, healthz, readyz, reason);
    with ``progress``, also the commits and the windows committed so far (``COMMITTED``)."""

    def __init__(self, service: ServiceProcess, progress: bool = False) -> None:
        self.service = service  # (a test may point it at a restarted process)
        self.seen: list[tuple[float, int, int, str]] = []
        self.progress: list[tuple[float, int, dict[str, float]]] | None = [] if progress else None
        """(time, process id, {series: value}) for the series of ``COMMITTED``."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    COMMITTED = ("retrieval_commits_total", "retrieval_windows_published_total")
    """Series that rise at each commit: any commit, and one that carried windows."""

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            service = self.service
            health, _ = service.get("/healthz")
            ready, body = service.get("/readyz")
            try:
                reason = json.loads(body).get("reason", "") if body else ""
            except ValueError:
                reason = ""
            self.seen.append((time.monotonic(), health, ready, reason))
            if self.progress is not None:
                status, page = service.get("/metrics")
                values = {}
                for line in page.decode(errors="replace").splitlines() if status == 200 else ():
                    name, _, value = line.partition(" ")
                    if name in self.COMMITTED:
                        values[name] = float(value)
                if len(values) == len(self.COMMITTED):
                    self.progress.append((time.monotonic(), service.process.pid, values))

    def first_rise_after(self, at: float, series: str) -> float | None:
        """Seconds from ``at`` to the first rise of ``series`` after it (the same process
        before and after), or None if there was none."""
        samples = self.progress or []
        before = [s for s in samples if s[0] <= at]
        if not before:
            return None
        _, pid, values = before[-1]
        for t, p, later in samples[len(before) :]:
            if p != pid:
                return None
            if later[series] > values[series]:
                return t - at
        return None

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def longest_unhealthy_s(self) -> float:
        """The longest run of /healthz answers other than 200."""
        longest, since = 0.0, None
        for at, health, _, _ in self.seen:
            if health != 200:
                since = at if since is None else since
                longest = max(longest, at - since)
            else:
                since = None
        return longest

    def during(self, start: float, end: float) -> list[tuple[float, int, int, str]]:
        return [s for s in self.seen if start <= s[0] <= end]
