"""Wires the API's observability into an app: one call at build time, one in the lifespan.

    obs = install_observability(app, settings)      # in create_app: logging, metrics,
                                                    # loop monitor, access log
    async with obs.running(app):                    # in the lifespan: loop monitor and
        yield                                       # score-event writer run; drained at exit

After `running` has entered, `app.state.metrics` is the `ApiMetrics`,
`app.state.events` the `api.observability.events.EventPublisher` routes publish score events to,
and `app.state.payload_capture` the `api.observability.payload_capture.PayloadCapturer` (None
without `PAYLOAD_CAPTURE__URL`).
Nothing here does I/O at build time: the event sink's file or HTTP client, the loop
monitor's thread and the tracer provider's export thread are made in the lifespan, inside
each worker after gunicorn's fork.

Tracing (`api.observability.tracing`) is built only when the `OTEL_*` variables turn it on
(`otel_tracing.tracing_enabled`); otherwise `Observability.tracing` is None and OpenTelemetry
is never imported.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httpx
from fastapi import FastAPI

from api.config.settings import Settings
from api.observability.events import EventPublisher, EventSink, HttpSink, JsonlFileSink, ScoreEvent
from api.observability.logging_config import AccessLog, configure_logging
from api.observability.loop_monitor import LoopMonitor
from api.observability.metrics import ApiMetrics
from api.observability.payload_capture import PayloadCapturer
from otel_tracing import check_config, tracing_enabled

if TYPE_CHECKING:
    from api.observability.tracing import Tracing


@dataclass(frozen=True)
class Observability:
    """The observability parts of one app, built by `install_observability`."""

    settings: Settings
    metrics: ApiMetrics
    loop_monitor: LoopMonitor
    access_log: AccessLog
    tracing: Tracing | None = None

    def _event_sink(self) -> EventSink[ScoreEvent]:
        s = self.settings
        if s.events_http_url is not None:
            client = httpx.AsyncClient(
                timeout=httpx.Timeout(s.events_http_timeout_s, connect=s.serving_connect_timeout_s),
                limits=httpx.Limits(max_connections=4, max_keepalive_connections=4),
            )
            return HttpSink(
                client, str(s.events_http_url), retry_budget_s=3 * s.events_http_timeout_s
            )
        return JsonlFileSink(s.events_jsonl_path)

    def payload_capturer(self) -> PayloadCapturer | None:
        """The payload capture's queue and sink when `PAYLOAD_CAPTURE__URL` is set (made in the lifespan)."""
        settings = self.settings.payload_capture
        return PayloadCapturer(settings, self.metrics) if settings.url is not None else None

    @asynccontextmanager
    async def running(self, app: FastAPI) -> AsyncIterator[None]:
        """Run the loop monitor and the score-event writer for the app's lifetime.

        On exit (shutdown, after the server has finished in-flight requests) every
        queued event is written before the sink is closed.
        """
        s = self.settings
        events = EventPublisher(
            self._event_sink(),
            self.metrics,
            max_queue=s.events_max_queue,
            batch_size=s.events_batch_size,
            linger_s=s.events_linger_s,
        )
        app.state.events = events
        events.start()
        capture = self.payload_capturer()
        app.state.payload_capture = capture
        if capture is not None:
            capture.start()
        await self.loop_monitor.start()
        if self.tracing is not None:
            self.tracing.start()
        try:
            yield
        finally:
            await self.loop_monitor.stop()
            await events.aclose()
            if capture is not None:
                await capture.aclose()
            if self.tracing is not None:
                self.tracing.shutdown()  # exports the spans still queued


def install_observability(app: FastAPI, settings: Settings) -> Observability:
    """Configure JSON logging, make the metrics, loop monitor and access log.

    Call once per app, before it serves; `api.request.middleware.RequestMiddleware` records into
    the parts returned, and `GET /metrics` (`api.routes.metrics`) reads `app.state.metrics`.
    """
    configure_logging(level=settings.log_level)
    metrics = ApiMetrics()
    monitor = LoopMonitor(
        metrics,
        interval_s=settings.loop_monitor_interval_s,
        threshold_s=settings.loop_block_threshold_s,
    )
    app.state.metrics = metrics
    return Observability(
        settings=settings,
        metrics=metrics,
        loop_monitor=monitor,
        access_log=AccessLog(enabled=settings.access_log),
        tracing=load_tracing(),
    )


def load_tracing() -> Tracing | None:
    """The API's `Tracing` when the `OTEL_*` variables turn it on, else None (nothing imported).

    Raises:
        otel_tracing.TracingConfigError: an exporter or OTLP protocol that cannot be served.
        ImportError: tracing is on but the `api-tracing` extra is not installed (the message says so).
    """
    if not tracing_enabled():
        return None
    check_config()
    try:
        from api.observability.tracing import Tracing
    except ImportError as exc:
        raise ImportError(
            f"OTEL_* variables turn tracing on, but OpenTelemetry is not installed ({exc}): "
            "pip install 'tfserve-split[api-tracing]', or unset OTEL_EXPORTER_OTLP_ENDPOINT"
        ) from exc
    return Tracing()
