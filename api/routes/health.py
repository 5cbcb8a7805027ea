"""Liveness and readiness probes."""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel

from api.request_context import current_context
from api.schemas import ModelInfo
from api.scoring import FraudScorer
from api.serving_client import ServingError, ServingUnavailable

router = APIRouter(tags=["health"])


class Liveness(BaseModel):
    status: str


class Readiness(BaseModel):
    status: str
    model: ModelInfo


@router.get("/healthz", response_model=Liveness)
async def healthz() -> Liveness:
    """The process is alive and its event loop answers. Never calls serving."""
    return Liveness(status="ok")


@router.get(
    "/readyz",
    response_model=Readiness,
    responses={503: {"description": "Serving is unreachable or has no AVAILABLE version."}},
)
async def readyz(request: Request) -> Readiness:
    """Ready when serving reports a version of the fraud model AVAILABLE.

    Reads model status afresh on every call (no cache), so a probe sees serving go
    down and come back, within the request's deadline. Every failure, a timeout
    included, is answered 503 `serving_unavailable` in the error shape of `api.errors`:
    a probe only needs "not ready", and 503 is what orchestrators expect.
    """
    scorer: FraudScorer = request.app.state.fraud_scorer
    scorer.latest.invalidate()
    try:
        version = await scorer.latest.get(current_context().deadline)
    except ServingUnavailable:
        raise
    except ServingError as exc:
        raise ServingUnavailable(f"not ready: {exc.message}", target=exc.target) from exc
    return Readiness(status="ready", model=ModelInfo(name=scorer.model_name, version=version))
