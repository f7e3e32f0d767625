"""``retrieval-monitor demo``: the whole pipeline and HTTP server on simulated traffic, no Kafka."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.integration.kafka_helpers import BOUND_S, STALL_S, free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _get(port: int, path: str) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
        return bytes(response.read())


def _rolling(port: int) -> dict[str, dict[str, float]]:
    body = json.loads(_get(port, "/api/v1/rolling?window=24h"))
    out: dict[str, dict[str, float]] = {}
    for row in body["slices"]:
        merged = out.setdefault(row["retriever"], {"n": 0, "mrr": 0.0})
        mrr = row["metrics"]["mrr"]
        merged["n"] += mrr["n"]
        merged["mrr"] += mrr["mean"] * mrr["n"]
    return {r: {"n": v["n"], "mrr": v["mrr"] / v["n"]} for r, v in out.items() if v["n"]}


def test_demo_shows_the_bad_deploy_and_stops_cleanly_on_sigint() -> None:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "service", "demo", "--hours", "3h", "--deploy-at", "2h",
         "--speed", "2000", "--http-port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        # while the demo's queries come in (slower on a busy machine), not for a fixed
        # time: at most STALL_S with none new, BOUND_S in all
        started = moved_at = time.monotonic()
        seen: dict[str, dict[str, float]] = {}
        most = 0.0
        while time.monotonic() - moved_at < STALL_S and time.monotonic() - started < BOUND_S:
            time.sleep(0.5)
            try:
                seen = _rolling(port)
            except OSError:
                continue
            if {"hybrid-v7", "hybrid-v8"} <= set(seen) and seen["hybrid-v8"]["n"] >= 300:
                break
            if sum(v["n"] for v in seen.values()) > most:
                moved_at, most = time.monotonic(), sum(v["n"] for v in seen.values())
        at = time.monotonic()
        waited = f"{at - started:.0f} s, the last new query {at - moved_at:.0f} s before"
        assert {"hybrid-v7", "hybrid-v8"} <= set(seen), (seen, waited)
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
