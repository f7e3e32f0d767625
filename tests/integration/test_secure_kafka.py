"""Property 17 (secure transport): SASL/PLAIN and TLS against a real broker, no secret leaks.

One private broker for the module, with four listeners: PLAINTEXT (the test produces
and reads back through it), SASL_PLAINTEXT (PLAIN, user ``monitor``), SSL (a self-signed
certificate made with ``keytool`` here, SAN IP:127.0.0.1 and DNS:localhost) and the
KRaft CONTROLLER. The service is configured through its settings only (env vars).

* Through SASL_PLAINTEXT and through SSL the windows it publishes equal the offline
  evaluation of the events.
* The SASL password (random, distinctive) appears nowhere: not in the service's log at
  DEBUG level, not in ``/metrics``, not in any GET endpoint of the HTTP API (found in
  its OpenAPI document).
* A wrong password, and a CA that did not sign the broker's certificate, make the
  service exit non-zero with an error naming the problem and the settings to check;
  that output does not echo the wrong password either.
"""

from __future__ import annotations

import json
import subprocess
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from kafka.admin import KafkaAdminClient

from tests.integration.conftest import create_topics
from tests.integration.kafka_helpers import (
    FAST,
    ServiceProcess,
    Topics,
    check_windows,
    expected_windows,
    produce,
    report_figures,
    traffic,
    wait_all_final,
)
from tests.integration.private_broker import PrivateBroker

pytestmark = [pytest.mark.integration, pytest.mark.faults, pytest.mark.slow]

USER = "monitor"
PASSWORD = f"s3cr3t-{uuid.uuid4()}"
"""The service's SASL password: random, so that finding it anywhere is a leak."""

EXTRA = """
listeners=PLAINTEXT://127.0.0.1:{port},SASL_PLAINTEXT://127.0.0.1:{sasl},SSL://127.0.0.1:{ssl},CONTROLLER://127.0.0.1:{controller_port}
advertised.listeners=PLAINTEXT://127.0.0.1:{port},SASL_PLAINTEXT://127.0.0.1:{sasl},SSL://127.0.0.1:{ssl},CONTROLLER://127.0.0.1:{controller_port}
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,SSL:SSL
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
sasl.enabled.mechanisms=PLAIN
listener.name.sasl_plaintext.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required \\
    username="admin" password="{admin_password}" user_admin="{admin_password}" user_{user}="{password}";
listener.name.ssl.ssl.keystore.type=PKCS12
listener.name.ssl.ssl.keystore.location={keystore}
listener.name.ssl.ssl.keystore.password={store_password}
listener.name.ssl.ssl.key.password={store_password}
"""  # noqa: E501  (one listener list per line, as Kafka reads it)


@dataclass(frozen=True)
class SecureBroker:
    broker: PrivateBroker
    ca_pem: Path
    """The broker's self-signed certificate, in PEM: the CA a client trusts."""

    @property
    def sasl(self) -> str:
        return f"127.0.0.1:{self.broker.ports['sasl']}"

    @property
    def ssl(self) -> str:
        return f"127.0.0.1:{self.broker.ports['ssl']}"

    def failed_logins(self, listener: str) -> list[str]:
        """The broker's log lines about failed authentications on one listener's port."""
        log = self.broker.state_dir / "logs" / "server.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        port = f"(channelId=127.0.0.1:{self.broker.ports[listener]}-"
        return [
            line for line in text.splitlines() if "Failed authentication" in line and port in line
        ]


def self_signed(directory: Path, name: str, store_password: str) -> tuple[Path, Path]:
    """A PKCS12 keystore with a self-signed certificate for 127.0.0.1, and that cert in PEM."""
    keystore, pem = directory / f"{name}.p12", directory / f"{name}.pem"
    common = ["-alias", name, "-keystore", str(keystore), "-storetype", "PKCS12"]
    for args in (
        [
            *("-genkeypair", "-keyalg", "RSA", "-keysize", "2048", "-validity", "2"),
            *("-dname", "CN=localhost", "-ext", "SAN=IP:127.0.0.1,DNS:localhost"),
            *("-keypass", store_password),
        ],
        ["-exportcert", "-rfc", "-file", str(pem)],
    ):
        result = subprocess.run(
            ["keytool", *args, *common, "-storepass", store_password, "-noprompt"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert result.returncode == 0, f"keytool {args[0]} failed: {result.stdout}{result.stderr}"
    return keystore, pem


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    base = tmp_path_factory.mktemp("secure-kafka")
    store_password = uuid.uuid4().hex
    keystore, pem = self_signed(base, "broker", store_password)
    extra = EXTRA.format(
        port="{port}",  # the ports are PrivateBroker's to choose
        controller_port="{controller_port}",
        sasl="{sasl}",
        ssl="{ssl}",
        admin_password=uuid.uuid4().hex,
        user=USER,
        password=PASSWORD,
        keystore=keystore,
        store_password=store_password,
    )
    broker = PrivateBroker(base / "broker", extra, listener_ports=("sasl", "ssl"))
    try:
        broker.up()
        yield SecureBroker(broker, pem)
    finally:
        broker.down(wipe=True)


@pytest.fixture(scope="module")
def private_admin(secure: SecureBroker) -> Iterator[KafkaAdminClient]:
    client = KafkaAdminClient(
        bootstrap_servers=secure.broker.bootstrap,
        request_timeout_ms=30_000,
        client_id="tests-secure-admin",
    )
    yield client
    client.close()


@pytest.fixture
def secure_topics(secure: SecureBroker, private_admin: KafkaAdminClient) -> Topics:
    """Fresh topics on the private broker; ``bootstrap`` is its PLAINTEXT listener."""
    return replace(create_topics(private_admin), bootstrap=secure.broker.bootstrap)


def sasl_settings(secure: SecureBroker, password: str) -> dict[str, str]:
    return {
        "kafka_bootstrap_servers": secure.sasl,
        "kafka_security_protocol": "SASL_PLAINTEXT",
        "kafka_sasl_mechanism": "PLAIN",
        "kafka_sasl_username": USER,
        "kafka_sasl_password": password,
    }


def ssl_settings(secure: SecureBroker, cafile: Path) -> dict[str, str]:
    return {
        "kafka_bootstrap_servers": secure.ssl,
        "kafka_security_protocol": "SSL",
        "kafka_ssl_cafile": str(cafile),
    }


def lines_with(secret: str, text: str) -> list[str]:
    return [line for line in text.splitlines() if secret in line]


def http_gets(service: ServiceProcess) -> dict[str, str]:
    """Every GET endpoint of the running service: path -> response body.

    The paths come from its OpenAPI document (plus ``/metrics``, left out of it, and
    the document itself); required query parameters get plausible values.
    """
    status, body = service.get("/openapi.json")
    assert status == 200, body
    spec = json.loads(body)
    values = {"baseline": "hybrid-v7", "candidate": "hybrid-v8"}
    paths = ["/metrics", "/openapi.json"]
    for path, operations in spec["paths"].items():
        if "get" not in operations or "{" in path:
            continue
        required = {
            p["name"]: values.get(p["name"], "x")
            for p in operations["get"].get("parameters", [])
            if p.get("required") and p["in"] == "query"
        }
        paths.append(path + ("?" + urllib.parse.urlencode(required) if required else ""))
    bodies = {}
    for path in paths:
        status, body = service.get(path)
        assert status == 200, f"GET {path}: {status} {body[:300]!r}"
        bodies[path] = body.decode(errors="replace")
    return bodies


def wait_exit(service: ServiceProcess, timeout_s: float = 150) -> tuple[int, str]:
    """Wait for a service that should give up on its own; its exit code and output."""
    try:
        service.process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the service did not give up: {service.tail()}") from None
    code = service.stop()  # already exited: only closes the log
    return code, service.log_path.read_text(errors="replace")


def test_sasl_plain_run_equals_offline_and_never_shows_the_password(
    secure: SecureBroker, secure_topics: Topics, tmp_path: Path
) -> None:
    events = traffic(seed=171)
    expected = expected_windows(events)
    n_queries = sum(1 for e in events if e.topic == "queries")
    produce(secure_topics, events)

    service = ServiceProcess(
        secure_topics,
        tmp_path / "sasl.log",
        **FAST,
        **sasl_settings(secure, PASSWORD),
        log_level="DEBUG",
    )
    try:
        service.wait_ready()
        wait_all_final(service, n_queries)
        bodies = http_gets(service)
    finally:
        code = service.stop()
    log = service.log_path.read_text(errors="replace")
    assert code == 0, log[-3000:]

    check_windows(secure_topics, expected)
    report_figures("SASL/PLAIN", "none", len(events), secure_topics, expected)
    # the API was read with data in it, and all of it was read
    assert {"/metrics", "/healthz", "/readyz", "/api/v1/windows"} <= set(bodies)
    assert '"retriever":"hybrid-v8"' in bodies["/api/v1/windows"].replace(" ", "")
    for path, body in bodies.items():
        assert not lines_with(PASSWORD, body), f"GET {path} shows the SASL password"
    assert " DEBUG " in log, "the run was meant to log at DEBUG"
    assert not lines_with(PASSWORD, log), f"the log shows the SASL password: {service.log_path}"


def test_tls_run_equals_offline(
    secure: SecureBroker, secure_topics: Topics, tmp_path: Path
) -> None:
    events = traffic(seed=172, hours=0.5)
    expected = expected_windows(events)
    n_queries = sum(1 for e in events if e.topic == "queries")
    produce(secure_topics, events)

    service = ServiceProcess(
        secure_topics,
        tmp_path / "tls.log",
        **FAST,
        **ssl_settings(secure, secure.ca_pem),
        log_level="DEBUG",
    )
    try:
        service.wait_ready()
        wait_all_final(service, n_queries)
    finally:
        code = service.stop()
    assert code == 0, service.tail()
    check_windows(secure_topics, expected)
    report_figures("TLS", "none", len(events), secure_topics, expected)


def test_wrong_password_and_wrong_ca_fail_clearly_without_echoing_secrets(
    secure: SecureBroker, secure_topics: Topics, tmp_path: Path
) -> None:
    wrong_password = f"wr0ng-{uuid.uuid4()}"
    _, other_ca = self_signed(tmp_path, "other", uuid.uuid4().hex)
    rejected_before = len(secure.failed_logins("sasl"))
    # both at once: each waits out the client's bootstrap timeout before giving up
    bad_password = ServiceProcess(
        secure_topics,
        tmp_path / "wrong-password.log",
        **FAST,
        **sasl_settings(secure, wrong_password),
        log_level="DEBUG",
    )
    bad_ca = ServiceProcess(
        secure_topics,
        tmp_path / "wrong-ca.log",
        **FAST,
        **ssl_settings(secure, other_ca),
        log_level="DEBUG",
    )
    code, output = wait_exit(bad_password)
    last = output.strip().splitlines()[-1]
    assert code == 2, output[-3000:]  # a configuration error
    assert "Traceback" not in output, output[-3000:]
    # The error names the settings to check. (It does not say "authentication failed":
    # kafka-python retries the bootstrap until its timeout and reports only that; its
    # log lines show the broker's "Authentication failed" only when that response
    # arrives before the broker closes the socket, so they are not asserted.)
    assert last.startswith("retrieval-monitor run: error:"), output[-3000:]
    assert "--kafka-sasl-*" in last, last
    assert not lines_with(wrong_password, output), "the error output shows the wrong password"
    assert not lines_with(PASSWORD, output)
    # it did reach the broker, which refused the password (not a network problem)
    rejected = secure.failed_logins("sasl")[rejected_before:]
    assert any("Invalid username or password" in line for line in rejected), rejected

    code, output = wait_exit(bad_ca)
    last = output.strip().splitlines()[-1]
    assert code == 2, output[-3000:]  # a configuration error
    assert "Traceback" not in output, output[-3000:]
    assert last.startswith("retrieval-monitor run: error:"), output[-3000:]
    assert "--kafka-security-*" in last, last
    assert "CERTIFICATE_VERIFY_FAILED" in output, output[-3000:]
