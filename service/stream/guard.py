"""The timestamp guard: an event time before the epoch, or further ahead of the clock
than ``max_future_skew`` allows, is refused (it would hold a window open, or move the
watermark past everything else)."""

from __future__ import annotations

from service.errors import EventError


def timestamp_refusal(ts_ms: int, now_ms: int, max_future_skew_ms: int) -> EventError | None:
    """The error for an event at ``ts_ms`` read at ``now_ms``, or None if it is accepted."""
    if ts_ms < 0:
        return EventError(
            "timestamp_before_epoch",
            "timestamp is before 1970-01-01T00:00:00Z; send RFC 3339 with an offset "
            "or Unix epoch seconds",
        )
    ahead = ts_ms - now_ms
    if ahead > max_future_skew_ms:
        return EventError(
            "future_timestamp",
            f"timestamp is {ahead / 1000:.0f} s ahead of the clock (limit "
            f"{max_future_skew_ms / 1000:.0f} s, max_future_skew); "
            "check the producer's clock and time zone",
        )
    return None
