"""The API's app factory and composition root.

    uvicorn --factory api.app:create_app          # one process
    gunicorn -c gunicorn.conf.py 'api.app:create_app()'

Nothing happens at import time: settings are read inside `create_app`, and the
serving client (HTTP/1.1 connection pools or gRPC channels, `api.serving_client.open_serving_client`)
is created in the lifespan, i.e. in each worker after fork, inside its event loop.

Middleware: one, `api.middleware.RequestMiddleware`, owns each request's context, limits,
timing and error answer; FastAPI's own validation and HTTP errors are answered in the
same shape by the handlers of `api.errors`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from fastapi import FastAPI

from api.cpu_budget import available_cpus
from api.digits import DigitClassifier
from api.errors import install_error_handlers
from api.limits import Limits
from api.middleware import RequestMiddleware
from api.observability import install_observability
from api.request_context import outgoing_headers
from api.routes import digits, fraud, health
from api.scoring import FraudScorer, ServedModel
from api.serving_client import open_serving_client
from api.settings import Settings


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the FastAPI app.

    Args:
        settings: configuration; read from the environment when None.
    """
    settings = settings if settings is not None else Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with open_serving_client(settings.serving_client_config(), metadata=outgoing_headers) as client:
            app.state.serving_client = client
            app.state.fraud_scorer = FraudScorer(
                ServedModel(
                    client,
                    model_name=settings.fraud_model_name,
                    signature_name=settings.fraud_signature_name,
                    version_ttl_s=settings.model_version_ttl_s,
                    status_timeout_s=settings.serving_timeout_s,
                )
            )
            app.state.digit_classifier = DigitClassifier(
                ServedModel(
                    client,
                    model_name=settings.digits_model_name,
                    signature_name=settings.digits_signature_name,
                    version_ttl_s=settings.model_version_ttl_s,
                    status_timeout_s=settings.serving_timeout_s,
                )
            )
            # CPU-bound request work (image decoding) runs in threads, at most one per
            # usable CPU at a time (api.routes.digits).
            app.state.cpu_limiter = anyio.CapacityLimiter(available_cpus())
            async with observability.running(app):
                yield

    app = FastAPI(
        title="Fraud scoring API",
        version="0.1.0",
        summary="Validates raw transactions, extracts features, awaits the serving tier.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    install_error_handlers(app)
    observability = install_observability(app, settings)
    app.add_middleware(
        RequestMiddleware,
        limits=Limits(
            max_in_flight=settings.max_in_flight_requests,
            request_timeout_s=settings.request_timeout_s,
            max_body_bytes=settings.max_body_bytes,
            path_body_limits={"/v1/digits/classify": digits.max_body_size(settings)},
        ),
        metrics=observability.metrics,
        loop_monitor=observability.loop_monitor,
        access_log=observability.access_log,
    )
    app.include_router(health.router)
    app.include_router(fraud.router)
    app.include_router(digits.router)
    return app
