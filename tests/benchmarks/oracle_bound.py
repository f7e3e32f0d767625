"""How fast could any test find a drop on this traffic? An oracle's one look.

The oracle knows what no detector knows: when the drop happened, which metric shows it
best (chosen once per kind, from all runs) and that it is a drop. It makes one test, at
one time after the event, with one-sided level ``alpha`` (the whole false-alarm budget of
a deploy), on the windows a detector would hold by then: those that ended
``maturity_ms`` before. Its power at a delay bounds the share of runs any valid detector
could have found by that delay with that baseline; a detector must also look often,
watch several metrics and slices, and not know the metric, so it needs more.

Two baselines:

* ``day``: what the detector compares with; the previous version over the same span,
  beside the new one for a canary, otherwise over the same hours of up to
  ``baseline_days`` previous days (as many as the run has), pooled as the detector
  pools them (:mod:`service.detect.days`);
* ``known``: the baseline's mean as if known exactly (only the candidate's variance),
  which no amount of history beats (approximately: the mean is the ``day`` one's).

Without a day of history (``--short``) the ``day`` baseline is the detector's trend
instead (:mod:`service.detect.trend`: one line shared by both versions, a jump at the
switch, fitted on the previous version's windows over at least ``no_history_span_ms``
before the switch); ``known`` then takes the trend's mean with only the candidate's
variance, which is what a test that knew the previous version's mean at the new
version's hours could find (its spread is a little wider than the truth's, as the
trend's mean is estimated).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence

from service.detect.days import pooled_days
from service.detect.model import LABELLED_SHARE, DetectorConfig
from service.detect.trend import WindowRow, trend_moments
from service.metrics.aggregates import SCALE, Moments
from service.stream.windows import ClosedWindow
from service.times import DAY_MS


def _moments(windows: Iterable[ClosedWindow], metric: str) -> Moments:
    """One metric's exact sums over the windows (the labelled share: one 0/1 value per
    finalised query)."""
    total = Moments()
    for _, row in _rows(windows, 0, metric):
        total += Moments(*row)
    return total


def oracle_z(
    windows: Sequence[ClosedWindow],
    candidate: str,
    previous: str,
    event_ms: int,
    concurrent: bool,
    delay_ms: int,
    maturity_ms: int,
    metric: str,
    segment: str | None = None,
) -> tuple[float, float] | None:
    """The (day, known) z statistics of candidate minus baseline (negative: worse) at
    ``delay_ms`` after the event, pooled over segments (or in ``segment`` alone, where a
    drop is known to be); None without data."""
    if segment is not None:
        windows = [w for w in windows if w.segment == segment]
    end = event_ms + delay_ms - maturity_ms
    start = event_ms - event_ms % 300_000
    cand = [
        w for w in windows if w.retriever == candidate and start <= w.start_ms and w.end_ms <= end
    ]
    old = [w for w in windows if w.retriever == previous]
    if concurrent:  # beside it, after the switch's own window
        base = _moments(
            (w for w in old if start + 300_000 <= w.start_ms and w.end_ms <= end), metric
        )
    else:  # its same hours on up to baseline_days previous days, as the detector
        shifts = [d * DAY_MS for d in range(1, DetectorConfig().baseline_days + 1)]
        days = [
            _moments((w for w in old if start - s <= w.start_ms and w.end_ms <= end - s), metric)
            for s in shifts
        ]
        if not any(m.count for m in days):  # no day of history: the detector's trend
            return _trend_z(windows, cand, previous, start, end, metric)
        base = pooled_days(days)
    c = _moments(cand, metric)
    if c.variance is None or base.variance is None or c.mean is None or base.mean is None:
        return None
    se_day = math.sqrt(c.variance / c.count + base.variance / base.count)
    se_known = math.sqrt(c.variance / c.count)
    if se_day == 0 or se_known == 0:
        return None
    delta = c.mean - base.mean
    return delta / se_day, delta / se_known


def _rows(windows: Iterable[ClosedWindow], at_ms: int, metric: str) -> list[WindowRow]:
    """One metric's (count, sum_fx, sum_sq_fx) per window start, timed from ``at_ms``."""
    rows: dict[int, list[int]] = {}
    for w in windows:
        row = rows.setdefault(w.start_ms - at_ms, [0, 0, 0])
        if metric == LABELLED_SHARE:
            row[0] += w.queries
            row[1] += w.labelled * SCALE
            row[2] += w.labelled * SCALE
        elif (m := w.metrics.get(metric)) is not None:
            row[0] += m.count
            row[1] += m.sum_fx
            row[2] += m.sum_sq_fx
    return sorted((start, tuple(row)) for start, row in rows.items())


def _trend_z(
    windows: Sequence[ClosedWindow],
    cand: Sequence[ClosedWindow],
    previous: str,
    start: int,
    end: int,
    metric: str,
) -> tuple[float, float] | None:
    """The (trend, known) z statistics without a day of history: the detector's trend
    over its span (at least ``no_history_span_ms`` before the switch, as long as the
    candidate's after that)."""
    config = DetectorConfig()
    span = max(config.no_history_span_ms, end - start)
    before = [w for w in windows if w.retriever == previous and start - span <= w.start_ms < end]
    window_ms = cand[0].end_ms - cand[0].start_ms if cand else config.window_ms
    base = trend_moments(_rows(before, start, metric), _rows(cand, start, metric), 0, window_ms)
    c = _moments(cand, metric)
    if c.variance is None or c.mean is None or base.mean is None or base.variance is None:
        return None
    se_trend = math.sqrt(c.variance / c.count + base.variance / base.count)
    se_known = math.sqrt(c.variance / c.count)
    if se_known == 0:
        return None
    delta = c.mean - base.mean
    return delta / se_trend, delta / se_known


def power(zs: Sequence[float | None], alpha: float) -> float:
    """Share of runs whose one-sided test at ``alpha`` rejects (None: not rejected)."""
    crit = -statistics.NormalDist().inv_cdf(1 - alpha)
    return sum(1 for z in zs if z is not None and z <= crit) / len(zs) if zs else 0.0
