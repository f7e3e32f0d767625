"""Which version a new one replaces: the deploy of a slice, decided once its first window
is closed (:meth:`service.detect.detector.Detector._deploy`)."""

from __future__ import annotations

from collections.abc import Mapping

from service.detect.history import SliceHistory
from service.detect.model import Deploy, DetectorConfig
from service.stream.windows import SliceKey
from service.times import DAY_MS


def find_previous(
    series: Mapping[SliceKey, SliceHistory], key: SliceKey, at: int, cfg: DetectorConfig
) -> Deploy | None:
    """The deploy of ``key``'s version, first seen at ``at``: the version of its segment
    with most labelled queries in the ``candidate_ms`` before it (None: no such version,
    or a version seen within the first hour of any history, a start, not a deploy)."""
    best: tuple[int, str] | None = None
    history_from = None
    for (retriever, segment), other in series.items():
        if segment != key[1] or retriever == key[0]:
            continue
        first = other.first_start_ms
        if first is not None and (history_from is None or first < history_from):
            history_from = first
        recent = other.total(at - cfg.candidate_ms, at)
        labelled = max(recent[0::3], default=0)
        if labelled and (best is None or (labelled, retriever) > best):
            best = (labelled, retriever)
    # a version seen within the first hour of any history is not a deploy but a start
    if best is None or history_from is None or history_from > at - cfg.candidate_ms:
        return None
    previous = series[best[1], key[1]]
    daily = previous.first_start_ms is not None and previous.first_start_ms <= at - DAY_MS
    return Deploy(best[1], at, daily)
