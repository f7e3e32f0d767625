"""Closed windows: records round-trip exactly; rolling views follow the watermark."""

from __future__ import annotations

from service.metrics.aggregates import Moments
from service.stream.windows import ClosedWindow, ClosedWindows
from tests.unit.samples import T0, W
from tests.unit.samples import window as _window


def test_record_round_trips_exactly_and_keys_follow_the_contract() -> None:
    window = ClosedWindow("v1", "docs", 3, T0, T0 + W, 10, 7, {"mrr": Moments(7, 3 << 60, 5 << 58)})
    record = window.to_record(("mrr", "recall@5"))
    assert window.key == "v1|docs|2026-12-01T00:00:00Z|3"
    assert record["metrics"]["recall@5"] == {"count": 0, "sum": 0.0, "sum_sq": 0.0}
    assert record["unlabelled"] == 3
    assert ClosedWindow.from_record(record) == window


def test_rolling_view_changes_with_new_windows_and_with_the_watermark() -> None:
    closed = ClosedWindows(W, 3_600_000)
    closed.add([_window(T0, 4), _window(T0, 6, partition=1)])
    view = closed.rolling(15 * 60_000, T0 + W)
    assert view["v1", "docs"].labelled == 10  # both partitions merged
    assert view["v1", "docs"].metrics["mrr"].mean == 0.5
    closed.add([_window(T0 + W, 5)])
    assert closed.rolling(15 * 60_000, T0 + W)["v1", "docs"].labelled == 10  # not ended yet
    assert closed.rolling(15 * 60_000, T0 + 2 * W - 1)["v1", "docs"].labelled == 10
    assert closed.rolling(15 * 60_000, T0 + 2 * W)["v1", "docs"].labelled == 15
    # the first window leaves a 5-minute view once the watermark is a window past its end
    assert closed.rolling(W, T0 + 2 * W)["v1", "docs"].labelled == 5
    assert closed.rolling(W, T0 + 3 * W) == {}
    # a span that is not a multiple of the window length is exact too
    assert closed.rolling(W + 1, T0 + 2 * W)["v1", "docs"].labelled == 15  # ends T0+W, T0+2W
    assert closed.rolling(W + 1, T0 + 2 * W - 1)["v1", "docs"].labelled == 10
