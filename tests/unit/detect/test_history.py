"""A slice's history (service/detect/history.py): windows merged over partitions, each
counted once however often it is published, and only recent windows kept per partition."""

from __future__ import annotations

import random

import pytest

from service.detect.history import KEEP_PARTS_MS, SliceHistory
from tests.unit.samples import T0, W

WIDTH = 6
PARTITIONS = 12


def _row(rng: random.Random) -> list[int]:
    return [rng.randrange(10**9) for _ in range(WIDTH)]


def _fill(history: SliceHistory, rows: dict[tuple[int, int], list[int]], days: float) -> None:
    """``days`` of windows of every partition, oldest first, as the detector adds them."""
    rng = random.Random(5)
    for start in range(T0, T0 + int(days * 86_400_000), W):
        for p in range(PARTITIONS):
            rows[start, p] = _row(rng)
            history.add(start, p, list(rows[start, p]))


def _expected(rows: dict[tuple[int, int], list[int]], lo: int, hi: int) -> list[int]:
    out = [0] * WIDTH
    for (start, _), row in rows.items():
        if lo <= start < hi:
            out = [a + b for a, b in zip(out, row, strict=True)]
    return out


def test_old_windows_keep_their_merged_row_only_and_still_count_once() -> None:
    """A day of 12 partitions: the per-partition rows held are the last hour's only (a
    history that kept them all holds 288 x 12), yet every span is the exact sum, and a
    day-old window published again, by any of its partitions, changes nothing."""
    history = SliceHistory(WIDTH)
    rows: dict[tuple[int, int], list[int]] = {}
    _fill(history, rows, days=1)
    end = T0 + 86_400_000
    assert history.total(T0, end) == _expected(rows, T0, end)
    kept = {start for start, _ in history._parts}
    assert kept
    assert min(kept) >= end - W - KEEP_PARTS_MS
    assert len(history._parts) <= PARTITIONS * (KEEP_PARTS_MS // W + 1)

    for p in range(PARTITIONS):  # the first window again, from every partition
        history.add(T0, p, list(rows[T0, p]))
    assert history.total(T0, end) == _expected(rows, T0, end)
    assert history.total(T0, T0 + W) == _expected(rows, T0, T0 + W)


def test_a_late_partition_of_an_old_window_still_adds() -> None:
    """The 13th partition's window of a day-old start, first seen now, is added to it."""
    history = SliceHistory(WIDTH)
    rows: dict[tuple[int, int], list[int]] = {}
    _fill(history, rows, days=1)
    rows[T0, PARTITIONS] = [1, 2, 3, 4, 5, 6]
    history.add(T0, PARTITIONS, [1, 2, 3, 4, 5, 6])
    assert history.total(T0, T0 + W) == _expected(rows, T0, T0 + W)
    history.add(T0, PARTITIONS, [1, 2, 3, 4, 5, 6])  # and once only
    assert history.total(T0, T0 + 2 * W) == _expected(rows, T0, T0 + 2 * W)


@pytest.mark.parametrize("age", [0, KEEP_PARTS_MS // 2])
def test_a_recent_copy_that_differs_replaces_the_one_it_repeats(age: int) -> None:
    history = SliceHistory(WIDTH)
    rows: dict[tuple[int, int], list[int]] = {}
    _fill(history, rows, days=0.25)
    newest = max(start for start, _ in rows)
    start = newest - age
    rows[start, 3] = [7] * WIDTH
    history.add(start, 3, [7] * WIDTH)
    assert history.rows(start, start + W) == [(start, _expected(rows, start, start + W))]
    assert history.total(T0, newest + W) == _expected(rows, T0, newest + W)


def test_forgotten_windows_forget_their_partitions_too() -> None:
    """Dropped starts are gone; the same window added afterwards counts anew (it is a
    new history from there)."""
    history = SliceHistory(WIDTH)
    rows: dict[tuple[int, int], list[int]] = {}
    _fill(history, rows, days=0.5)
    history.drop_before(T0 + W)
    assert history.starts[0] == T0 + W
    history.add(T0, 0, list(rows[T0, 0]))
    assert history.total(T0, T0 + W) == rows[T0, 0]
