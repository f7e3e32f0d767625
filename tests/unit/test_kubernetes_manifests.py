"""deploy/kubernetes: the manifests agree with the service they run.

No cluster here (and no kubectl): these checks read the manifests and hold them against
the code, so a renamed setting, route or port breaks a test instead of a rollout.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.broker import waits
from service.broker.transport import TRANSACTION_WAIT_MS
from service.commands.cli import build_parser
from service.config import ENV_PREFIX, SETTINGS, Settings
from service.core.monitor import Monitor, MonitorConfig
from service.core.state import ServiceState
from service.http.app import create_app
from service.times import parse_duration_ms

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "kubernetes"


def _load(name: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((K8S / name).read_text()) if doc]


@pytest.fixture(scope="module")
def kinds() -> dict[str, list[dict[str, Any]]]:
    kustomization = _load("kustomization.yaml")[0]
    out: dict[str, list[dict[str, Any]]] = {}
    for name in kustomization["resources"]:
        for doc in _load(name):
            out.setdefault(doc["kind"], []).append(doc)
    return out


def _env(kinds: dict[str, list[dict[str, Any]]]) -> dict[str, str]:
    (config,) = kinds["ConfigMap"]
    (secret,) = kinds["Secret"]
    return {**config["data"], **(secret.get("stringData") or {})}


def _container(kinds: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    (stateful,) = kinds["StatefulSet"]
    (container,) = stateful["spec"]["template"]["spec"]["containers"]
    return dict(container)


def test_every_resource_file_is_listed_and_every_listed_file_exists() -> None:
    listed = set(_load("kustomization.yaml")[0]["resources"])
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk


def test_every_variable_is_a_setting_and_the_values_are_valid(
    kinds: dict[str, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    env = _env(kinds)
    names = {f"{ENV_PREFIX}{name.upper()}" for name in SETTINGS}
    assert set(env) <= names, f"not settings: {sorted(set(env) - names)}"
    # the commented-out examples (SASL, TLS) name settings too
    text = (K8S / "configmap.yaml").read_text() + (K8S / "secret.yaml").read_text()
    mentioned = set(re.findall(rf"{ENV_PREFIX}[A-Z0-9_]+", text))
    assert mentioned <= names, f"not settings: {sorted(mentioned - names)}"
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = Settings()
    assert settings.http_host == "0.0.0.0"  # reachable from the kubelet and Prometheus
    assert settings.exactly_once
    assert settings.transactional_id is None  # derived from the stable pod name


def test_ports_probes_and_selectors_match_the_service(
    kinds: dict[str, list[dict[str, Any]]],
) -> None:
    env = _env(kinds)
    container = _container(kinds)
    (port,) = container["ports"]
    assert port["containerPort"] == int(env[f"{ENV_PREFIX}HTTP_PORT"])
    clock = lambda: 0  # noqa: E731
    app = create_app(ServiceState(Monitor(MonitorConfig(), clock), clock))
    routes = {getattr(route, "path", None) for route in app.routes}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        get = container[probe]["httpGet"]
        assert get["path"] in routes, probe
        assert get["port"] == port["name"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    (stateful,) = kinds["StatefulSet"]
    pod_labels = stateful["spec"]["template"]["metadata"]["labels"]
    selectors = [stateful["spec"]["selector"]["matchLabels"]]
    selectors += [s["spec"]["selector"] for s in kinds["Service"]]
    selectors += [p["spec"]["selector"]["matchLabels"] for p in kinds["PodDisruptionBudget"]]
    for selector in selectors:
        assert selector.items() <= pod_labels.items()
    for service in kinds["Service"]:
        assert [p["targetPort"] for p in service["spec"]["ports"]] == [port["name"]]
    names = {s["metadata"]["name"] for s in kinds["Service"]}
    assert stateful["spec"]["serviceName"] in names
    assert any(s["spec"].get("clusterIP") == "None" for s in kinds["Service"])


def test_the_pod_gets_time_to_hand_over_and_runs_the_run_command(
    kinds: dict[str, list[dict[str, Any]]],
) -> None:
    env = _env(kinds)
    (stateful,) = kinds["StatefulSet"]
    grace_s = stateful["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    shutdown_ms = parse_duration_ms(env[f"{ENV_PREFIX}SHUTDOWN_GRACE"])
    # after SIGTERM: the final publish and commit (one transactional wait at most),
    # then the shutdown grace, all before Kubernetes sends SIGKILL
    assert grace_s * 1000 > shutdown_ms + TRANSACTION_WAIT_MS
    container = _container(kinds)
    assert container["args"] == ["run"]
    build_parser().parse_args(container["args"])  # a command the CLI knows
    dockerfile = (K8S / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["retrieval-monitor"]' in dockerfile
    scripts = re.search(r"\[project.scripts\]\n(\S+) =", (REPO / "pyproject.toml").read_text())
    assert scripts is not None
    assert scripts.group(1) == "retrieval-monitor"
    user = stateful["spec"]["template"]["spec"]["securityContext"]["runAsUser"]
    assert f"USER {user}" in dockerfile


def test_a_broker_outage_does_not_restart_the_pod_but_a_stuck_loop_does(
    kinds: dict[str, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``/healthz`` stays 200 inside every declared broker wait for its bound
    (tests/unit/http/test_health.py), so the probe need only outlast a slow turn of the
    loop outside one; a loop stuck past the longest bound is still restarted soon."""
    for name, value in _env(kinds).items():
        monkeypatch.setenv(name, value)
    settings = Settings()
    probe = _container(kinds)["livenessProbe"]
    tolerance_ms = probe["periodSeconds"] * probe["failureThreshold"] * 1000
    clock = lambda: 0  # noqa: E731
    stale_ms = ServiceState(Monitor(MonitorConfig(), clock), clock).stale_after_ms
    assert tolerance_ms >= stale_ms + 2 * probe["periodSeconds"] * 1000
    longest = waits.longest_wait_ms(settings, partitions=2 * 32)
    # a rebuild that settles hanging offsets with a commit that ends in a new producer
    assert longest == waits.rebuild_limit_ms() > waits.commit_limit_ms()
    assert longest + stale_ms + tolerance_ms <= 15 * 60_000
