"""The labels output: one record per finalised labelled query, for golden sets mined
from production (``--labels-topic``, ``replay --labels-out``; off by default).

The join keeps chunk ids as hashes; while the output is on, this recorder keeps the
strings it needs beside it: each accepted query's logged results (and its text, when the
input mapping reads one and ``labels_query_text`` allows it), and the chunk ids that
feedback named. At finalisation the pipeline hands it a closed window's queries with the
grades the join applied; a query with a relevant chunk becomes a record. Entries of
queries that never finalise (evicted) and of feedback that never found its query are
dropped once the watermark is past any use for them.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import orjson

from service.times import rfc3339_millis


class LabelRecorder:
    """The strings the labels output needs, from acceptance to finalisation."""

    def __init__(self, query_text: bool = False) -> None:
        self.query_text = query_text
        self.queries: dict[bytes, tuple[int, str, str | None]] = {}
        """Per pending query: its time, its chunk ids (a JSON array: one object, not one
        string each) and its text."""
        self.names: dict[bytes, dict[int, str]] = {}
        self._order: deque[tuple[int, bytes]] = deque()
        """(event time, query id) as entries were made, to expire what is never used."""

    def query(self, query_id: bytes, ts_ms: int, chunk_ids: list[str], text: Any) -> None:
        """An accepted query event."""
        keep = text if self.query_text and isinstance(text, str) else None
        self.queries[query_id] = (ts_ms, orjson.dumps(chunk_ids).decode(), keep)
        self._order.append((ts_ms, query_id))

    def feedback(self, query_id: bytes, ts_ms: int, chunk: int, chunk_id: str) -> None:
        """A feedback event (whether or not its query is here yet)."""
        names = self.names.get(query_id)
        if names is None:
            names = self.names[query_id] = {}
            self._order.append((ts_ms, query_id))
        names[chunk] = chunk_id

    def finalised(
        self,
        query_ids: list[bytes],
        grades: list[dict[int, int] | None],
        window: tuple[str, str, int],
    ) -> list[dict[str, Any]]:
        """The records of a closed window's finalised queries that are labelled."""
        retriever, segment, _ = window
        out = []
        for query_id, graded in zip(query_ids, grades, strict=True):
            entry = self.queries.pop(query_id, None)
            names = self.names.pop(query_id, None) or {}
            if entry is None or not graded or max(graded.values()) < 1:
                continue
            ts_ms, packed, text = entry
            chunk_ids = orjson.loads(packed)
            known = {hash(c): c for c in chunk_ids}
            known.update(names)
            labels = {known[h]: g for h, g in graded.items() if h in known}
            record: dict[str, Any] = {
                "query_id": query_id.decode(),
                "timestamp": rfc3339_millis(ts_ms),
                "retriever": retriever,
                "segment": segment,
                "results": chunk_ids,
                "labels": dict(sorted(labels.items())),
            }
            if text is not None:
                record["query"] = text
            out.append(record)
        return out

    def expire(self, before_ms: int) -> None:
        """Drop entries made for events older than ``before_ms`` (no longer of use)."""
        order = self._order
        while order and order[0][0] < before_ms:
            _, query_id = order.popleft()
            self.queries.pop(query_id, None)
            self.names.pop(query_id, None)
