"""Liveness and readiness probes."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel
from starlette.responses import Response

from api.request.context import current_context
from api.request.errors import RETRY_AFTER_S, error_response
from api.routes.model_endpoint import ModelEndpoint

router = APIRouter(tags=["health"])


class Liveness(BaseModel):
    status: str


class ModelState(BaseModel):
    ready: bool
    model: str
    signature: str
    version: int | None
    problems: list[str]
    # Each target of the route's rollout (`api.rollouts`), when it has more than the default one.
    rollout: dict[str, Any] | None = None


class Readiness(BaseModel):
    status: str
    models: dict[str, ModelState]


@router.get("/healthz", response_model=Liveness)
async def healthz() -> Liveness:
    """The process is alive and its event loop answers. Never calls serving."""
    return Liveness(status="ok")


@router.get(
    "/readyz",
    response_model=Readiness,
    # `rollout` is reported for a route with more than the default target only.
    response_model_exclude_none=True,
    responses={
        503: {
            "description": "A model route is not ready: the error shape (`serving_unavailable`, detail "
            "'not ready: ...') plus `models`, each route's state and problems."
        }
    },
)
async def readyz(request: Request) -> Readiness | Response:
    """Ready when every enabled model route is (`api.inference.readiness`): its model has a version
    AVAILABLE with the signature, inputs and outputs the route declares; for a route with a
    rollout (`api.rollouts`), its stable target, and its canary while the canary's weight is
    above 0. Each target of a rollout is reported under `rollout` (stable, canary with its
    weight, shadow with its rate).

    Reads serving afresh on every call (no cache), within the request's deadline, so a probe
    sees serving go down and come back. 200 with each route's state; else 503 in the error
    shape of `api.request.errors` (code `serving_unavailable`, `Retry-After`), with the same
    `models` report: which routes are not ready and why.
    """
    endpoints: list[ModelEndpoint] = request.app.state.model_endpoints
    deadline = current_context().deadline
    reports = await asyncio.gather(*(e.rollout.readiness(deadline) for e in endpoints))
    models: dict[str, Any] = {
        state.route: {**state.as_json(), **({"rollout": targets} if targets is not None else {})}
        for state, targets in reports
    }
    states = [state for state, _ in reports]
    not_ready = [state for state in states if not state.ready]
    if not not_ready:
        return Readiness(status="ready", models=models)
    reasons = "; ".join(f"{state.route}: {state.problems[0]}" for state in not_ready)
    return error_response(
        503,
        "serving_unavailable",
        f"not ready: {reasons}",
        {"Retry-After": str(RETRY_AFTER_S)},
        extra={"models": models},
    )
