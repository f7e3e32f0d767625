"""``retrieval-monitor demo``: the whole pipeline and HTTP server on simulated traffic, no Kafka."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from service.times import HOUR_MS, parse_aware_ms, wall_ms
from tests.integration.kafka_helpers import BOUND_S, STALL_S, free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HOURS, DEPLOY_AT, ROLLBACK_AT = 6, 2, 4
"""The simulated span, the bad deploy of hybrid-v8 and its rollback, in hours."""
LABEL_AGE_MS = 5 * 60_000
"""The detector compares windows at this label age: a boundary's decisions are stamped
this much event time after it (``REGRESSION_LABEL_AGE``)."""


def _get(port: int, path: str) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
        return bytes(response.read())


def _regressions(port: int, state: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(_get(port, f"/api/v1/regressions?state={state}"))
    return body


def _ms(text: str) -> int:
    ms = parse_aware_ms(text)
    if ms is None:
        raise ValueError(f"not an RFC 3339 time: {text!r}")
    return ms


def _rolling(port: int) -> dict[str, dict[str, float]]:
    body = json.loads(_get(port, "/api/v1/rolling?window=24h"))
    out: dict[str, dict[str, float]] = {}
    for row in body["slices"]:
        merged = out.setdefault(row["retriever"], {"n": 0, "mrr": 0.0})
        mrr = row["metrics"]["mrr"]
        merged["n"] += mrr["n"]
        merged["mrr"] += mrr["mean"] * mrr["n"]
    return {r: {"n": v["n"], "mrr": v["mrr"] / v["n"]} for r, v in out.items() if v["n"]}


Key = tuple[str, str, str, str]
"""A regression: segment, metric, baseline, opened_at."""


def _key(row: dict[str, Any]) -> Key:
    return (row["segment"], row["metric"], row["baseline"], row["opened_at"])


def _watch(process: subprocess.Popen[bytes], port: int, rollback_ms: int) -> dict[Key, str]:
    """Follow the regressions while the demo's boundaries move (slower on a busy machine),
    not for a fixed time: at most STALL_S with none new, BOUND_S in all. Until hybrid-v8
    has served nothing for an hour after the rollback, each of its regressions is open;
    return those seen open at a boundary before the rollback, and at which."""
    started = moved_at = time.monotonic()
    through: str | None = None
    open_before_rollback: dict[Key, str] = {}
    while time.monotonic() - moved_at < STALL_S and time.monotonic() - started < BOUND_S:
        if process.poll() is not None:
            break
        time.sleep(0.25)
        try:
            body = _regressions(port, "all")
        except (OSError, http.client.HTTPException):  # (the demo ending mid-answer)
            continue
        if body["evaluated_through"] is None:
            continue
        if body["evaluated_through"] != through:
            moved_at, through = time.monotonic(), body["evaluated_through"]
        through_ms = _ms(body["evaluated_through"])
        v8 = [r for r in body["regressions"] if r["retriever"] == "hybrid-v8"]
        if through_ms < rollback_ms + HOUR_MS:
            assert all(r["state"] == "open" and r["closed_at"] is None for r in v8), body
            if through_ms < rollback_ms:
                for row in v8:
                    open_before_rollback.setdefault(_key(row), body["evaluated_through"])
        elif v8 and all(r["state"] == "closed" for r in v8):
            break
        elif through_ms >= rollback_ms + HOUR_MS + HOUR_MS // 2:
            break  # it should have closed at the first boundary an hour after the rollback
    at = time.monotonic()
    waited = f"{at - started:.0f} s, the last new boundary {at - moved_at:.0f} s before"
    assert process.poll() is None, f"the demo exited ({waited})"
    assert open_before_rollback, f"no hybrid-v8 regression open before the rollback ({waited})"
    return open_before_rollback


def _check_closed(port: int, rollback_ms: int, open_before_rollback: dict[Key, str]) -> None:
    """Nothing open; every regression seen open before the rollback closed by it."""
    assert not _regressions(port, "open")["regressions"]
    closed = [
        r for r in _regressions(port, "closed")["regressions"] if r["retriever"] == "hybrid-v8"
    ]
    assert set(open_before_rollback) <= {_key(r) for r in closed}, (open_before_rollback, closed)
    assert {r["closed_reason"] for r in closed} == {"rolled_back"}, closed
    for row in closed:
        assert row["state"] == "closed", row
        assert _ms(row["opened_at"]) < _ms(row["closed_at"]), row
        # the first boundary an hour clear of hybrid-v8's last window, at the label age
        assert _ms(row["closed_at"]) >= rollback_ms + HOUR_MS + LABEL_AGE_MS, row
    flags, closed_series = [], []
    for family in text_string_to_metric_families(_get(port, "/metrics").decode()):
        for sample in family.samples:
            if sample.labels.get("retriever") != "hybrid-v8":
                continue
            if sample.name == "retrieval_regression":
                flags.append(sample)
            elif sample.name == "retrieval_regression_closed_timestamp_seconds":
                closed_series.append(sample)
    assert not [s for s in flags if s.value != 0.0], flags
    assert {s.labels["reason"] for s in closed_series} == {"rolled_back"}, closed_series
    # one series per regression closed, at the event time it closed
    assert {(*_key(r)[:3], _ms(r["closed_at"]) / 1000) for r in closed} == {
        (s.labels["segment"], s.labels["metric"], s.labels["baseline"], s.value)
        for s in closed_series
    }


def test_demo_shows_a_regressions_whole_life_and_stops_cleanly_on_sigint() -> None:
    """The bad deploy opens a regression that stays open until the rollback has lasted
    ``REGRESSION_CANDIDATE`` (1 h), then closes as rolled_back; the API, ``/metrics`` and
    the final table say so."""
    port = free_port()
    # the demo's event time starts at its launch minus --hours, on a whole minute: the
    # rollback happens at or after this (to the minute)
    start_ms = wall_ms() - HOURS * HOUR_MS
    rollback_ms = start_ms - start_ms % 60_000 + ROLLBACK_AT * HOUR_MS
    process = subprocess.Popen(
        [sys.executable, "-m", "service", "demo", "--hours", f"{HOURS}h",
         "--deploy-at", f"{DEPLOY_AT}h", "--rollback-at", f"{ROLLBACK_AT}h",
         "--speed", "1200", "--http-port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "COLUMNS": "200"},  # the final table's rows on one line each
    )  # fmt: skip
    try:
        open_before_rollback = _watch(process, port, rollback_ms)
        _check_closed(port, rollback_ms, open_before_rollback)
        seen = _rolling(port)
        assert {"hybrid-v7", "hybrid-v8"} <= set(seen), seen
        # the deploy ranks relevant chunks lower: MRR drops well beyond its noise
        assert seen["hybrid-v8"]["mrr"] < seen["hybrid-v7"]["mrr"] - 0.08, seen
        metrics = _get(port, "/metrics").decode()
        assert 'retrieval_reciprocal_rank_count{retriever="hybrid-v8"' in metrics
        assert 'retrieval_retriever_first_seen_timestamp_seconds{retriever="hybrid-v8"}' in metrics
        assert json.loads(_get(port, "/readyz"))["ready"] is True
    finally:
        process.send_signal(signal.SIGINT)
        output, _ = process.communicate(timeout=30)
    assert process.returncode == 0, output.decode(errors="replace")[-2000:]
    text = output.decode(errors="replace")
    assert f"http://127.0.0.1:{port}/metrics" in text
    assert f"http://127.0.0.1:{port}/api/v1/rolling" in text
    # the final table (printed last) lists hybrid-v8's regressions as closed by the rollback
    final = text[text.rindex("regressions (event time") :].splitlines()
    rows = [line for line in final if "hybrid-v8/" in line]
    assert any("hybrid-v8/* " in line for line in rows), "\n".join(final)
    assert all("closed" in line and "rolled_back" in line for line in rows), "\n".join(final)
