"""Hand-built closed windows for the unit tests of windows and views."""

from __future__ import annotations

from service.metrics.aggregates import Moments
from service.stream.windows import ClosedWindow

W = 300_000
T0 = 1_796_083_200_000


def window(start: int, labelled: int, partition: int = 0) -> ClosedWindow:
    """A window of ``v1``/``docs`` with ``labelled`` queries of MRR 0.5 and one unlabelled."""
    metric = Moments(labelled, labelled * (1 << 51), labelled * (1 << 50))  # each value 0.5
    return ClosedWindow(
        "v1", "docs", partition, start, start + W, labelled + 1, labelled, {"mrr": metric}
    )
