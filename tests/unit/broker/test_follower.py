"""The global view's reading of the windows topic: a record that is not a window record
is counted, logged with its place and skipped; the windows next to it are kept."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import orjson
import pytest
from fastapi.testclient import TestClient
from kafka.structs import OffsetAndMetadata, OffsetAndTimestamp, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from service.broker.follower import decode_windows, first_offsets, progress_of
from service.core.monitor import Monitor, MonitorConfig
from service.core.state import ServiceState
from service.detect.model import DetectorConfig
from service.http.app import create_app
from service.metrics.ir import metric_keys
from service.stream.offsets import encode_metadata
from service.stream.windows import ClosedWindow
from tests.unit.samples import T0, W
from tests.unit.samples import window as _window


@dataclass
class Record:
    value: bytes
    timestamp: int
    offset: int
    partition: int = 0


def test_bad_records_are_counted_and_skipped_and_the_windows_beside_them_kept(
    caplog: pytest.LogCaptureFixture,
) -> None:
    keys = metric_keys((1, 3, 5, 10, 20))
    good = [_window(T0, 4), _window(T0 + W, 3, partition=1)]
    records = [
        Record(orjson.dumps(good[0].to_record(keys)), timestamp=T0 + 9_000, offset=0),
        Record(b"not json", timestamp=T0 + 7_000, offset=1),
        Record(orjson.dumps({"retriever": "v7"}), timestamp=T0 + 8_000, offset=2),
        Record(orjson.dumps(good[1].to_record(keys)), timestamp=T0 + 9_500, offset=3),
    ]
    with caplog.at_level(logging.WARNING, logger="retrieval_monitor.follower"):
        windows, bad, oldest = decode_windows(records)
    assert windows == good
    assert bad == 2
    assert oldest == T0 + 7_000
    assert [r.getMessage().split("(")[1].split(":")[0] for r in caplog.records] == [
        "partition 0, offset 1",
        "partition 0, offset 2",
    ]
    assert decode_windows([]) == ([], 0, None)


def test_the_global_view_exports_its_bad_records() -> None:
    config = MonitorConfig(detector=DetectorConfig(metrics=("mrr",)))
    monitor = Monitor(config, lambda: T0, global_view=True)
    monitor.view.bad_records = 3
    client = TestClient(create_app(ServiceState(monitor, lambda: T0, needs_assignment=False)))
    text = client.get("/metrics").text
    values = {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("retrieval_global_view_bad_records")
    }
    assert values["retrieval_global_view_bad_records_total"] == 3


def test_early_window_records_come_back_as_early_windows_and_the_markers_as_progress() -> None:
    """An early window's record says its label age (the final record has none, so the
    windows topic keeps the contract's records), and is read back as what it is; the
    commits' ``early`` markers are the detector's progress."""
    keys = metric_keys((1, 3, 5, 10, 20))
    final = _window(T0, 4)
    early = replace(final, labelled=3, label_age_ms=300_000)
    assert "label_age_ms" not in final.to_record(keys)
    assert early.to_record(keys)["label_age_ms"] == 300_000
    records = [
        Record(orjson.dumps(w.to_record(keys)), timestamp=T0, offset=i)
        for i, w in enumerate((final, early))
    ]
    windows, bad, _ = decode_windows(records)
    assert (windows, bad) == ([final, early], 0)
    assert [ClosedWindow.from_record(orjson.loads(r.value)) for r in records] == [final, early]
    meta = OffsetAndMetadata
    committed = {
        TopicPartition("q", 0): meta(5, encode_metadata(T0, 5, None, T0 + W, T0 + 6 * W), -1),
        TopicPartition("f", 0): meta(7, encode_metadata(T0, 7, None, T0 + W, T0 + 6 * W), -1),
        TopicPartition("q", 1): meta(2, encode_metadata(T0, 2, None, T0 + 2 * W), -1),
        TopicPartition("f", 1): None,
    }
    assert progress_of(committed) == ({0: T0 + W, 1: T0 + 2 * W}, {0: T0 + 6 * W})


class CommittingLog:
    """A windows partition, read committed, whose producer commits its first transaction
    of ``records`` (all from ``since``) as soon as the follower has made one request."""

    def __init__(self, records: int) -> None:
        self.records = records
        self.committed = 0
        self.requests = 0

    def _request(self) -> None:
        self.requests += 1
        if self.requests == 2:  # between the follower's two requests
            self.committed = self.records

    def end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        self._request()
        return dict.fromkeys(tps, self.committed)

    def offsets_for_times(
        self, times: dict[TopicPartition, int]
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        self._request()
        found = OffsetAndTimestamp(0, T0, None) if self.committed else None
        return dict.fromkeys(times, found)


def test_a_transaction_committed_during_the_first_lookup_is_read_not_skipped() -> None:
    """The follower's first windows partition creates the topic with a transaction of
    40 windows; it commits between the follower's two requests. Reading from the end as
    it was *after* a lookup that found nothing would skip all 40 (the global view then
    had 14% of the traffic); from the end as it was before, it reads them."""
    tp = TopicPartition("windows", 0)
    log = CommittingLog(records=40)
    assert first_offsets(log, [tp], T0 - W) == {tp: 0}  # type: ignore[arg-type]
    assert log.requests >= 2
    # a partition with nothing from `since` on, before and after: read on from its end
    quiet = CommittingLog(records=0)
    assert first_offsets(quiet, [tp], T0 - W) == {tp: 0}  # type: ignore[arg-type]
