"""The monitor's window view: every window once, whoever sends it and however often."""

from __future__ import annotations

from service.detect.model import DetectorConfig
from service.metrics.aggregates import Moments
from service.monitor import Monitor, MonitorConfig
from service.stream.windows import ClosedWindow

W = 300_000
T0 = 1_796_083_200_000


def _window(start: int, labelled: int, partition: int = 0) -> ClosedWindow:
    metric = Moments(labelled, labelled * (1 << 51), labelled * (1 << 50))  # each value 0.5
    return ClosedWindow(
        "v1", "docs", partition, start, start + W, labelled + 1, labelled, {"mrr": metric}
    )


def test_a_window_sent_twice_is_merged_once() -> None:
    monitor = Monitor(MonitorConfig(detector=DetectorConfig(metrics=("mrr",))), lambda: T0)
    view = monitor.view
    first = [_window(T0, 4), _window(T0, 6, partition=1), _window(T0 + W, 5)]
    view.add(first)
    view.add(first[:2])  # published again (at least once), or read back from the topic
    view.add([_window(T0, 6, partition=1)])
    rolling = view.closed.rolling(3_600_000, T0 + 2 * W)
    assert rolling["v1", "docs"].labelled == 15
    assert rolling["v1", "docs"].metrics["mrr"].count == 15
    [(_, _, start, totals), _] = view.closed.listing()
    assert (start, totals.labelled) == (T0, 10)


def test_restored_and_confirmed_windows_reach_the_view_once() -> None:
    monitor = Monitor(MonitorConfig(), lambda: T0)
    pipeline = monitor.pipeline
    pipeline.assign(0)
    old = _window(T0, 4)
    pipeline.restore([old])  # read back at start
    pipeline.confirm_published([old, _window(T0 + W, 3)])  # published again, then a new one
    labelled = [t.labelled for _, _, _, t in monitor.view.closed.listing()]
    assert labelled == [4, 3]
    assert sum(pipeline.counts.finalized.values()) == 4  # only the new one is counted
