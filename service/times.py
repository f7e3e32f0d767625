"""Time helpers: timezone-aware UTC, held as integer epoch milliseconds (names end in ``_ms``).

One module for every conversion the service makes: the wall clock, RFC 3339 parsing and
formatting, durations (``90s``, ``5m``, ``1h``, ``2d``) and their labels.
"""

from __future__ import annotations

import functools
import re
import time
from dataclasses import field
from datetime import UTC, datetime, timedelta

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)
SECOND_MS = 1000
MINUTE_MS = 60 * SECOND_MS
HOUR_MS = 60 * MINUTE_MS
DAY_MS = 24 * HOUR_MS
_UNITS_MS = {"ms": 1, "s": SECOND_MS, "m": MINUTE_MS, "h": HOUR_MS, "d": DAY_MS}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")


def wall_ms() -> int:
    """Wall-clock milliseconds since the epoch (the default clock; tests inject their own)."""
    return time.time_ns() // 1_000_000


def to_epoch_ms(moment: datetime) -> int:
    """Integer milliseconds since the Unix epoch (sub-millisecond digits are floored)."""
    return (moment - EPOCH) // _MS


def parse_aware_ms(text: str) -> int | None:
    """Epoch milliseconds of an RFC 3339 time with a UTC offset; None for anything else."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    return None if moment.tzinfo is None else to_epoch_ms(moment)


@functools.lru_cache(maxsize=4096)
def rfc3339(ms: int) -> str:
    """``2026-12-02T08:00:00Z`` (milliseconds shown only when not zero). Cached: window
    bounds are formatted again and again (every window record and key, one start shared by
    every retriever, segment and partition), and ``strftime`` is slow."""
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    if ms % 1000:
        return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339_millis(ms: int) -> str:
    """RFC 3339 UTC always with milliseconds, e.g. ``2026-12-01T00:00:00.123Z`` (events)."""
    seconds, millis = divmod(ms, 1000)
    return f"{datetime.fromtimestamp(seconds, UTC):%Y-%m-%dT%H:%M:%S}.{millis:03d}Z"


def parse_duration_ms(value: object) -> int:
    """``90s``, ``5m``, ``1h``, ``2d``, ``250ms`` or a number of seconds -> milliseconds."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as 90s, 5m, 1h, 2d, got {value!r}")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"a duration cannot be negative, got {value!r}")
        return round(value * 1000)
    match = _DURATION.match(str(value))
    if not match:
        raise ValueError(
            f"expected a duration such as 90s, 5m, 1h, 2d or a number of seconds, got {value!r}"
        )
    number, unit = match.groups()
    return round(float(number) * _UNITS_MS[unit or "s"])


WRITTEN = "written"
"""The metadata key of a dataclass field defaulting to a duration: the text it is written as
(the settings show it in ``--help`` and parse it like a given value)."""


def duration_field(text: str) -> int:
    """A dataclass field whose default is the duration ``text`` in milliseconds."""
    return field(default=parse_duration_ms(text), metadata={WRITTEN: text})


def durations_field(text: str) -> tuple[int, ...]:
    """A dataclass field whose default is the comma-separated durations ``text`` in ms."""
    spans = tuple(parse_duration_ms(item) for item in text.split(","))
    return field(default=spans, metadata={WRITTEN: text})


def duration_label(span_ms: int) -> str:
    """``15m``, ``1h``, ``24h``: a span as a label value (the ``window`` of a rolling view)."""
    if span_ms % HOUR_MS == 0:
        return f"{span_ms // HOUR_MS}h"
    if span_ms % MINUTE_MS == 0:
        return f"{span_ms // MINUTE_MS}m"
    return f"{span_ms // SECOND_MS}s"
