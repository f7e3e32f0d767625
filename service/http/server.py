"""``retrieval-monitor run``: the Kafka consumer loop and the HTTP server in one process.

uvicorn serves in a background thread (it installs no signal handlers there); the
consumer loop runs in the main thread and owns SIGTERM/SIGINT, so a stop publishes
closed windows, commits and leaves the group before the server goes down.
"""

from __future__ import annotations

import faulthandler
import logging
import signal
import threading
import time
from types import FrameType

import uvicorn
from fastapi import FastAPI

from service.broker.consumer import KafkaEdge
from service.config import Settings
from service.http.app import create_app
from service.http.state import ServiceState
from service.stream.pipeline import Pipeline, PipelineConfig
from service.times import wall_ms

log = logging.getLogger("retrieval_monitor")


def serve_http(app: FastAPI, host: str, port: int) -> tuple[uvicorn.Server, threading.Thread]:
    """Start uvicorn in a daemon thread and wait until it listens."""
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="http", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    if not server.started:
        raise OSError(f"the HTTP server could not listen on {host}:{port}")
    return server, thread


def stop_on_signals(stop: threading.Event, again: threading.Event) -> None:
    """SIGTERM and SIGINT set ``stop``; a second one sets ``again`` (SIGINT: exits at once)."""

    def handler(signum: int, _frame: FrameType | None) -> None:
        if stop.is_set():
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            again.set()  # ends the shutdown grace
            return
        log.info("received %s; stopping cleanly", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    # SIGUSR1 prints every thread's stack to stderr (to see where a stuck loop waits)
    faulthandler.register(signal.SIGUSR1, all_threads=True)


def configure_logging(level: str) -> None:
    """Plain, timestamped logs to stderr."""
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True
    )
    logging.getLogger("kafka").setLevel(logging.WARNING)


def run_service(settings: Settings) -> int:
    """Consume Kafka and serve HTTP until SIGTERM/SIGINT."""
    configure_logging(settings.log_level)
    pipeline = Pipeline(PipelineConfig.from_settings(settings), wall_ms)
    state = ServiceState(
        pipeline,
        wall_ms,
        topic_names=(settings.queries_topic, settings.feedback_topic),
    )
    edge = KafkaEdge(settings, state)
    edge.start()
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
        state.health.stopped = True
        if settings.shutdown_grace:
            log.info(
                "handed over; serving the final /metrics for %d ms (a second SIGTERM ends it)",
                settings.shutdown_grace,
            )
            again.wait(settings.shutdown_grace / 1000)
    finally:
        server.should_exit = True
        thread.join(timeout=5)
    log.info("stopped")
    return 0
