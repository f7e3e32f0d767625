"""``retrieval-monitor run``: the Kafka consumer loop and the HTTP server in one process."""

from __future__ import annotations

import logging
import threading

from service.broker.consumer import KafkaEdge
from service.broker.follower import WindowFollower
from service.config import Settings, monitor_config
from service.core.monitor import Monitor
from service.core.state import ServiceState
from service.http.app import create_app
from service.http.server import configure_logging, serve_http, stop_on_signals
from service.times import wall_ms

log = logging.getLogger("retrieval_monitor")


def run_service(settings: Settings) -> int:
    """Consume Kafka and serve HTTP until SIGTERM/SIGINT."""
    configure_logging(settings.log_level)
    monitor = Monitor(monitor_config(settings), wall_ms, global_view=True, record_decisions=True)
    state = ServiceState(
        monitor,
        wall_ms,
        topic_names=(settings.queries_topic, settings.feedback_topic),
    )
    edge = KafkaEdge(settings, state)
    partitions = edge.start()
    follower = WindowFollower(
        state,
        settings.kafka_client_config(),
        windows_topic=settings.windows_topic,
        early_topic=(
            None if monitor.config.pipeline.join.early_age_ms is None else settings.early_topic
        ),
        group_id=settings.group_id,
        input_topics=(settings.queries_topic, settings.feedback_topic),
        partitions=partitions,
        since_ms=wall_ms() - monitor.history_ms,
        interval_s=settings.commit_interval_ms / 1000,
        regressions_topic=settings.regressions_topic,
    )
    follower.start()
    server, thread = serve_http(create_app(state), settings.http_host, settings.http_port)
    log.info(
        "consuming %s and %s from %s; serving http://%s:%d/metrics",
        settings.queries_topic,
        settings.feedback_topic,
        settings.kafka_bootstrap_servers,
        settings.http_host,
        server.servers[0].sockets[0].getsockname()[1] if server.servers else settings.http_port,
    )
    stop, again = threading.Event(), threading.Event()
    stop_on_signals(stop, again)
    try:
        edge.run(stop)
        with state.lock:
            state.health.stopped = True
        if settings.shutdown_grace_ms:
            log.info(
                "handed over; serving the final /metrics for %d ms (a second SIGTERM ends it)",
                settings.shutdown_grace_ms,
            )
            again.wait(settings.shutdown_grace_ms / 1000)
    finally:
        follower.stop()
        server.should_exit = True
        thread.join(timeout=5)
    log.info("stopped")
    return 0
