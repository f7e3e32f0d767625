"""Reading a benchmark's printed figures back, for the smoke tests of the benchmark scripts."""

from __future__ import annotations

import math
import re

_NUMBER = r"(-?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?)"


def figure(out: str, label: str) -> float:
    """The number printed right after ``label`` (``label: 0.412 (target ...)``).

    It must be there, finite and positive: a benchmark that prints ``nan``, ``0`` or a
    negative ratio is broken even when it ran to the end.
    """
    match = re.search(re.escape(label) + r":?\s*" + _NUMBER, out)
    assert match is not None, f"{label!r} is not followed by a number in:\n{out}"
    value = float(match.group(1).replace(",", ""))
    assert math.isfinite(value), f"{label}: {value} is not finite"
    assert value > 0, f"{label}: {value} is not positive"
    return value
