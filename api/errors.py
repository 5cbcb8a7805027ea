"""How errors leave the API: one table, one handler, FastAPI's `{"detail": ...}` shape.

Validation errors keep FastAPI's 422 format. Serving-tier failures are mapped here,
and only here, from `api.serving_client.ServingError` subclasses to HTTP statuses.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from api.serving_client import (
    ServingError,
    ServingNotFound,
    ServingRejected,
    ServingTimeout,
    ServingUnavailable,
)

# Most specific class first. A missing model or a rejected request at serving is the
# deployment's fault, not the caller's, so those are 5xx as well.
SERVING_ERROR_STATUS: tuple[tuple[type[ServingError], int], ...] = (
    (ServingTimeout, 504),
    (ServingUnavailable, 503),
    (ServingNotFound, 503),
    (ServingRejected, 502),
)


def status_for(exc: ServingError) -> int:
    """HTTP status for a serving failure (503 when no row matches)."""
    for cls, status in SERVING_ERROR_STATUS:
        if isinstance(exc, cls):
            return status
    return 503


async def _serving_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ServingError)
    return JSONResponse(
        status_code=status_for(exc),
        content={"detail": f"serving tier: {exc.message}"},
    )


def install_error_handlers(app: FastAPI) -> None:
    """Register the serving-error handler on `app` (once, for every route)."""
    app.add_exception_handler(ServingError, _serving_error_handler)
