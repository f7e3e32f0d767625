"""The detector as it was before the sequential tests, for the benchmark's comparison.

A one-sided Welch t-test repeated at every window boundary, Holm-corrected within two
families per boundary (deploy at alpha 0.005, drift at 0.001), with the same guards as
today (200 labelled queries a side, a 0.02 minimum drop, one hour of hysteresis):

* deploy: everything the new version served since its first window, against the
  previous version's last 24 h before the switch (frozen);
* drift: a version's last hour against its own preceding 24 h.

It is valid per look, not over time: ``bench_detector.py`` measures what that costs.
"""

from __future__ import annotations

from collections.abc import Iterable

from service.detect.history import SliceHistory
from service.metrics.aggregates import Moments
from service.metrics.stats import holm_adjust, welch_test
from service.stream.windows import ClosedWindow, SliceKey
from service.times import DAY_MS, HOUR_MS

METRICS = ("recall@5", "hit_rate@5", "mrr", "ndcg@10")
ALPHA, DRIFT_ALPHA, MIN_LABELLED, MIN_EFFECT = 0.005, 0.001, 200, 0.02
Alarm = tuple[str, str, str, int, str]
"""(retriever, segment, metric, opened_ms, kind)."""


def _moments(row: list[int], i: int) -> Moments:
    return Moments(row[3 * i], row[3 * i + 1], row[3 * i + 2])


def per_look_alarms(
    windows: Iterable[ClosedWindow], previous: dict[str, str], window_ms: int, attribution_ms: int
) -> list[Alarm]:
    """Every regression the per-look detector opens; ``previous`` maps a new version to
    the one it replaces (a version without an entry is never a deploy)."""
    series: dict[SliceKey, SliceHistory] = {}
    for w in windows:
        row: list[int] = []
        for name in METRICS:
            m = w.metrics.get(name, Moments())
            row += (m.count, m.sum_fx, m.sum_sq_fx)
        series.setdefault((w.retriever, w.segment), SliceHistory(3 * len(METRICS))).add(
            w.start_ms, w.partition, row
        )
    starts = sorted({s for h in series.values() for s in h.starts})
    if not starts:
        return []
    open_until: dict[tuple[str, str, str, str], int] = {}
    alarms: list[Alarm] = []
    frozen: dict[SliceKey, list[int]] = {}
    for boundary in range(starts[0] + window_ms, starts[-1] + 2 * window_ms, window_ms):
        plans: list[tuple[str, tuple[str, str, str, str], Moments, Moments]] = []
        for key, history in series.items():
            first = history.first_start_ms
            assert first is not None
            candidate = history.total(boundary - HOUR_MS, boundary)
            drift = history.total(boundary - HOUR_MS - DAY_MS, boundary - HOUR_MS)
            sides = [("drift", "previous_24h", drift, candidate)]
            old = series.get((previous.get(key[0], ""), key[1]))
            if old is not None and first + window_ms <= boundary <= first + DAY_MS:
                base = frozen.setdefault(key, old.total(first - DAY_MS, first))
                sides.append(("deploy", previous[key[0]], base, history.total(first, boundary)))
            for i, metric in enumerate(METRICS):
                for kind, label, b_row, c_row in sides:
                    b, c = _moments(b_row, i), _moments(c_row, i)
                    if min(b.count, c.count) >= MIN_LABELLED:
                        plans.append((kind, (*key, metric, label), b, c))
        results = [
            welch_test(
                (b.mean or 0.0, b.variance or 0.0, b.count),
                (c.mean or 0.0, c.variance or 0.0, c.count),
            )
            for _, _, b, c in plans
        ]
        adjusted = [1.0] * len(plans)
        for family in ("deploy", "drift"):
            members = [i for i, plan in enumerate(plans) if plan[0] == family]
            raw = [results[i].p_lower for i in members]
            for i, p in zip(members, holm_adjust(raw), strict=True):
                adjusted[i] = p
        for (kind, key4, _, _), r, p in zip(plans, results, adjusted, strict=True):
            level = ALPHA if kind == "deploy" else DRIFT_ALPHA
            if p < level and -r.delta >= MIN_EFFECT:
                if key4 not in open_until or open_until[key4] < boundary:
                    alarms.append((key4[0], key4[1], key4[2], boundary + attribution_ms, kind))
                open_until[key4] = boundary + HOUR_MS  # hysteresis: open while tested again
    return alarms
