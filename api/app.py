"""The API's app factory and composition root.

    uvicorn --factory api.app:create_app          # one process
    gunicorn -c gunicorn.conf.py 'api.app:create_app()'

Nothing happens at import time: settings are read, and the httpx client is created,
inside `create_app` and the lifespan, i.e. in each worker after fork.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from fastapi import FastAPI

from api.errors import install_error_handlers
from api.routes import fraud, health
from api.scoring import FraudScorer
from api.serving_client import RestServingClient
from api.settings import Settings


def _http_client(settings: Settings) -> httpx.AsyncClient:
    """The one shared client to serving: base URL, timeouts and pool from settings."""
    return httpx.AsyncClient(
        base_url=str(settings.serving_url).rstrip("/"),
        timeout=httpx.Timeout(settings.serving_timeout_s, connect=settings.serving_connect_timeout_s),
        limits=httpx.Limits(
            max_connections=settings.serving_max_connections,
            max_keepalive_connections=settings.serving_max_connections,
        ),
    )


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the FastAPI app.

    Args:
        settings: configuration; read from the environment when None.
    """
    settings = settings if settings is not None else Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with _http_client(settings) as http:
            app.state.fraud_scorer = FraudScorer(
                RestServingClient(http),
                model_name=settings.fraud_model_name,
                signature_name=settings.fraud_signature_name,
                version_ttl_s=settings.model_version_ttl_s,
            )
            yield

    app = FastAPI(
        title="Fraud scoring API",
        version="0.1.0",
        summary="Validates raw transactions, extracts features, awaits the serving tier.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    install_error_handlers(app)
    app.include_router(health.router)
    app.include_router(fraud.router)
    return app
