"""The monitor's window view: every window once, whoever sends it and however often."""

from __future__ import annotations

from service.detect.model import DetectorConfig
from service.monitor import Monitor, MonitorConfig
from tests.unit.samples import T0, W
from tests.unit.samples import window as _window


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


def test_windows_confirmed_twice_reach_the_view_once() -> None:
    monitor = Monitor(MonitorConfig(), lambda: T0)
    pipeline = monitor.pipeline
    pipeline.assign(0)
    old = _window(T0, 4)
    pipeline.confirm_published([old])
    pipeline.confirm_published([old, _window(T0 + W, 3)])  # published again, then a new one
    labelled = [t.labelled for _, _, _, t in monitor.view.closed.listing()]
    assert labelled == [4, 3]
    assert sum(pipeline.counts.finalized.values()) == 9  # 5 + 4 queries: each window once


def test_the_global_boundary_waits_for_every_partition_and_leaves_out_a_stalled_one() -> None:
    config = MonitorConfig(detector=DetectorConfig(metrics=("mrr",)), progress_stall_ms=12 * W)
    view = Monitor(config, lambda: T0, global_view=True).view
    assert view.is_global
    assert view.watermark_ms is None
    view.add([_window(T0, 4, partition=p) for p in range(3)])
    assert view.apply_progress({0: T0 + W, 1: T0 + 2 * W}, partitions=3) is None  # 2 waits
    assert view.detector.through_ms is None
    assert view.apply_progress({2: T0 + W}, partitions=3) == T0 + W  # the smallest
    assert view.detector.through_ms == T0 + W
    assert view.watermark_ms == T0 + W + config.pipeline.join.attribution_ms
    # partition 2 stops (its owner died): the others run on, it holds the boundary ...
    assert view.apply_progress({0: T0 + 12 * W, 1: T0 + 13 * W}, partitions=3) == T0 + W
    assert view.behind == set()
    # ... until it lies more than progress_stall behind the most advanced one
    assert view.apply_progress({0: T0 + 14 * W, 1: T0 + 14 * W}, partitions=3) == T0 + 14 * W
    assert view.behind == {2}
    assert view.detector.through_ms == T0 + 14 * W
    # when it comes back, it rejoins; the boundary never goes back
    assert view.apply_progress({2: T0 + 5 * W}, partitions=3) == T0 + 14 * W
    assert view.apply_progress({2: T0 + 14 * W}, partitions=3) == T0 + 14 * W
    assert view.behind == set()
    assert view.apply_progress({2: T0 + 13 * W}, partitions=3) == T0 + 14 * W  # only grows
    assert view.progress[2] == T0 + 14 * W
