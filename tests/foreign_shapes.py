"""Contract events rewritten in three foreign shapes, with the mappings that read them.

Each converter takes simulated events in the contract's shape and returns the same
traffic as a user would log it (``SimEvent``s whose ``event`` is the foreign record) and
the contract events that carry exactly what the foreign records carry (UBI has no
citations, judgments, dwell times or ``context_k``, and a click is grade 1): the oracle
is the offline evaluation of those. Foreign records the mapping must skip (UBI
impressions, hovers) are mixed in; they have no contract equivalent.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime
from typing import Any

from service.sim.simulator import SimEvent

Converted = tuple[list[SimEvent], list[SimEvent]]


def _ids(results: Any) -> list[str]:
    return [r if isinstance(r, str) else r["chunk_id"] for r in results]


def _query_text(query_id: str) -> str:
    """A query text per id; ids ending in the same digit share one (repeated questions)."""
    return f"How do I configure  feature {query_id[-1]}?" if query_id[-1] in "05" else query_id


def to_ubi(events: list[SimEvent]) -> Converted:
    """OpenSearch UBI 1.3 ``ubi_queries`` and ``ubi_events`` records."""
    foreign: list[SimEvent] = []
    same: list[SimEvent] = []
    ranks: dict[str, list[str]] = {}
    for e in events:
        ev = e.event
        if e.topic == "queries":
            ids = _ids(ev["results"])
            ranks[e.key] = ids
            record: dict[str, Any] = {
                "query_id": ev["query_id"],
                "client_id": f"client-{len(ranks) % 7}",
                "timestamp": ev["timestamp"],
                "user_query": _query_text(e.key),
                "query_attributes": {"retriever": ev["retriever"], "page": 1},
                "object_id_field": "chunk_id",
                "query_response_id": f"resp-{e.key}",
                "query_response_hit_ids": ids,
            }
            if ev.get("segment", "default") != "default":
                record["application"] = ev["segment"]
            foreign.append(replace(e, event=record))
            contract = {k: v for k, v in ev.items() if k != "context_k"}
            same.append(replace(e, event={**contract, "results": ids}))
            if len(ranks) % 3 == 0:  # an impression: not a signal, skipped by the preset
                foreign.append(
                    replace(
                        e,
                        topic="feedback",
                        event=_ubi_event(ev, "impression", ids[:1] or ["none"], 0),
                    )
                )
        elif ev["signal"] == "click":
            chunk = ev["chunk_id"]
            position = ranks.get(e.key, []).index(chunk) + 1 if chunk in ranks.get(e.key, []) else 0
            foreign.append(replace(e, event=_ubi_event(ev, "click", [chunk], position)))
            contract = {k: v for k, v in ev.items() if k != "dwell_ms"}
            same.append(replace(e, event=contract))
    return foreign, same


def _ubi_event(ev: dict[str, Any], action: str, chunk: list[str], position: int) -> dict[str, Any]:
    object_id: str | int = chunk[0]
    return {
        "application": "support-site",
        "action_name": action,
        "query_id": ev["query_id"],
        "session_id": "84266fdbd31d4c2c6d0665f7e8380fa3",
        "client_id": "client-1",
        "timestamp": ev["timestamp"],
        "message_type": "CLICK_THROUGH" if action == "click" else "IMPRESSION",
        "message": f"{action} on {object_id}",
        "event_attributes": {
            "object": {"object_id": object_id, "object_id_field": "chunk_id"},
            "position": {"ordinal": {"index": position}},
        },
    }


SEARCH_LOG_MAPPING = """\
# a search service's request log, and an interaction log
queries:
  query_id: search.request_id
  timestamp: search.ts
  retriever: search.model_version
  results: response.hits[*].id
  context_k: response.context_window
  segment: {path: search.tenant, default: default}
  query: search.text
feedback:
  query_id: request_id
  timestamp: event.time
  chunk_id: event.doc.id
  signal:
    path: event.type
    values: {open: click, cite: citation, rate: judgment}
    ignore: [hover]
  grade: event.rating
  dwell_ms: event.dwell
"""


def to_search_log(events: list[SimEvent]) -> Converted:
    """A nested search-log shape: hits as objects, renamed everything, hovers to skip."""
    foreign: list[SimEvent] = []
    signal = {"click": "open", "citation": "cite", "judgment": "rate"}
    for n, e in enumerate(events):
        ev = e.event
        if e.topic == "queries":
            search: dict[str, Any] = {
                "request_id": ev["query_id"],
                "ts": ev["timestamp"],
                "model_version": ev["retriever"],
                "text": _query_text(e.key),
            }
            if "segment" in ev:
                search["tenant"] = ev["segment"]
            hits = [
                {"id": r, "rank": i + 1}
                if isinstance(r, str)
                else {"id": r["chunk_id"], "score": r["score"]}
                for i, r in enumerate(ev["results"])
            ]
            response: dict[str, Any] = {"hits": hits, "took_ms": 12}
            if "context_k" in ev:
                response["context_window"] = ev["context_k"]
            foreign.append(replace(e, event={"search": search, "response": response}))
        else:
            event: dict[str, Any] = {
                "time": ev["timestamp"],
                "type": signal[ev["signal"]],
                "doc": {"id": ev["chunk_id"]},
            }
            for theirs, ours in (("rating", "grade"), ("dwell", "dwell_ms")):
                if ours in ev:
                    event[theirs] = ev[ours]
            foreign.append(replace(e, event={"request_id": ev["query_id"], "event": event}))
            if n % 4 == 0:
                hover = {**event, "type": "hover"}
                foreign.append(replace(e, event={"request_id": ev["query_id"], "event": hover}))
    return foreign, list(events)


EPOCH_MS_MAPPING = json.dumps(
    {
        "queries": {
            "query_id": "qid",
            "timestamp": {"path": "ts_ms", "format": "epoch_millis"},
            "retriever": "retriever_version",
            "results": "docs",
            "context_k": "k",
            "segment": {"path": "/labels/team.name", "default": "default"},
        },
        "feedback": {
            "query_id": "qid",
            "timestamp": {"path": "ts_ms", "format": "epoch_millis"},
            "chunk_id": "doc_id",
            "signal": {
                "path": "action",
                "values": {
                    "select": "click",
                    "open_doc": "click",
                    "quote": "citation",
                    "grade": "judgment",
                },
            },
            "grade": "score",
            "dwell_ms": "dwell",
        },
    },
    indent=2,
)


def millis(text: str) -> int:
    """Epoch milliseconds of an RFC 3339 time with at most millisecond precision."""
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return int(moment.timestamp()) * 1000 + moment.microsecond // 1000


def to_epoch_ms(events: list[SimEvent]) -> Converted:
    """Flat records with epoch milliseconds, renamed signals, a key with a dot."""
    foreign: list[SimEvent] = []
    for n, e in enumerate(events):
        ev = e.event
        if e.topic == "queries":
            record: dict[str, Any] = {
                "qid": ev["query_id"],
                "ts_ms": millis(str(ev["timestamp"])),
                "retriever_version": ev["retriever"],
                "docs": _ids(ev["results"]),
            }
            if "context_k" in ev:
                record["k"] = ev["context_k"]
            if "segment" in ev:
                record["labels"] = {"team.name": ev["segment"]}
        else:
            action = {"citation": "quote", "judgment": "grade"}.get(
                str(ev["signal"]), "select" if n % 2 else "open_doc"
            )
            record = {
                "qid": ev["query_id"],
                "ts_ms": str(millis(str(ev["timestamp"])))
                if n % 5 == 0
                else millis(str(ev["timestamp"])),
                "doc_id": ev["chunk_id"],
                "action": action,
            }
            if "grade" in ev:
                record["score"] = ev["grade"]
            if "dwell_ms" in ev:
                record["dwell"] = ev["dwell_ms"]
        foreign.append(replace(e, event=record))
    same = [
        replace(e, event={**e.event, "results": _ids(e.event["results"])})
        if e.topic == "queries"
        else e
        for e in events
    ]
    return foreign, same
