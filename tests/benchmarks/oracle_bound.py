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
  beside the new one for a canary, over the same hours one day earlier otherwise;
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

from service.detect.model import LABELLED_SHARE, DetectorConfig
from service.detect.trend import WindowRow, trend_moments
from service.metrics.aggregates import SCALE
from service.stream.windows import ClosedWindow
from service.times import DAY_MS

Moments3 = tuple[int, float, float]
"""count, sum, sum of squares."""


def _totals(windows: Iterable[ClosedWindow], metric: str) -> Moments3:
    n, s, q = 0, 0.0, 0.0
    for w in windows:
        if metric == LABELLED_SHARE:  # one 0/1 value per finalised query
            n, s, q = n + w.queries, s + w.labelled, q + w.labelled
        else:
            m = w.metrics.get(metric)
            if m is not None:
                n, s, q = n + m.count, s + m.sum, q + m.sum_sq
    return n, s, q


def _mean_var(t: Moments3) -> tuple[float, float] | None:
    n, s, q = t
    if n < 2:
        return None
    mean = s / n
    return mean, max(0.0, (q - n * mean * mean) / (n - 1))


def oracle_z(
    windows: Sequence[ClosedWindow],
    candidate: str,
    previous: str,
    event_ms: int,
    concurrent: bool,
    delay_ms: int,
    maturity_ms: int,
    metric: str,
) -> tuple[float, float] | None:
    """The (day, known) z statistics of candidate minus baseline (negative: worse) at
    ``delay_ms`` after the event, pooled over segments; None without data."""
    end = event_ms + delay_ms - maturity_ms
    start = event_ms - event_ms % 300_000
    cand = [
        w for w in windows if w.retriever == candidate and start <= w.start_ms and w.end_ms <= end
    ]
    shift = 0 if concurrent else DAY_MS
    base = [
        w
        for w in windows
        if w.retriever == previous
        and start - shift <= w.start_ms
        and w.end_ms <= end - shift
        and (not concurrent or w.start_ms >= start + 300_000)  # not the switch's window
    ]
    if not concurrent and not base:  # no day of history: the detector's trend
        return _trend_z(windows, cand, previous, start, end, metric)
    cand_totals, base_totals = _totals(cand, metric), _totals(base, metric)
    c, b = _mean_var(cand_totals), _mean_var(base_totals)
    if c is None or b is None:
        return None
    nc, nb = cand_totals[0], base_totals[0]
    se_day = math.sqrt(c[1] / nc + b[1] / nb)
    se_known = math.sqrt(c[1] / nc)
    if se_day == 0 or se_known == 0:
        return None
    delta = c[0] - b[0]
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
    c = _mean_var(_totals(cand, metric))
    if c is None or base.mean is None or base.variance is None:
        return None
    nc = _totals(cand, metric)[0]
    se_trend = math.sqrt(c[1] / nc + base.variance / base.count)
    se_known = math.sqrt(c[1] / nc)
    if se_known == 0:
        return None
    delta = c[0] - base.mean
    return delta / se_trend, delta / se_known


def power(zs: Sequence[float | None], alpha: float) -> float:
    """Share of runs whose one-sided test at ``alpha`` rejects (None: not rejected)."""
    crit = -statistics.NormalDist().inv_cdf(1 - alpha)
    return sum(1 for z in zs if z is not None and z <= crit) / len(zs) if zs else 0.0
