"""``GET /api/v1/estimates`` and the ``retrieval_estimate*`` series: the same numbers as
``replay --estimates-out`` (and ``book.estimate_rows``) on the same input, filters that
filter, 422s with a message, and no estimate series where there is no estimate."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from service.audit.book import POOLED, estimate_rows
from service.commands.cli import main
from service.core.state import ServiceState
from service.http.app import create_app
from service.http.estimate_series import exported_metrics
from service.stream.windows import ClosedWindow
from tests.unit.audit.audited_replay import (
    NOW_MS,
    RATE,
    UNAUDITED,
    replayed,
    traffic,
    write_events,
)

FIELDS = ("observed", "estimate", "ci_low", "ci_high", "audited", "queries", "answerable_share")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> tuple[TestClient, list[ClosedWindow], Path]:
    path = tmp_path_factory.mktemp("estimates") / "events.jsonl"
    assert write_events(path, traffic(31)) > 100
    monitor, windows = replayed(path)
    state = ServiceState(monitor, lambda: NOW_MS, needs_assignment=False)
    return TestClient(create_app(state)), windows, path


def _rows(client: TestClient, **params: str) -> list[dict[str, Any]]:
    response = client.get("/api/v1/estimates", params=params)
    assert response.status_code == 200, response.text
    body = response.json()
    assert all(row["window"] == body["window"] for row in body["estimates"])
    rows: list[dict[str, Any]] = body["estimates"]
    return rows


def _key(row: dict[str, Any]) -> tuple[str, str, str]:
    return row["retriever"], row["segment"], row["metric"]


def test_the_rows_are_replays_estimates_out(
    served: tuple[TestClient, list[ClosedWindow], Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    client, windows, path = served
    body = client.get("/api/v1/estimates").json()  # (24h by default: the whole input)
    assert body["window"] == "24h"
    rows = body["estimates"]
    out = tmp_path / "estimates.jsonl"
    code = main(["replay", str(path), "--estimates-out", str(out), "--audit-rate", str(RATE)])
    assert code == 0
    capsys.readouterr()
    cli = [json.loads(line) for line in out.read_text().splitlines()]
    assert (
        [_key(r) for r in rows]
        == [_key(r) for r in cli]
        == [
            _key(r)
            for r in estimate_rows(windows, client.app.state.service.pipeline.metric_keys)  # type: ignore[attr-defined]
        ]
    )
    for row, line in zip(rows, cli, strict=True):
        assert {f: row[f] for f in (*FIELDS, "few_audited")} == {
            f: line[f] for f in (*FIELDS, "few_audited")
        }, _key(row)
        assert row["kind"]["observed"] == "live labels, labelled queries"
        assert row["kind"]["estimate"] == "audited estimate"
    by_key = {_key(r): r for r in rows}
    pooled = by_key["hybrid-v7", POOLED, "recall@5"]
    assert pooled["audited"] > 30
    assert pooled["few_audited"] is False
    assert pooled["ci_low"] < pooled["estimate"] < pooled["ci_high"]
    # the careful judge finds relevant chunks that were never retrieved: true recall is
    # below what the live labels show
    assert pooled["estimate"] < pooled["observed"]
    unaudited = by_key["hybrid-v7", UNAUDITED, "recall@5"]
    assert (unaudited["estimate"], unaudited["ci_low"], unaudited["audited"]) == (None, None, 0)
    assert unaudited["observed"] is not None


def _samples(client: TestClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            if sample.name.startswith(("retrieval_estimate", "retrieval_audited")):
                out[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return out


def test_the_series_are_the_rows_and_none_without_an_estimate(
    served: tuple[TestClient, list[ClosedWindow], Path],
) -> None:
    client, _, _ = served
    service = client.app.state.service  # type: ignore[attr-defined]
    exported = exported_metrics(service.pipeline.metric_keys, service.detector.config.metrics)
    assert set(exported) == {
        *(f"{f}@{k}" for f in ("recall", "hit_rate") for k in (1, 3, 5, 10, 20)),
        "mrr",
        "ndcg@10",
    }
    samples = _samples(client)
    expected: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for window in ("15m", "1h", "24h"):
        audited: dict[tuple[str, str], int] = {}
        for row in _rows(client, window=window):
            r, s, m = _key(row)
            audited[r, s] = max(audited.get((r, s), 0), row["audited"])
            if m not in exported or row["estimate"] is None:
                continue
            labels = tuple(
                sorted({"retriever": r, "segment": s, "metric": m, "window": window}.items())
            )
            expected["retrieval_estimate", labels] = row["estimate"]
            expected["retrieval_estimate_ci_low", labels] = row["ci_low"]
            expected["retrieval_estimate_ci_high", labels] = row["ci_high"]
        for (r, s), n in audited.items():
            labels = tuple(sorted({"retriever": r, "segment": s, "window": window}.items()))
            expected["retrieval_audited_queries", labels] = n
    assert samples == expected
    # there are estimates, and none for the unaudited segment, whose audited count is 0
    day = {k: v for k, v in samples.items() if ("window", "24h") in k[1]}
    assert any(name == "retrieval_estimate" and ("segment", "*") in labels for name, labels in day)
    assert not any(
        ("segment", UNAUDITED) in labels
        for name, labels in day
        if name != "retrieval_audited_queries"
    )
    unaudited = (("retriever", "hybrid-v7"), ("segment", UNAUDITED), ("window", "24h"))
    assert day["retrieval_audited_queries", unaudited] == 0
    assert (
        day[
            "retrieval_audited_queries",
            (("retriever", "hybrid-v7"), ("segment", "*"), ("window", "24h")),
        ]
        > 30
    )
    # context_precision and the other keys are on the API, not exported
    assert not any(("metric", "context_precision") in labels for _, labels in samples)
    text = client.get("/metrics").text
    assert "# HELP retrieval_estimate Audited estimate" in text
    assert (
        "Global: every replica exports the same values"
        in text.split("# HELP retrieval_estimate_ci_low")[1].splitlines()[0]
    )


def test_filters_filter(served: tuple[TestClient, list[ClosedWindow], Path]) -> None:
    client, _, _ = served
    every = _rows(client, window="24h")
    assert len(every) == 4 * 22  # 3 segments and pooled, 22 metric keys
    assert _rows(client, retriever="hybrid-v7") == every
    assert _rows(client, retriever="hybrid-v9") == []
    assert _rows(client, segment="nowhere") == []
    pooled = _rows(client, segment="*")
    assert pooled == [r for r in every if r["segment"] == POOLED]
    assert len(pooled) == 22
    docs_recall = _rows(client, segment="docs", metric="recall@5")
    assert [_key(r) for r in docs_recall] == [("hybrid-v7", "docs", "recall@5")]
    assert docs_recall == [r for r in every if _key(r) == ("hybrid-v7", "docs", "recall@5")]
    # an empty filter is no filter (as on the other routes)
    assert _rows(client, retriever="", segment="") == every
    # a shorter window holds fewer queries
    whole = {_key(r): r for r in every}["hybrid-v7", POOLED, "mrr"]
    two = {_key(r): r for r in _rows(client, window="2h")}["hybrid-v7", POOLED, "mrr"]
    assert 0 < two["queries"] < whole["queries"]
    assert 0 < two["audited"] < whole["audited"]
    # the last hour holds the audits of the last queries (an hour later), not the queries:
    # no sample of that hour's queries, so no estimate (and no error)
    hour = {_key(r): r for r in _rows(client, window="1h")}["hybrid-v7", POOLED, "mrr"]
    assert (hour["queries"], hour["estimate"], hour["ci_low"]) == (0, None, None)
    assert hour["audited"] > 0


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"window": "soon"}, "window"),
        ({"window": "0s"}, "window must be between"),
        ({"window": "48h"}, "window must be at most 24h"),
        ({"metric": "recall@7"}, "metric must be one of"),
        ({"metric": "x" * 41}, ""),
        ({"retriever": "r" * 101}, ""),
    ],
)
def test_bad_parameters_get_a_422_with_a_message(
    served: tuple[TestClient, list[ClosedWindow], Path], params: dict[str, str], message: str
) -> None:
    client, _, _ = served
    response = client.get("/api/v1/estimates", params=params)
    assert response.status_code == 422
    assert message in json.dumps(response.json()["detail"])
    assert response.json()["detail"]


def test_the_index_links_the_route(served: tuple[TestClient, list[ClosedWindow], Path]) -> None:
    client, _, _ = served
    links = [link["href"] for link in client.get("/").json()["links"]]
    assert "/api/v1/estimates?window=24h" in links
    assert client.get("/api/v1/estimates?window=24h").status_code == 200
