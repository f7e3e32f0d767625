"""What the HTTP routers share: the service state dependency and parameter parsing."""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import Depends, HTTPException, Request

from service.core.state import ServiceState
from service.times import duration_label, parse_aware_ms, parse_duration_ms

MAX_SPAN_MS = 366 * 86_400_000


def span_ms(window: str) -> int:
    """A ``window`` parameter (``24h``) in milliseconds, or a 422."""
    try:
        span = parse_duration_ms(window)
    except ValueError as error:
        raise HTTPException(status_code=422, detail=f"window: {error}") from None
    if not 0 < span <= MAX_SPAN_MS:
        raise HTTPException(status_code=422, detail="window must be between 1s and 366d")
    return span


def kept_span_ms(window: str, retention_ms: int) -> int:
    """:func:`span_ms`, or a 422 beyond ``retention_ms`` (the longest rolling window, all
    the view keeps: a longer span would silently hold less than it says)."""
    span = span_ms(window)
    if span > retention_ms:
        raise HTTPException(
            status_code=422,
            detail=f"window must be at most {duration_label(retention_ms)} (the longest "
            "rolling window kept); raise ROLLING_WINDOWS to look over longer spans",
        )
    return span


_EPOCH_SECONDS = re.compile(r"[0-9]{1,12}(\.[0-9]{0,9})?")


def since_param(since: str | None) -> int | None:
    """A ``since`` parameter (RFC 3339 with an offset, or Unix epoch seconds) in
    milliseconds, None when absent, or a 422."""
    if since is None or since == "":
        return None
    if _EPOCH_SECONDS.fullmatch(since):  # ASCII digits only: "²".isdigit() is True
        return round(float(since) * 1000)
    since_ms = parse_aware_ms(since)
    if since_ms is None:
        raise HTTPException(
            status_code=422,
            detail="since must be RFC 3339 with a UTC offset (2026-12-02T08:00:00Z) "
            "or Unix epoch seconds",
        )
    return since_ms


def get_state(request: Request) -> ServiceState:
    """The service state of the app that received the request."""
    service: ServiceState = request.app.state.service
    return service


State = Annotated[ServiceState, Depends(get_state)]
