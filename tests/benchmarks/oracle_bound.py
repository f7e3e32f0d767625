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
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence

from service.detect.model import LABELLED_SHARE
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


def power(zs: Sequence[float | None], alpha: float) -> float:
    """Share of runs whose one-sided test at ``alpha`` rejects (None: not rejected)."""
    crit = -statistics.NormalDist().inv_cdf(1 - alpha)
    return sum(1 for z in zs if z is not None and z <= crit) / len(zs) if zs else 0.0
