"""The window view's audited estimates: exactly ``book.estimates`` over the windows its
rolling rule picks, in one process (local) and merged over partitions (global)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from service.audit.book import POOLED, estimates
from service.core.monitor import Monitor
from service.stream.windows import ClosedWindow
from service.times import HOUR_MS
from tests.unit.audit.audited_replay import (
    NOW_MS,
    UNAUDITED,
    config,
    replayed,
    rolling,
    traffic,
    write_events,
)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[Monitor, list[ClosedWindow]]]:
    out = []
    for seed in (21, 22):
        path = tmp_path_factory.mktemp("view") / "events.jsonl"
        assert write_events(path, traffic(seed)) > 100
        out.append(replayed(path))
    return out


def test_a_local_view_gives_the_estimates_of_its_rolling_windows(
    two_runs: list[tuple[Monitor, list[ClosedWindow]]],
) -> None:
    monitor, windows = two_runs[0]
    view = monitor.view
    wm = view.watermark_ms
    assert wm is not None
    keys = monitor.pipeline.metric_keys
    for span in (15 * 60_000, HOUR_MS, 2 * HOUR_MS, 24 * HOUR_MS):
        chosen = rolling(windows, span, wm)
        assert view.estimates(span) == estimates(chosen, keys)
        # (the last windows end half an hour before the watermark: 15 minutes hold none)
        assert bool(chosen) == (span > 15 * 60_000)
    whole = view.estimates(24 * HOUR_MS)
    assert whole == estimates(windows, keys)  # (24 h holds the whole input)
    # an hour's estimates are not the whole input's: the span is applied
    hour = view.estimates(HOUR_MS)
    assert hour["hybrid-v7", POOLED, "recall@5"] != whole["hybrid-v7", POOLED, "recall@5"]
    assert hour["hybrid-v7", POOLED, "recall@5"].audited > 0
    assert (
        hour["hybrid-v7", POOLED, "recall@5"].audited
        < whole["hybrid-v7", POOLED, "recall@5"].audited
    )
    assert view.estimates(15 * 60_000) == {}
    # every metric key of every slice, pooled too; the unaudited segment has no estimate
    assert {m for _, _, m in whole} == set(keys)
    assert {s for _, s, _ in whole} == {"support-kb", "docs", UNAUDITED, POOLED}
    e = whole["hybrid-v7", UNAUDITED, "recall@5"]
    assert (e.estimate, e.audited) == (None, 0)
    assert e.observed is not None
    assert whole["hybrid-v7", "docs", "recall@5"].estimate is not None
    # asked again, the same (cached) answer
    assert view.estimates(24 * HOUR_MS) is whole


def test_a_global_view_merges_partitions_and_follows_new_windows(
    two_runs: list[tuple[Monitor, list[ClosedWindow]]],
) -> None:
    # two inputs as two partitions of one topic: the same slices and window starts
    first = two_runs[0][1]
    second = [replace(w, partition=1) for w in two_runs[1][1]]
    keys = two_runs[0][0].pipeline.metric_keys
    view = Monitor(config(), lambda: NOW_MS, global_view=True).view
    half = len(first) // 2
    view.add(first[:half] + second)
    end = max(w.end_ms for w in first + second)
    view.apply_progress({0: end, 1: end}, 2, NOW_MS)
    wm = view.watermark_ms
    assert wm is not None
    day = 24 * HOUR_MS
    before = view.estimates(day)
    assert before == estimates(rolling(first[:half] + second, day, wm), keys)
    # the rest of partition 0 comes: the estimates are computed again, over both
    view.add(first[half:])
    after = view.estimates(day)
    both = first + second
    assert after == estimates(rolling(both, day, wm), keys)
    assert after != before
    e = after["hybrid-v7", POOLED, "hit_rate@5"]
    assert e.audited == sum(w.audit["hit_rate@5"].n for w in both if "hit_rate@5" in w.audit)
    assert e.queries == sum(w.queries for w in both)
    # a window seen again (at least once publishing) changes nothing
    view.add(first[:3])
    assert view.estimates(day) == after
    for span in (15 * 60_000, HOUR_MS):
        assert view.estimates(span) == estimates(rolling(both, span, wm), keys)


def test_no_event_time_no_estimates() -> None:
    view = Monitor(config(), lambda: NOW_MS, global_view=True).view
    assert view.estimates(HOUR_MS) == {}


def test_more_audits_than_queries_in_a_span_give_no_estimate_and_no_error(
    two_runs: list[tuple[Monitor, list[ClosedWindow]]],
) -> None:
    """A short span can hold the audits of a version's queries from before it while that
    version serves a few queries or none (rolled back): the audited are no sample of the
    span's queries, so there is no estimate, and reading the view never fails."""
    windows = two_runs[0][1]
    audited = [w for w in windows if w.audit.get("mrr") is not None and w.audit["mrr"].n > 1]
    assert audited
    # the same windows with one query each (and its live value gone)
    thin = [replace(w, queries=1, labelled=0, metrics={}) for w in audited]
    view = Monitor(config(), lambda: NOW_MS, global_view=True).view
    view.add(thin)
    end = max(w.end_ms for w in thin)
    view.apply_progress({0: end}, 1, NOW_MS)
    found = view.estimates(24 * HOUR_MS)
    e = found["hybrid-v7", POOLED, "mrr"]
    assert e.audited == sum(w.audit["mrr"].n for w in thin) > e.queries == len(thin)
    assert (e.estimate, e.ci_low, e.ci_high, e.observed) == (None, None, None, None)
