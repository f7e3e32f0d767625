"""A real Prometheus, a real Alertmanager and a webhook receiver, run with the repo's configs.

The binaries come from Debian's packages (``bash deploy/local/monitoring.sh install``,
which ``make test`` runs). Only addresses are rewritten: the scrape target, the
Alertmanager address and the webhook URL; rules, routes and intervals are the repo's.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import yaml

from tests.integration.kafka_helpers import free_port

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
ALERTMANAGER_CONFIG = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
INSTALL_HINT = "run `bash deploy/local/monitoring.sh install` (as root; `make test` does)"


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise AssertionError(f"{name} is not installed: {INSTALL_HINT}")
    return path


def get_json(url: str, timeout_s: float = 10) -> Any:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return json.loads(response.read())


def wait_for(what: str, check: Any, timeout_s: float, every_s: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except (OSError, urllib.error.URLError) as error:
            last = error
        else:
            if last:
                return last
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what} (last: {last!r})")


class Daemon:
    """A child process with a log file; every one started is stopped by the fixture."""

    started: ClassVar[list[Daemon]] = []

    def __init__(self, args: list[str], log_path: Path) -> None:
        self.log_path = log_path
        self._log = log_path.open("ab")
        self.process = subprocess.Popen(args, stdout=self._log, stderr=self._log)
        Daemon.started.append(self)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=20)
        self._log.close()

    def tail(self, lines: int = 20) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


class Webhook:
    """Alertmanager's webhook receiver: keeps every notification it gets."""

    def __init__(self) -> None:
        self.notifications: list[dict[str, Any]] = []
        received = self.notifications

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                received.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/alerts"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def alerts(self, status: str = "firing") -> list[dict[str, Any]]:
        return [a for n in self.notifications for a in n["alerts"] if a["status"] == status]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Alertmanager(Daemon):
    def __init__(self, workdir: Path, webhook_url: str) -> None:
        config = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())
        for receiver in config["receivers"]:
            for hook in receiver.get("webhook_configs", []):
                hook["url"] = webhook_url
        workdir.mkdir(parents=True, exist_ok=True)
        path = workdir / "alertmanager.yml"
        path.write_text(yaml.safe_dump(config))
        self.port = free_port()
        super().__init__(
            [
                binary("prometheus-alertmanager"),
                f"--config.file={path}",
                f"--storage.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--cluster.listen-address=",
            ],
            workdir / "alertmanager.log",
        )
        wait_for("Alertmanager to be ready", self._ready, 60, 0.3)

    def _ready(self) -> bool:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=5) as r:
            return r.status == 200


class Prometheus(Daemon):
    def __init__(self, workdir: Path, target_port: int | list[int], alertmanager_port: int) -> None:
        config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
        base = PROMETHEUS_CONFIG.parent
        config["rule_files"] = [str(base / pattern) for pattern in config["rule_files"]]
        ports = target_port if isinstance(target_port, list) else [target_port]
        for job in config["scrape_configs"]:
            for static in job.get("static_configs", []):
                static["targets"] = [f"127.0.0.1:{port}" for port in ports]
        for manager in config["alerting"]["alertmanagers"]:
            for static in manager.get("static_configs", []):
                static["targets"] = [f"127.0.0.1:{alertmanager_port}"]
        workdir.mkdir(parents=True, exist_ok=True)
        path = workdir / "prometheus.yml"
        path.write_text(yaml.safe_dump(config))
        self.config = config
        self.port = free_port()
        super().__init__(
            [
                binary("prometheus"),
                f"--config.file={path}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            workdir / "prometheus.log",
        )
        wait_for("Prometheus to be ready", self._ready, 60, 0.3)

    def _ready(self) -> bool:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=5) as r:
            return r.status == 200

    def api(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        body = get_json(f"http://127.0.0.1:{self.port}/api/v1/{path}{query}")
        if body.get("status") != "success":
            raise AssertionError(f"Prometheus {path} {params}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr)
        result = data["result"]
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": result}]
        return list(result)

    def alerts(self, name: str, state: str | None = None) -> list[dict[str, Any]]:
        found = [a for a in self.api("alerts")["alerts"] if a["labels"]["alertname"] == name]
        return [a for a in found if state is None or a["state"] == state]

    def scrape_up(self) -> bool:
        return any(float(s["value"][1]) == 1.0 for s in self.query("up"))
