"""A second Apache Kafka broker, private to one test, driven by ``deploy/local/kafka/kafka.sh``.

Fault and security tests need a broker they may restart, kill or configure with other
listeners without disturbing the shared one that every other test uses. It gets its own
state dir and ports, and reuses the shared broker's jars (no second Maven download)
when they are there.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

from tests.integration.kafka_helpers import free_port

REPO = Path(__file__).resolve().parents[2]
KAFKA_SH = REPO / "deploy" / "local" / "kafka" / "kafka.sh"
SHARED_LIBS = REPO / ".kafka" / "libs"


class PrivateBroker:
    """One KRaft node on free loopback ports; ``extra`` is appended to its properties.

    ``extra`` is formatted with ``{port}`` (PLAINTEXT), ``{controller_port}`` and one
    ``{name}`` per name in ``listener_ports`` (each gets a free port, in ``ports``), so
    it can declare more listeners (e.g. SASL_PLAINTEXT, SSL).
    """

    def __init__(
        self,
        state_dir: Path,
        extra: str = "",
        port: int | None = None,
        listener_ports: Iterable[str] = (),
    ) -> None:
        self.state_dir = state_dir
        self.port = port or free_port()
        self.controller_port = free_port()
        self.ports: dict[str, int] = {}
        """A free port per extra listener name, for ``{name}`` in ``extra``."""
        for name in listener_ports:
            taken = {self.port, self.controller_port, *self.ports.values()}
            while (candidate := free_port()) in taken:
                pass
            self.ports[name] = candidate
        state_dir.mkdir(parents=True, exist_ok=True)
        if (SHARED_LIBS / ".complete").exists() and not (state_dir / "libs").exists():
            (state_dir / "libs").symlink_to(SHARED_LIBS)
        self.extra_file = state_dir / "extra.properties"
        self.extra_file.write_text(
            extra.format(port=self.port, controller_port=self.controller_port, **self.ports)
        )

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _sh(self, *args: str, timeout_s: float = 300) -> None:
        env = {
            **os.environ,
            "KAFKA_STATE_DIR": str(self.state_dir),
            "KAFKA_PORT": str(self.port),
            "KAFKA_CONTROLLER_PORT": str(self.controller_port),
            "KAFKA_EXTRA_PROPERTIES": str(self.extra_file),
            "KAFKA_HEAP_OPTS": "-Xms256m -Xmx768m",
        }
        result = subprocess.run(
            ["bash", str(KAFKA_SH), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        if result.returncode != 0:
            log = self.state_dir / "logs" / "server.log"
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
            raise AssertionError(
                f"kafka.sh {' '.join(args)} failed ({result.returncode}):\n"
                f"{result.stdout}{result.stderr}\n{tail}"
            )

    def up(self) -> None:
        """Start (or restart) the broker and wait until it answers."""
        self._sh("up")

    def down(self, wipe: bool = False) -> None:
        """Stop it cleanly (SIGTERM: Kafka closes its logs and leaves the quorum)."""
        self._sh("down", *(["--wipe"] if wipe else []))

    def pid(self) -> int:
        return int((self.state_dir / "kafka.pid").read_text().split()[0])

    def kill9(self) -> None:
        """SIGKILL the JVM: no clean shutdown, the logs are recovered at the next start."""
        pid = self.pid()
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        (self.state_dir / "kafka.pid").unlink(missing_ok=True)
