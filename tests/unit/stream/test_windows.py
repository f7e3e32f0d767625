"""Closed windows: records round-trip exactly; rolling views follow the watermark."""

from __future__ import annotations

from typing import Any

import orjson

from service.metrics.aggregates import Moments
from service.stream.rolling import ClosedWindows
from service.stream.windows import ClosedWindow
from tests.unit.samples import T0, W
from tests.unit.samples import window as _window


def test_record_round_trips_exactly_and_keys_follow_the_contract() -> None:
    window = ClosedWindow("v1", "docs", 3, T0, T0 + W, 10, 7, {"mrr": Moments(7, 3 << 60, 5 << 58)})
    record = window.to_record(("mrr", "recall@5"))
    assert window.key == "v1|docs|2026-12-01T00:00:00Z|3"
    assert record["metrics"]["recall@5"] == {"count": 0, "sum": 0.0, "sum_sq": 0.0}
    assert record["unlabelled"] == 3
    assert ClosedWindow.from_record(record) == window


def _raised(read: Any, raw: bytes) -> tuple[type[BaseException], str] | None:
    try:
        read(raw)
    except (ValueError, KeyError, TypeError) as error:
        return type(error), str(error)
    return None


def test_reading_record_bytes_gives_what_the_record_reader_gives() -> None:
    """``from_json`` (the follower's fast path) equals ``from_record`` of the parsed JSON:
    the same window, exact sums beyond 64 bits included, or the same error."""
    huge = Moments(3, 7 << 80, 11 << 90)
    window = ClosedWindow(
        "v1", "docs", 2, T0, T0 + W, 5, 3, {"mrr": huge, "ndcg@5": Moments(3, 9, 27)}
    )
    record = window.to_record(("mrr", "ndcg@5", "recall@5"))
    raw = orjson.dumps(record)
    assert ClosedWindow.from_json(raw) == window == ClosedWindow.from_record(record)
    assert ClosedWindow.from_json(raw).metrics["mrr"].sum_sq_fx == 11 << 90
    floats = {k: v for k, v in record.items() if k != "metrics_fixed"}  # (an older record)
    from_floats = ClosedWindow.from_json(orjson.dumps(floats))
    assert from_floats == ClosedWindow.from_record(floats)
    assert from_floats.metrics["ndcg@5"] == Moments(3, 9, 27)  # sums below 2 stay exact
    bad: list[dict[str, Any]] = [
        {**record, "metrics_fixed": {"mrr": [3, "1"]}},  # a sum missing
        {**record, "metrics_fixed": {"mrr": [3, "x", "1"]}},  # not a number
        {**record, "window_start": "yesterday"},
        {**record, "partition": "two"},
        {k: v for k, v in record.items() if k != "queries"},
    ]
    for each in bad:
        raw = orjson.dumps(each)
        expected = _raised(lambda r: ClosedWindow.from_record(orjson.loads(r)), raw)
        assert expected is not None
        assert _raised(ClosedWindow.from_json, raw) == expected
    assert _raised(ClosedWindow.from_json, b"{not json") is not None


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
