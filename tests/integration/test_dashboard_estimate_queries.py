"""The headline panels' audited-estimate queries, evaluated by promtool on series as the
service exports them (two replicas scraped, each with the same global values): all
segments selected gives the retriever's pooled estimate (segment ``*``), one segment
that segment's, another subset none (estimates do not pool from per-segment values),
and no estimate series gives no data, never a zero."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
QUALITY = REPO / "dashboards" / "retrieval-quality.json"
INSTALL = "bash deploy/local/monitoring.sh install"
SEGMENTS = {"docs": (0.70, 100), "billing": (0.50, 50), "kb": (0.40, 10)}
"""segment -> (its estimate, its labelled queries)."""
POOLED = 0.60


def _panel_targets() -> dict[str, str]:
    """Legend -> expression of the recall@k time series panel (live vs audited)."""
    dashboard = json.loads(QUALITY.read_text())
    for panel in dashboard["panels"]:
        targets = {t["legendFormat"]: t["expr"] for t in panel.get("targets", [])}
        if panel["type"] == "timeseries" and 'metric="recall@$k"' in "".join(targets.values()):
            return targets
    raise AssertionError("no recall@k live vs audited panel")


def _substitute(expr: str, segment: str) -> str:
    for variable, value in (
        ("$retriever", ".*"),
        ("$segment", segment),
        ("$window", "1h"),
        ("$k", "5"),
    ):
        expr = expr.replace(variable, value)
    assert "$" not in expr, expr
    return expr


def _series() -> list[dict[str, str]]:
    out = []
    for instance in ("replica-0", "replica-1"):
        base = f'retriever="v7",window="1h",instance="{instance}"'
        for name, scale in (
            ("retrieval_estimate", 1.0),
            ("retrieval_estimate_ci_low", 0.9),
            ("retrieval_estimate_ci_high", 1.1),
        ):
            for segment, value in (*((s, v) for s, (v, _) in SEGMENTS.items()), ("*", POOLED)):
                labels = f'{base},segment="{segment}",metric="recall@5"'
                out.append({"series": f"{name}{{{labels}}}", "values": f"{value * scale}x10"})
        for segment, (_, labelled) in SEGMENTS.items():
            out.append(
                {
                    "series": f'retrieval_rolling_labelled_queries{{{base},segment="{segment}"}}',
                    "values": f"{labelled}x10",
                }
            )
            out.append(
                {
                    "series": f'retrieval_rolling_recall{{{base},segment="{segment}",k="5"}}',
                    "values": "0.8x10",
                }
            )
    return out


@pytest.mark.integration
def test_the_estimate_queries_pick_the_selected_segments(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail(f"promtool is not on PATH: run `{INSTALL}` (as root)")
    targets = _panel_targets()
    cases: list[dict[str, Any]] = []
    selections = {
        ".*": POOLED,  # All
        "(docs|billing|kb)": POOLED,  # every segment, chosen one by one
        "docs": SEGMENTS["docs"][0],
        "(docs|billing)": None,  # a subset: no pooled estimate
        "nowhere": None,
    }
    for legend, scale in (
        ("audited estimate (95% band)", 1.0),
        ("audited estimate: 95% band low", 0.9),
        ("audited estimate: 95% band high", 1.1),
    ):
        for segment, value in selections.items():
            expected = (
                [] if value is None else [{"labels": '{retriever="v7"}', "value": value * scale}]
            )
            cases.append(
                {
                    "expr": _substitute(targets[legend], segment),
                    "eval_time": "5m",
                    "exp_samples": expected,
                }
            )
    # the live value beside it: pooled over the selected segments, counted once
    cases.append(
        {
            "expr": _substitute(targets["live labels"], ".*"),
            "eval_time": "5m",
            "exp_samples": [{"labels": '{retriever="v7"}', "value": 0.8}],
        }
    )
    # no estimate series at all: no data, not zero
    empty_series = [s for s in _series() if not s["series"].startswith("retrieval_estimate")]
    spec = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {"interval": "1m", "input_series": _series(), "promql_expr_test": cases},
            {
                "interval": "1m",
                "input_series": empty_series,
                "promql_expr_test": [
                    {
                        "expr": _substitute(targets["audited estimate (95% band)"], ".*"),
                        "eval_time": "5m",
                        "exp_samples": [],
                    }
                ],
            },
        ],
    }
    path = tmp_path / "estimate_queries.yml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    result = subprocess.run(
        [promtool, "test", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
