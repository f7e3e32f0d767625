"""What the HTTP routers share: the service state dependency and parameter parsing."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request

from service.core.state import ServiceState
from service.times import parse_duration_ms

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


def get_state(request: Request) -> ServiceState:
    """The service state of the app that received the request."""
    service: ServiceState = request.app.state.service
    return service


State = Annotated[ServiceState, Depends(get_state)]
