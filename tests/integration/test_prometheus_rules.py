"""The Prometheus and Alertmanager configuration in ``deploy/``.

promtool and amtool check the configs and rule files and run the rule unit tests in
``deploy/prometheus/tests/``. They come from ``bash deploy/local/monitoring.sh install``;
a test here fails, never skips, when they are missing. The other tests read the YAML
only: every alert follows the conventions on-call relies on (severity, a runbook
section that exists, a summary, a dashboard) and has a promtool test where it fires.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
PROMETHEUS_DIR = REPO / "deploy" / "prometheus"
PROMETHEUS_CONFIG = PROMETHEUS_DIR / "prometheus.yml"
RECORDING_RULES = PROMETHEUS_DIR / "rules" / "recording.yml"
ALERT_RULES = PROMETHEUS_DIR / "rules" / "alerts.yml"
ALERTMANAGER_CONFIG = REPO / "deploy" / "alertmanager" / "alertmanager.yml"
RUNBOOK = REPO / "docs" / "runbook.md"
RUNBOOK_URL = "https://github.com/retrieval-monitor/retrieval-monitor/blob/main/docs/runbook.md"
INSTALL = "bash deploy/local/monitoring.sh install"

# Names other tools and dashboards rely on: renaming one is a breaking change.
ALERTS = {
    "RetrievalQualityRegression",
    "RetrievalLabelShift",
    "RetrievalQualityBelowFloor",
    "RetrievalLabelsStopped",
    "RetrievalJoinRateCollapse",
    "RetrievalInvalidEvents",
    "RetrievalConsumerLagHigh",
    "RetrievalWatermarkStalled",
    "RetrievalGlobalViewBehind",
    "RetrievalMonitorDown",
    "RetrievalMonitorAbsent",
}
RECORDING_RULE_NAMES = {
    *(
        f"retrieval:{metric}:ratio_rate{window}"
        for metric in ("hit_rate", "recall", "mrr")
        for window in ("15m", "1h", "24h")
    ),
    "retrieval:ndcg:ratio_rate1h",
    "retrieval:unlabelled:ratio_rate1h",
    "retrieval:labelled_queries:rate1h",
    "retrieval:slo:hit_rate_floor",
}
# Only these select the scrape job by name; every other rule works under any job name.
JOB_ALERTS = {"RetrievalMonitorDown", "RetrievalMonitorAbsent"}


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _rules(path: Path) -> list[dict[str, Any]]:
    return [rule for group in _yaml(path)["groups"] for rule in group["rules"]]


def _alerts() -> list[dict[str, Any]]:
    return [rule for rule in _rules(ALERT_RULES) if "alert" in rule]


def _test_files() -> list[Path]:
    return sorted((PROMETHEUS_DIR / "tests").glob("*.yml"))


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"{name} is not on PATH: run `{INSTALL}` (as root; it installs the Debian "
            "packages prometheus and prometheus-alertmanager)"
        )
    return path


def _run(tool: str, *args: str | Path) -> None:
    command = [_tool(tool), *(str(arg) for arg in args)]
    result = subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, timeout=300, check=False
    )
    shown = " ".join([tool, *(str(arg) for arg in args)])
    assert result.returncode == 0, (
        f"`{shown}` exited with {result.returncode}:\n{result.stdout}{result.stderr}"
    )


# -- promtool and amtool ----------------------------------------------------------------


@pytest.mark.integration
def test_prometheus_config_is_valid() -> None:
    _run("promtool", "check", "config", PROMETHEUS_CONFIG)


@pytest.mark.integration
def test_rule_files_are_valid() -> None:
    _run("promtool", "check", "rules", *sorted((PROMETHEUS_DIR / "rules").glob("*.yml")))


@pytest.mark.slow
@pytest.mark.integration
def test_rule_unit_tests_pass() -> None:
    assert _test_files(), "no promtool test files in deploy/prometheus/tests/"
    _run("promtool", "test", "rules", *_test_files())


@pytest.mark.integration
def test_alertmanager_config_is_valid() -> None:
    _run("amtool", "check-config", ALERTMANAGER_CONFIG)


# -- conventions (YAML only) ------------------------------------------------------------


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lowercase, punctuation dropped
    (letters, digits, ``_`` and ``-`` stay), each space turned into ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def markdown_anchors(text: str) -> set[str]:
    """Anchors of every ATX heading outside fenced code; repeats get ``-1``, ``-2``..."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    fence: str | None = None
    for line in text.splitlines():
        marker = re.match(r"^\s*(`{3,}|~{3,})", line)
        if marker:
            if fence is None:
                fence = marker.group(1)[0]
            elif marker.group(1)[0] == fence:
                fence = None
            continue
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if fence is None and heading:
            anchor = github_anchor(heading.group(1))
            count = seen.get(anchor, 0)
            seen[anchor] = count + 1
            anchors.add(anchor if count == 0 else f"{anchor}-{count}")
    return anchors


def test_github_anchor() -> None:
    assert github_anchor("RetrievalQualityRegression") == "retrievalqualityregression"
    assert github_anchor("How the detector decides (Welch, Holm)") == (
        "how-the-detector-decides-welch-holm"
    )
    assert markdown_anchors("# A\n```\n# not a heading\n```\n## A\n") == {"a", "a-1"}


def test_alert_and_recording_rule_names() -> None:
    assert {rule["alert"] for rule in _alerts()} == ALERTS
    assert {rule["record"] for rule in _rules(RECORDING_RULES) if "record" in rule} == (
        RECORDING_RULE_NAMES
    )


@pytest.mark.parametrize("alert", sorted(ALERTS))
def test_alert_follows_the_conventions(alert: str) -> None:
    rules = [rule for rule in _alerts() if rule["alert"] == alert]
    assert len(rules) == 1, f"{alert} is defined {len(rules)} times in {ALERT_RULES}"
    rule = rules[0]
    assert rule.get("for"), f"{alert} has no `for:`"
    assert rule.get("labels", {}).get("severity") in {"page", "ticket"}, (
        f"{alert}: labels.severity must be page or ticket, got {rule.get('labels')}"
    )
    annotations = rule.get("annotations", {})
    for key in ("summary", "description", "dashboard"):
        assert str(annotations.get(key, "")).strip(), f"{alert} has no annotations.{key}"
    url = annotations.get("runbook_url", "")
    assert url.startswith(f"{RUNBOOK_URL}#"), (
        f"{alert}: runbook_url must be {RUNBOOK_URL}#<anchor>, got {url!r}"
    )
    anchor = url.split("#", 1)[1]
    assert RUNBOOK.is_file(), f"{RUNBOOK} is missing"
    anchors = markdown_anchors(RUNBOOK.read_text(encoding="utf-8"))
    assert anchor in anchors, (
        f"{alert}: runbook_url anchor #{anchor} is no heading of docs/runbook.md "
        f"(it has: {', '.join(sorted(anchors))})"
    )
    if alert not in JOB_ALERTS:
        assert not re.search(r"\bjob\s*(=|!=|=~|!~)", rule["expr"]), (
            f"{alert} selects the scrape job by name; the rules must work under any job name"
        )


def test_every_alert_fires_in_a_promtool_test() -> None:
    """Each alert has a promtool test case in which it is expected to fire."""
    fired: set[str] = set()
    for path in _test_files():
        for case in _yaml(path).get("tests", []):
            for check in case.get("alert_rule_test", []):
                if check.get("exp_alerts"):
                    fired.add(check["alertname"])
    missing = ALERTS - fired
    assert not missing, f"no promtool test in deploy/prometheus/tests/ fires {sorted(missing)}"


def test_prometheus_config_shape() -> None:
    """One scrape job, ``retrieval-monitor``, with one static target list, and one
    Alertmanager: the shape that integration tests rewrite to their own addresses."""
    config = _yaml(PROMETHEUS_CONFIG)
    jobs = config["scrape_configs"]
    assert [job["job_name"] for job in jobs] == ["retrieval-monitor"]
    assert jobs[0]["static_configs"] == [{"targets": ["127.0.0.1:8000"]}]
    alertmanagers = config["alerting"]["alertmanagers"]
    assert [am["static_configs"] for am in alertmanagers] == [[{"targets": ["127.0.0.1:9093"]}]]
    assert config["rule_files"] == ["rules/*.yml"]


def test_alertmanager_routes_and_inhibitions() -> None:
    config = _yaml(ALERTMANAGER_CONFIG)
    receivers = {receiver["name"]: receiver for receiver in config["receivers"]}
    routes = {tuple(route["matchers"]): route["receiver"] for route in config["route"]["routes"]}
    assert routes == {('severity="page"',): "oncall-pager", ('severity="ticket"',): "team-tickets"}
    for name in routes.values():
        assert [hook["url"] for hook in receivers[name]["webhook_configs"]] == [
            "http://127.0.0.1:5001/alerts"
        ]
    inhibited_by = {
        source
        for rule in config["inhibit_rules"]
        if rule["target_matchers"] == ['alertname="RetrievalQualityRegression"']
        for matcher in rule["source_matchers"]
        for source in re.findall(r"Retrieval\w+", matcher)
    }
    assert {"RetrievalMonitorDown", "RetrievalLabelsStopped"} <= inhibited_by
