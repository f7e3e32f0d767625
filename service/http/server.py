"""The HTTP server thread, signal handling and logging of the long-running commands.

uvicorn serves in a background thread (it installs no signal handlers there); the
processing loop runs in the main thread and owns SIGTERM/SIGINT, so a stop publishes
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
