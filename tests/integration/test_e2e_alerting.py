"""End to end with the real parts: Kafka -> service -> Prometheus -> Alertmanager -> webhook.

Two stacks run side by side, each with its own topics, service, Prometheus (the repo's
config and rules) and Alertmanager (the repo's routes):

* **bad deploy**: five simulated hours ending now; half way ``hybrid-v8`` replaces
  ``hybrid-v7`` and ranks relevant chunks lower and finds fewer. The regression alert
  must reach ``firing`` in Prometheus and be delivered to the webhook.
* **control**: the same traffic with a deploy that is no worse. No regression alert,
  neither pending nor firing, and nothing delivered; the detector did test it.

Then every panel and annotation query of ``dashboards/*.json`` runs against the bad
stack's Prometheus and must return data, and every metric name they use must be on
``/metrics`` or be one of the repo's recording rules.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from kafka.admin import KafkaAdminClient

from service.commands.demo import DEMO_JUDGE
from service.sim.audit import JudgeModel
from service.sim.simulator import generate
from service.stream.audit_join import AuditConfig
from service.times import rfc3339
from tests.integration.conftest import create_topics, delete_topics
from tests.integration.kafka_helpers import ServiceProcess, Topics, deploy_traffic, produce
from tests.integration.monitoring_helpers import (
    ROOT,
    Alertmanager,
    Prometheus,
    Webhook,
    wait_for,
)

ALERT = "RetrievalQualityRegression"
DASHBOARDS = sorted((ROOT / "dashboards").glob("*.json"))
RECORDING_RULES = ROOT / "deploy" / "prometheus" / "rules" / "recording.yml"
VARIABLES = {
    "$__rate_interval": "1h",
    "${retriever}": ".*",
    "$retriever": ".*",
    "${segment}": ".*",
    "$segment": ".*",
    "${window}": "1h",
    "$window": "1h",
    "${k}": "5",
    "$k": "5",
}


@dataclass
class Stack:
    switch_ms: int
    topics: Topics
    replicas: list[ServiceProcess]
    webhook: Webhook
    alertmanager: Alertmanager
    prometheus: Prometheus

    @property
    def service(self) -> ServiceProcess:
        return self.replicas[0]


def start_stack(
    admin: KafkaAdminClient, tmp: Path, name: str, bad: bool, replicas: int = 1
) -> Stack:
    topics = create_topics(admin)
    # with the audits of the service's audit sample (a careful judge, 20 minutes after each
    # query, none in the future), so the dashboards' audited-estimate queries have data
    judge = JudgeModel(DEMO_JUDGE, delay_ms=(20 * 60_000, 20 * 60_000))
    sim = replace(deploy_traffic(bad, seed=11), audit_rate=AuditConfig().rate, judges=(judge,))
    produce(topics, (e for e in generate(sim) if e.timestamp_ms <= sim.end_ms))
    # the previous version has no day of history, so the deploy is compared through its
    # trend before the switch, by default for 6 h: longer than the traffic's 2.5 h after it
    services = [
        ServiceProcess(topics, tmp / f"{name}-service-{i}.log", transactional_id=f"{name}-{i}")
        for i in range(replicas)
    ]
    webhook = Webhook()
    alertmanager = Alertmanager(tmp / f"{name}-alertmanager", webhook.url)
    ports = [s.port for s in services]
    prometheus = Prometheus(tmp / f"{name}-prometheus", ports, alertmanager.port)
    return Stack(sim.switch_at_ms or 0, topics, services, webhook, alertmanager, prometheus)


@pytest.fixture
def stacks(admin: KafkaAdminClient, tmp_path: Path) -> Iterator[tuple[Stack, Stack]]:
    bad = start_stack(admin, tmp_path, "bad", bad=True, replicas=2)
    control = start_stack(admin, tmp_path, "control", bad=False)
    yield bad, control
    for stack in (bad, control):
        stack.webhook.close()
        delete_topics(admin, stack.topics)


def _detector_ran(stack: Stack) -> bool:
    """The detector has tested 90 minutes of the new version (the backlog is consumed)."""
    status, body = stack.service.get("/api/v1/regressions")
    through = json.loads(body)["evaluated_through"] if status == 200 else None
    return through is not None and through >= rfc3339(stack.switch_ms + 90 * 60_000)


def _regression_series(stack: Stack) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        labels: value
        for (name, labels), value in stack.service.samples().items()
        if name == "retrieval_regression"
    }


@pytest.mark.slow
def test_a_bad_deploy_pages_on_call_and_a_good_one_does_not(stacks: tuple[Stack, Stack]) -> None:
    bad, control = stacks  # the bad deploy on two replicas, the control on one
    for stack in stacks:
        for replica in stack.replicas:
            replica.wait_ready()
    for stack in stacks:
        stack.service.wait_progressing(
            lambda s=stack: _detector_ran(s),
            "the detector to run",
            [r for r in stack.replicas if r is not stack.service],
        )

    # the service opened the regression, against the previous version
    status, body = bad.service.get("/api/v1/regressions")
    open_now = json.loads(body)["regressions"]
    assert status == 200
    assert open_now, bad.service.tail()
    assert {r["retriever"] for r in open_now} == {"hybrid-v8"}
    assert "hybrid-v7" in {r["baseline"] for r in open_now}
    assert all(r["delta"] < -0.02 for r in open_now)
    assert any(r["p_value"] < 0.005 for r in open_now)

    # Prometheus: pending, then firing after the rule's `for`
    firing = wait_for(
        f"{ALERT} to fire in Prometheus",
        lambda: bad.prometheus.alerts(ALERT, "firing"),
        timeout_s=420,
        every_s=5,
    )
    labels = firing[0]["labels"]
    # two replicas export the same regression series: each alert fires once, with the
    # labels of the regression and none of a replica
    label_sets = [tuple(sorted(a["labels"].items())) for a in firing]
    assert len(set(label_sets)) == len(label_sets), firing
    assert all("instance" not in a["labels"] for a in firing)
    open_keys = {(r["retriever"], r["segment"], r["metric"], r["baseline"]) for r in open_now}
    fired_keys = {
        (
            a["labels"]["retriever"],
            a["labels"]["segment"],
            a["labels"]["metric"],
            a["labels"]["baseline"],
        )
        for a in firing
    }
    assert fired_keys <= open_keys
    assert labels["retriever"] == "hybrid-v8"
    assert labels["severity"] == "page"
    assert firing[0]["annotations"]["runbook_url"].endswith("#retrievalqualityregression")

    # Alertmanager delivered it to the webhook receiver
    delivered = wait_for(
        "the webhook to receive the alert",
        lambda: [a for a in bad.webhook.alerts() if a["labels"]["alertname"] == ALERT],
        timeout_s=120,
    )
    assert delivered[0]["labels"]["retriever"] == "hybrid-v8"

    def same_series() -> bool:  # read twice: the boundary may move between the reads
        theirs = {
            labels: value
            for (name, labels), value in bad.replicas[1].samples().items()
            if name == "retrieval_regression"
        }
        return _regression_series(bad) == theirs != {}

    wait_for("both replicas to export the same regression series", same_series, 60)

    # the control stack ran as long, was tested, and stayed silent
    control_series = _regression_series(control)
    assert control_series, "the control's deploy was never compared"
    assert set(control_series.values()) == {0.0}
    assert control.prometheus.alerts(ALERT) == []
    assert [a for a in control.webhook.alerts() if a["labels"]["alertname"] == ALERT] == []
    assert json.loads(control.service.get("/api/v1/regressions")[1])["regressions"] == []
    compare = json.loads(
        control.service.get("/api/v1/compare?baseline=hybrid-v7&candidate=hybrid-v8&window=24h")[1]
    )
    verdicts = {m["metric"]: m["verdict"] for m in compare["metrics"]}
    assert "regression" not in verdicts.values(), compare
    compare_bad = json.loads(
        bad.service.get("/api/v1/compare?baseline=hybrid-v7&candidate=hybrid-v8&window=24h")[1]
    )
    assert {m["metric"]: m["verdict"] for m in compare_bad["metrics"]}["mrr"] == "regression"

    check_dashboards(bad)


# -- dashboards ----------------------------------------------------------------------------


def _panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])  # collapsed rows


def dashboard_queries() -> list[tuple[str, str, str]]:
    """(dashboard, panel or annotation title, expression) of every query."""
    out = []
    for path in DASHBOARDS:
        dashboard = json.loads(path.read_text())
        for panel in _panels(dashboard):
            for target in panel.get("targets", []):
                if target.get("expr"):
                    out.append((path.name, panel.get("title", "?"), target["expr"]))
        for annotation in dashboard.get("annotations", {}).get("list", []):
            if annotation.get("expr"):
                out.append((path.name, f"annotation {annotation['name']}", annotation["expr"]))
    return out


def substitute(expr: str) -> str:
    for variable in sorted(VARIABLES, key=len, reverse=True):
        expr = expr.replace(variable, VARIABLES[variable])
    if "$" in expr:
        raise AssertionError(f"unknown Grafana variable in {expr!r}")
    return expr


def exported_names(stack: Stack) -> set[str]:
    """Sample names /metrics can carry, from its # TYPE lines (also for empty families)."""
    status, body = stack.service.get("/metrics")
    assert status == 200
    names = set()
    suffixes = {"counter": ("_total",), "summary": ("_sum", "_count"), "gauge": ("",)}
    for line in body.decode().splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split()
            names |= {family + s for s in suffixes.get(kind, ("",))}
            names.add(family)
    return names


def check_dashboards(stack: Stack) -> None:
    queries = dashboard_queries()
    assert len(DASHBOARDS) >= 2
    assert len(queries) >= 15, queries
    rules = yaml.safe_load(RECORDING_RULES.read_text())
    recorded = {r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r}
    known = exported_names(stack) | recorded | {"up"}
    used = set()
    for _, _, expr in queries:
        used |= set(re.findall(r"\b(retrieval[_:][a-zA-Z0-9_:]+)", expr))
    assert used - known == set(), f"dashboard metric names not exported: {used - known}"
    # A rate needs a counter to grow between two scrapes. If the backlog was consumed
    # before the first scrape, that happens when the next window closes (windows keep
    # closing for 30 minutes of wall clock after the last event): at most one window
    # length, 5 minutes, plus a rule evaluation.
    wait_for(
        "recording rules to have data",
        lambda: stack.prometheus.query("retrieval:hit_rate:ratio_rate1h"),
        timeout_s=420,
        every_s=5,
    )
    empty = []
    for dashboard, title, expr in queries:
        result = stack.prometheus.query(substitute(expr))
        values = [float(r["value"][1]) for r in result]
        if not any(math.isfinite(v) for v in values):
            empty.append(f"{dashboard} / {title}: {expr} -> {result}")
    assert empty == [], "panels without data:\n" + "\n".join(empty)
