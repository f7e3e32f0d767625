"""The demo's audit judge: audit events for the simulated queries in the audit sample.

The simulator knows each query's truth (:attr:`SimQuery.relevant`), so the demo plays a
careful judge: for every query in the sample (``in_audit_sample(query_id, AUDIT_RATE)``,
as the service and a user's judging pipeline decide it) it grades every result with its
true grade (0 when not relevant) and adds the truly relevant chunks that were never
retrieved, which is what lowers recall below what live labels show. The audit comes on
the feedback topic ``AUDIT_DELAY_MS`` after its query, as from a judging pipeline that
works through a queue, so that ``/api/v1/estimates`` and the ``retrieval_estimate*``
series fill in as the demo runs.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator

from service.audit.sample import in_audit_sample
from service.sim.simulator import SimEvent, SimQuery
from service.times import HOUR_MS, rfc3339_millis

AUDIT_DELAY_MS = HOUR_MS
"""How long after its query an audit comes (event time and arrival alike)."""
DEMO_JUDGE = "human:demo-raters"
"""The judge's name when ``AUDIT_JUDGE`` names none."""


def audit_event(query: SimQuery, judge: str, delay_ms: int = AUDIT_DELAY_MS) -> SimEvent:
    """The careful judge's audit of one query: the true grade of every result and every
    truly relevant chunk, ``delay_ms`` after the query."""
    grades = {chunk: query.relevant.get(chunk, 0) for chunk in query.results}
    grades.update(query.relevant)  # (the relevant chunks it found that were never retrieved)
    ts = query.timestamp_ms + delay_ms
    event: dict[str, object] = {
        "query_id": query.query_id,
        "timestamp": rfc3339_millis(ts),
        "signal": "audit",
        "judge": judge,
        "grades": grades,
    }
    return SimEvent("feedback", query.query_id, event, ts, ts)


def with_audits(
    queries: Iterable[SimQuery], rate: float, judge: str, delay_ms: int = AUDIT_DELAY_MS
) -> Iterator[SimEvent]:
    """Every event of ``queries`` (in event-time order, as ``simulate_queries`` yields
    them) and the audits of those in the sample at ``rate`` (0: none), in nondecreasing
    arrival order, streamed: the simulator's ``generate`` with the judge's events
    interleaved by arrival time."""
    pending: list[tuple[int, int, SimEvent]] = []
    sequence = 0
    for query in queries:
        # later queries and their events (and audits) arrive at or after this query's time
        while pending and pending[0][0] <= query.timestamp_ms:
            yield heapq.heappop(pending)[2]
        events = list(query.events)
        if rate > 0 and in_audit_sample(query.query_id, rate):
            events.append(audit_event(query, judge, delay_ms))
        for event in events:
            heapq.heappush(pending, (event.arrival_ms, sequence, event))
            sequence += 1
    while pending:
        yield heapq.heappop(pending)[2]
