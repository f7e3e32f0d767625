"""Closed windows read back from the windows topic when the service starts.

The rolling views and the detector's history live in memory. The windows they are made
of are durable on ``retrieval.windows`` (committed together with the offsets), so a
restarted process reads back the recent ones instead of starting blind: open
regressions, deploy comparisons and the 24 h views survive a restart or a crash.

Only the last record of each key counts (the topic is compacted; every record of a key
is identical anyway), only committed records are read, and a record that does not parse
is logged and skipped.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson
from kafka import KafkaConsumer, TopicPartition

from service.stream.windows import ClosedWindow

log = logging.getLogger(__name__)


def read_window_history(
    client: dict[str, Any], topic: str, since_ms: int, timeout_s: float = 60.0
) -> dict[int, list[ClosedWindow]]:
    """Windows published to ``topic`` since ``since_ms`` (wall clock), by input partition."""
    consumer = KafkaConsumer(
        **client,
        group_id=None,
        enable_auto_commit=False,
        isolation_level="read_committed",
        client_id="retrieval-monitor-history",
    )
    try:
        partitions = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        if not tps:
            return {}
        consumer.assign(tps)
        end = consumer.end_offsets(tps)
        found = consumer.offsets_for_times(dict.fromkeys(tps, since_ms))
        for tp in tps:
            start = found.get(tp)
            consumer.seek(tp, end[tp] if start is None else start.offset)
        latest: dict[str, ClosedWindow] = {}
        bad = 0
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < end[tp] for tp in tps):
            if time.monotonic() > deadline:
                log.warning(
                    "reading back %s took over %.0f s; starting with what was read",
                    topic,
                    timeout_s,
                )
                break
            for records in consumer.poll(timeout_ms=500).values():
                for record in records:
                    try:
                        window = ClosedWindow.from_record(orjson.loads(record.value))
                    except (ValueError, KeyError, TypeError):
                        bad += 1
                        continue
                    latest[window.key] = window
    finally:
        consumer.close()
    if bad:
        log.warning("skipped %d records of %s that are not window records", bad, topic)
    by_partition: dict[int, list[ClosedWindow]] = {}
    for window in latest.values():
        by_partition.setdefault(window.partition, []).append(window)
    log.info("read back %d windows of %d partitions from %s", len(latest), len(by_partition), topic)
    return by_partition
