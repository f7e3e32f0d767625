"""HTTP (FastAPI): ``/``, ``/metrics``, health, readiness, rolling metrics, closed windows
(the detector's routes: :mod:`service.http.regressions`; the audited estimates:
:mod:`service.http.estimates`).

Built by an app factory around a :class:`~service.core.state.ServiceState`; handlers read
the pipeline under its lock and copy what they need, so a slow client never holds the
processing loop. Bad query parameters get a 422 with a message, never a 500.
``/metrics`` is prometheus_client's own exposition: the text format, or OpenMetrics
when the scraper asks for it, gzip-compressed when it accepts gzip.
"""

from __future__ import annotations

import gzip
import html
from typing import Annotated

from fastapi import FastAPI, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client.exposition import choose_encoder, gzip_accepted
from pydantic import BaseModel

from service import __version__
from service.core.state import ServiceState
from service.http.deps import State, since_param, span_ms
from service.http.estimates import router as estimates_router
from service.http.exporter import build_registry
from service.http.health import broker_unready, liveness
from service.http.judges import router as judges_router
from service.http.regressions import router as regressions_router
from service.metrics.aggregates import Moments
from service.stream.rolling import SliceTotals
from service.times import duration_label as span_label
from service.times import rfc3339


class MetricValue(BaseModel):
    """Mean over labelled queries with its 95% Student-t interval (None without data)."""

    n: int
    mean: float | None
    ci_low: float | None
    ci_high: float | None


class SliceView(BaseModel):
    """One (retriever, segment) over a span of closed windows."""

    retriever: str
    segment: str
    queries: int
    labelled: int
    unlabelled_ratio: float | None
    source_labelled_share: dict[str, float | None]
    """Per label source (``click``, ``citation``, ``judgment``): the finalised queries with
    a relevant label from it / the finalised queries (None without queries)."""
    metrics: dict[str, MetricValue]


class RollingResponse(BaseModel):
    """``GET /api/v1/rolling``."""

    window: str
    watermark: str | None
    slices: list[SliceView]


class WindowItem(SliceView):
    """A closed window merged over partitions."""

    window_start: str
    window_end: str


class WindowsResponse(BaseModel):
    """``GET /api/v1/windows``."""

    windows: list[WindowItem]


def _value(moments: Moments) -> MetricValue:
    estimate = moments.estimate()
    if estimate is None:
        return MetricValue(n=moments.count, mean=None, ci_low=None, ci_high=None)
    return MetricValue(
        n=moments.count, mean=estimate.mean, ci_low=estimate.ci_low, ci_high=estimate.ci_high
    )


def _slice(retriever: str, segment: str, totals: SliceTotals, keys: tuple[str, ...]) -> SliceView:
    empty = Moments()
    return SliceView(
        retriever=retriever,
        segment=segment,
        queries=totals.queries,
        labelled=totals.labelled,
        unlabelled_ratio=totals.unlabelled_ratio,
        source_labelled_share=totals.source_labelled_share,
        metrics={key: _value(totals.metrics.get(key, empty)) for key in keys},
    )


ROUTES = {
    "/metrics": "every Prometheus series (which are per replica, which global: docs/streaming.md)",
    "/healthz": "the processing loop is alive",
    "/readyz": "partitions assigned, polling recently and the broker reachable (503 with "
    "a reason otherwise)",
    "/api/v1/rolling?window=1h": "rolling metrics per retriever and segment, with 95% intervals",
    "/api/v1/windows": "closed windows (retriever=, segment=, since=)",
    "/api/v1/compare?baseline=A&candidate=B&window=24h": "two versions, metric by metric",
    "/api/v1/regressions": "the open regressions (state=open|closed|all, since=)",
    "/api/v1/tests": "every comparison the detector holds, running or not and why not "
    "(retriever=, segment=)",
    "/api/v1/estimates?window=24h": "audited estimates of the true metrics beside the live "
    "ones, with 95% intervals (retriever=, segment=, metric=)",
    "/api/v1/judges?window=24h": "judge agreement: each pair of judges, and each judge against "
    "the live labels (count, agreement, Cohen's kappa)",
    "/docs": "the OpenAPI documentation of the API",
}
"""What ``GET /`` links."""


def create_app(state: ServiceState) -> FastAPI:
    """The HTTP API over one service state."""
    app = FastAPI(
        title="retrieval-monitor",
        version=__version__,
        description="Live retrieval quality (recall@k, hit rate, MRR, nDCG) from Kafka.",
    )
    app.state.service = state
    app.state.registry = registry = build_registry(state)

    @app.get("/", include_in_schema=False)
    def index(request: Request) -> Response:
        """What this service serves, with links (HTML for a browser, JSON otherwise)."""
        if "text/html" in request.headers.get("accept", ""):
            items = "".join(
                f'<li><a href="{path}">{html.escape(path)}</a>: {html.escape(what)}</li>'
                for path, what in ROUTES.items()
            )
            return HTMLResponse(
                f"<!doctype html><title>retrieval-monitor</title><h1>retrieval-monitor "
                f"{__version__}</h1><ul>{items}</ul>"
            )
        return JSONResponse(
            {
                "service": "retrieval-monitor",
                "version": __version__,
                "links": [{"href": path, "description": what} for path, what in ROUTES.items()],
            }
        )

    @app.get("/metrics", include_in_schema=False)
    def metrics(request: Request) -> Response:
        """Every series, in the format the scraper asks for (``Accept``), gzip if accepted."""
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        body = encoder(registry)
        headers = {}
        if gzip_accepted(request.headers.get("accept-encoding", "")):
            body = gzip.compress(body)
            headers["Content-Encoding"] = "gzip"
        return Response(body, media_type=content_type, headers=headers)

    @app.get("/healthz")
    def healthz(service: State) -> JSONResponse:
        """The processing loop is alive (inside a broker wait, for as long as its bound)."""
        health = service.health
        alive, body = liveness(
            service.wall_ms(),
            service.heartbeat_ms,
            health.wait,
            service.stale_after_ms,
            health.failed,
        )
        return JSONResponse(body, 200 if alive else 503)

    @app.get("/readyz")
    def readyz(service: State) -> JSONResponse:
        """Partitions are assigned, the consumer polled recently and the broker answers."""
        health = service.health
        now = service.wall_ms()
        if health.stopped:
            reason = "stopped: partitions handed over; /metrics shows the final counts"
            return JSONResponse({"ready": False, "reason": reason}, 503)
        broker = broker_unready(now, health.wait, health.unreachable_since_ms)
        if broker is not None:
            return JSONResponse({"ready": False, "reason": broker}, 503)
        if service.needs_assignment and health.assigned == 0:
            return JSONResponse({"ready": False, "reason": "no partitions assigned yet"}, 503)
        if health.last_poll_ms is None or now - health.last_poll_ms > service.stale_after_ms:
            return JSONResponse({"ready": False, "reason": "not polling"}, 503)
        return JSONResponse({"ready": True, "partitions": health.assigned})

    @app.get("/api/v1/rolling")
    def rolling(
        service: State, window: Annotated[str, Query(max_length=20)] = "1h"
    ) -> RollingResponse:
        """Current rolling metrics per retriever and segment, with n and a 95% interval."""
        span = span_ms(window)
        pipeline = service.pipeline
        with service.lock:
            wm = service.view.watermark_ms
            views = {} if wm is None else service.view.closed.rolling(span, wm)
            keys = pipeline.metric_keys
            slices = [_slice(r, s, totals, keys) for (r, s), totals in sorted(views.items())]
        return RollingResponse(
            window=span_label(span), watermark=None if wm is None else rfc3339(wm), slices=slices
        )

    @app.get("/api/v1/windows")
    def windows(
        service: State,
        retriever: Annotated[str | None, Query(max_length=100)] = None,
        segment: Annotated[str | None, Query(max_length=100)] = None,
        since: Annotated[str | None, Query(max_length=40)] = None,
    ) -> WindowsResponse:
        """Closed windows (merged over partitions), oldest first."""
        since_ms = since_param(since)
        pipeline = service.pipeline
        with service.lock:
            rows = service.view.closed.listing(retriever or None, segment or None, since_ms)
            keys = pipeline.metric_keys
            size = pipeline.config.join.window_ms
            out = [
                WindowItem(
                    window_start=rfc3339(start),
                    window_end=rfc3339(start + size),
                    **_slice(r, s, totals, keys).model_dump(),
                )
                for r, s, start, totals in rows
            ]
        return WindowsResponse(windows=out)

    for router in (regressions_router, estimates_router, judges_router):
        app.include_router(router)
    return app
