"""Rolling views merged from blocks of windows are exactly the windows' merge: for random
windows (several partitions, late ones, ones past the retention), spans and ends, every
field of every slice, the audit sums included, equals the plain merge of the windows the
rolling rule picks."""

from __future__ import annotations

import random

import pytest

from service.audit.estimate import AuditSums
from service.metrics.aggregates import Moments
from service.stream.rolling import ClosedWindows, SliceTotals
from service.stream.windows import ClosedWindow

W = 300_000
HOUR = 3_600_000
T0 = 1_796_083_200_000


def _window(rng: random.Random, start: int, slice_: tuple[str, str]) -> ClosedWindow:
    keys = ["mrr", "recall@5"] + (["context_precision"] if rng.random() < 0.5 else [])
    metrics = {
        k: Moments(rng.randint(1, 9), rng.randint(0, 2**60), rng.randint(0, 2**60)) for k in keys
    }
    audit = {
        k: AuditSums.of(rng.random(), 1.0, rng.random(), rng.choice((0.0, 1.0)))
        for k in keys
        if rng.random() < 0.7
    }
    return ClosedWindow(
        *slice_,
        partition=rng.randint(0, 3),
        start_ms=start,
        end_ms=start + W,
        queries=rng.randint(10, 99),
        labelled=rng.randint(0, 9),
        metrics=metrics,
        context_queries=rng.randint(0, 9),
        audit=audit,
        audited=len(audit),
        sources={"click": rng.randint(0, 9), "citation": rng.randint(0, 9), "judgment": 0},
    )


def _naive(
    kept: list[ClosedWindow], span: int, until: int
) -> dict[tuple[str, str], tuple[object, ...]]:
    out: dict[tuple[str, str], SliceTotals] = {}
    for w in kept:
        if until - span < w.end_ms <= until:
            out.setdefault((w.retriever, w.segment), SliceTotals()).add(w)
    return {key: _fields(t) for key, t in out.items()}


def _fields(t: SliceTotals) -> tuple[object, ...]:
    metrics = {k: m for k, m in t.metrics.items() if m.count}
    return (t.queries, t.labelled, metrics, t.context_queries, t.audit, t.sources)


@pytest.mark.parametrize("seed", range(6))
def test_blocks_give_the_windows_merge(seed: int) -> None:
    rng = random.Random(seed)
    retention = 6 * HOUR
    closed = ClosedWindows(W, retention)
    slices = [("v1", "docs"), ("v1", "kb"), ("v2", "docs")]
    added: list[ClosedWindow] = []
    latest = T0
    for _ in range(40):
        batch = []
        for _ in range(rng.randint(1, 12)):
            # mostly recent windows, some late ones (also past the retention)
            back = rng.choice((0, 0, 0, 1, 3, 20, 80, 150))
            start = latest - back * W
            batch.append(_window(rng, start - start % W, rng.choice(slices)))
        latest += rng.randint(0, 6) * W
        closed.add(batch)
        added += batch
        end = max(w.end_ms for w in added)
        horizon = end - retention - W
        kept = [w for w in added if w.start_ms >= horizon]
        for _ in range(4):
            span = rng.choice((15 * 60_000, HOUR, 2 * HOUR + 1, 6 * HOUR))
            until = end - rng.randint(0, 30) * W // 3
            got = {key: _fields(t) for key, t in closed.rolling(span, until).items()}
            assert got == _naive(kept, span, until), (span, until)
