"""The Grafana dashboards against the service's own ``/metrics``: every series name a
panel queries is one the service exports (or a recording rule), and the headline panels
show the audited estimate, with its 95% band, beside the live value, each series named
for what it is."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient

from service.core.monitor import Monitor
from service.core.state import ServiceState
from service.http.app import create_app
from tests.unit.audit.audited_replay import NOW_MS, config, replayed, traffic, write_events

ROOT = Path(__file__).resolve().parents[3]
DASHBOARDS = sorted((ROOT / "dashboards").glob("*.json"))
QUALITY = ROOT / "dashboards" / "retrieval-quality.json"
RECORDING_RULES = ROOT / "deploy" / "prometheus" / "rules" / "recording.yml"
LIVE, ESTIMATE = "live labels", "audited estimate (95% band)"
LOW, HIGH = "audited estimate: 95% band low", "audited estimate: 95% band high"


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """Sample names the service's ``/metrics`` can carry (from its TYPE lines, empty
    families too): after a replay with audits (local view), and of a replica of ``run``
    (global view: its own series)."""
    path = tmp_path_factory.mktemp("dashboards") / "events.jsonl"
    write_events(path, traffic(41, hours=1.5))
    local, _ = replayed(path)
    replica = Monitor(config(), lambda: NOW_MS, global_view=True)
    names = set()
    suffixes = {"counter": ("_total",), "summary": ("_sum", "_count"), "gauge": ("",)}
    for monitor in (local, replica):
        client = TestClient(create_app(ServiceState(monitor, lambda: NOW_MS)))
        for line in client.get("/metrics").text.splitlines():
            if line.startswith("# TYPE "):
                _, _, family, kind = line.split()
                names |= {family + s for s in suffixes.get(kind, ("",))}
                names.add(family)
    return names


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))  # (collapsed rows)
    return out


def _names(expr: str) -> set[str]:
    return set(re.findall(r"\b(retrieval[_:][a-zA-Z0-9_:]+)", expr))


def test_every_name_a_panel_queries_is_exported(exported: set[str]) -> None:
    rules = yaml.safe_load(RECORDING_RULES.read_text())
    recorded = {r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r}
    assert {"retrieval_estimate", "retrieval_audited_queries"} <= exported
    used: set[str] = set()
    for path in DASHBOARDS:
        dashboard = json.loads(path.read_text())
        for panel in _panels(dashboard):
            for target in panel.get("targets", []):
                used |= _names(target.get("expr", ""))
        for annotation in dashboard.get("annotations", {}).get("list", []):
            used |= _names(annotation.get("expr", ""))
    assert {"retrieval_estimate_ci_low", "retrieval_estimate_ci_high"} <= used
    assert used - exported - recorded == set()


def test_the_layout_has_unique_ids_and_no_overlap() -> None:
    dashboard = json.loads(QUALITY.read_text())
    panels = _panels(dashboard)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    cells: dict[tuple[int, int], int] = {}
    for p in panels:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, (p["title"], cells[x, y])
                cells[x, y] = p["id"]


@pytest.mark.parametrize(
    ("metric", "live"),
    [
        ('metric="hit_rate@$k"', "retrieval_rolling_hit_rate"),
        ('metric="recall@$k"', "retrieval_rolling_recall"),
        ('metric="mrr"', "retrieval_rolling_mrr"),
    ],
)
def test_the_headline_panels_show_the_estimate_and_its_band_beside_the_live_value(
    metric: str, live: str
) -> None:
    panels = _panels(json.loads(QUALITY.read_text()))

    def by_legend(panel: dict[str, Any]) -> dict[str, str]:
        return {t["legendFormat"]: t["expr"] for t in panel.get("targets", [])}

    # the stat: the live value and the estimate, per retriever
    stats = [
        p for p in panels if p["type"] == "stat" and any(metric in e for e in by_legend(p).values())
    ]
    assert len(stats) == 1
    targets = by_legend(stats[0])
    assert _names(targets["{{retriever}} live labels"]) == {
        live,
        "retrieval_rolling_labelled_queries",
    }
    assert "retrieval_estimate" in _names(targets["{{retriever}} audited estimate"])
    # the time series, one per retriever (a repeated row): live, estimate and its band
    [series] = [
        p
        for p in panels
        if p["type"] == "timeseries" and any(metric in e for e in by_legend(p).values())
    ]
    targets = by_legend(series)
    assert set(targets) == {LIVE, ESTIMATE, LOW, HIGH}
    assert live in _names(targets[LIVE])
    for legend, name in (
        (ESTIMATE, "retrieval_estimate"),
        (LOW, "retrieval_estimate_ci_low"),
        (HIGH, "retrieval_estimate_ci_high"),
    ):
        assert metric in targets[legend]
        estimates = _names(targets[legend]) - {"retrieval_rolling_labelled_queries"}
        assert estimates == {name}, legend
    overrides = {
        o["matcher"]["options"]: {p["id"]: p["value"] for p in o["properties"]}
        for o in series["fieldConfig"]["overrides"]
    }
    assert overrides[HIGH]["custom.fillBelowTo"] == LOW
    assert overrides[HIGH]["custom.fillOpacity"] > 0
    row = next(
        p
        for p in panels
        if p["type"] == "row" and p["gridPos"]["y"] < series["gridPos"]["y"] and p.get("repeat")
    )
    assert row["repeat"] == "retriever"
