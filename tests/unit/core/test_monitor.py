"""The monitor's window view: every window once, whoever sends it and however often."""

from __future__ import annotations

from dataclasses import replace

from service.core.monitor import Monitor, MonitorConfig
from service.detect.model import DetectorConfig
from service.stream.join_state import JoinConfig
from service.stream.pipeline import PipelineConfig
from tests.unit.samples import T0, W
from tests.unit.samples import window as _window


def test_a_window_sent_twice_is_merged_once() -> None:
    monitor = Monitor(MonitorConfig(detector=DetectorConfig(metrics=("mrr",))), lambda: T0)
    view = monitor.view
    first = [_window(T0, 4), _window(T0, 6, partition=1), _window(T0 + W, 5)]
    view.add(first)
    view.add(first[:2])  # published again (at least once), or read back from the topic
    view.add([_window(T0, 6, partition=1)])
    view.add([_window(T0 + W, 5, partition=2)] * 2)  # twice in one poll of the windows topic
    rolling = view.closed.rolling(3_600_000, T0 + 2 * W)
    assert rolling["v1", "docs"].labelled == 20
    assert rolling["v1", "docs"].metrics["mrr"].count == 20
    [(_, _, start, totals), _] = view.closed.listing()
    assert (start, totals.labelled) == (T0, 10)


def test_windows_confirmed_twice_reach_the_view_once() -> None:
    monitor = Monitor(MonitorConfig(), lambda: T0)
    pipeline = monitor.pipeline
    pipeline.assign(0)
    old = _window(T0, 4)
    pipeline.confirm([old])
    pipeline.confirm([old, _window(T0 + W, 3)])  # published again, then a new one
    labelled = [t.labelled for _, _, _, t in monitor.view.closed.listing()]
    assert labelled == [4, 3]
    assert sum(pipeline.counts.finalized.values()) == 9  # 5 + 4 queries: each window once


def test_the_global_boundary_waits_for_every_partition_and_leaves_out_a_stalled_one() -> None:
    minute = 60_000
    final = PipelineConfig(join=JoinConfig(early_ms=0))  # (the detector reads final windows)
    detector = DetectorConfig(metrics=("mrr",))
    config = MonitorConfig(final, detector, progress_stall_ms=15 * minute)
    view = Monitor(config, lambda: T0, global_view=True).view
    assert view.is_global
    assert view.watermark_ms is None
    view.add([_window(T0, 4, partition=p) for p in range(3)])
    now = T0 + 86_400_000  # wall clock

    def apply(progress: dict[int, int], minutes: int) -> int | None:
        return view.apply_progress(progress, 3, now + minutes * minute)

    assert apply({0: T0 + W, 1: T0 + 2 * W}, 0) is None  # partition 2 has not committed yet
    assert view.detector.through_ms is None
    assert apply({2: T0 + W}, 1) == T0 + W  # the smallest
    assert view.detector.through_ms == T0 + W
    assert view.watermark_ms == T0 + W + config.pipeline.join.attribution_ms
    # partition 2 catches up a backlog far behind the others: its progress moves, it
    # holds the boundary however far behind it is
    assert apply({0: T0 + 40 * W, 1: T0 + 40 * W, 2: T0 + 2 * W}, 10) == T0 + 2 * W
    assert apply({0: T0 + 41 * W, 1: T0 + 41 * W, 2: T0 + 3 * W}, 20) == T0 + 3 * W
    assert view.behind == set()
    # then it stops (its owner died): 15 minutes of wall time later it is left out ...
    assert apply({0: T0 + 42 * W, 1: T0 + 42 * W}, 35) == T0 + 3 * W
    assert view.behind == set()
    assert apply({0: T0 + 43 * W, 1: T0 + 43 * W}, 36) == T0 + 43 * W
    assert view.behind == {2}
    assert view.detector.through_ms == T0 + 43 * W
    # ... until it moves again: it rejoins, and the boundary never goes back
    assert apply({2: T0 + 5 * W}, 40) == T0 + 43 * W
    assert view.behind == set()
    assert apply({0: T0 + 50 * W, 1: T0 + 50 * W, 2: T0 + 45 * W}, 45) == T0 + 45 * W
    # nothing moves anywhere (no traffic, no idleness): nobody is left out
    assert apply({}, 120) == T0 + 45 * W
    assert view.behind == set()


def test_with_early_windows_the_detector_goes_as_far_as_every_partitions_early_windows() -> None:
    minute = 60_000
    config = MonitorConfig(detector=DetectorConfig(metrics=("mrr",)), progress_stall_ms=15 * minute)
    assert config.pipeline.join.early_age_ms == 5 * minute  # (the default)
    assert config.detector.attribution_ms == 5 * minute  # its labels are complete at that age
    monitor = Monitor(config, lambda: T0, global_view=True)
    view = monitor.view
    early = [replace(_window(T0 + i * W, 4), label_age_ms=5 * minute) for i in range(8)]
    view.add_early(early)
    view.add([_window(T0, 4)])  # a final window: the rolling views', not the detector's
    assert view.closed.listing()[0][3].labelled == 4
    now = T0 + 86_400_000

    def apply(closed: dict[int, int], early: dict[int, int] | None) -> int | None:
        return view.apply_progress(closed, 2, now, early)

    # both partitions' final windows are through T0 + W, their early ones further
    assert apply({0: T0 + W, 1: T0 + W}, {0: T0 + 6 * W, 1: T0 + 4 * W}) == T0 + W
    assert view.detected_ms == T0 + 4 * W
    assert view.detector.through_ms == T0 + 4 * W  # the smallest early progress
    # a partition whose commit has no early marker (written before they were made) counts
    # with its final progress
    assert apply({0: T0 + 7 * W, 1: T0 + 5 * W}, None) == T0 + 5 * W
    assert view.detector.through_ms == T0 + 5 * W
    assert apply({}, {1: T0 + 6 * W}) == T0 + 5 * W
    assert view.detector.through_ms == T0 + 6 * W
