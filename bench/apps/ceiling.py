"""The ceiling: the product's own API, every request answered without a model or a serving tier.

    gunicorn -c gunicorn.conf.py --workers 1 'bench.apps.ceiling:create_app()'

The split's API exactly as `run-server.sh` starts it -- the same app factory
(`api.app.create_app`: the request middleware with its limits, metrics and access log, the
fraud route's validation, feature extraction and score event), the same gunicorn settings
and HTTP server (`gunicorn.conf.py`, `api.http_server`'s worker class) -- except that its
serving client is `NoModelClient`, which answers every Predict at once, in the process,
with zeros. No setup that runs the model behind this API can be faster, so its SLO-RPS is
the ceiling the split is measured against: what is left of the gap is the serving hop and
the model. Answers name the model "none" so that they can never be mistaken for a real
score.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from api.app import create_app as create_api
from api.config.settings import ModelSettings, Settings
from api.model_routes import Signature, TensorSpec
from api.serving_client import (
    Deadline,
    ModelMetadata,
    ModelStatus,
    PredictRequest,
    PredictResponse,
    ServingClient,
    SignatureInfo,
    Tensor,
    TensorInfo,
    VersionStatus,
)
from examples.fraud.route import route as fraud_route

NO_MODEL = "none"
NO_MODEL_VERSION = 1


def _infos(specs: dict[str, TensorSpec]) -> dict[str, TensorInfo]:
    return {name: TensorInfo(spec.dtype, (-1, *spec.shape)) for name, spec in specs.items()}


class NoModelClient:
    """A `ServingClient` with one servable whose every answer is zeros, computed by nothing.

    Model status: version `NO_MODEL_VERSION` AVAILABLE, whatever the name; metadata: the
    declared `signature`, batch dimension -1; predict: each declared output as zeros of
    shape [rows of the request, *declared shape]. Never raises.
    """

    def __init__(self, signature: Signature) -> None:
        self._signature = signature
        self._outputs = dict(signature.outputs)
        self._answers: dict[int, PredictResponse] = {}
        self._metadata = ModelMetadata(
            NO_MODEL_VERSION,
            {signature.signature_name: SignatureInfo(_infos(dict(signature.inputs)), _infos(self._outputs))},
        )

    async def predict(self, request: PredictRequest, deadline: Deadline) -> PredictResponse:
        """Zeros for every declared output, one row per request row (made once per row count,
        so that the ceiling pays nothing for its stand-in model)."""
        rows = next(iter(request.inputs.values())).batch_size
        answer = self._answers.get(rows)
        if answer is None:
            outputs = {
                name: Tensor((rows, *spec.shape), [0.0] * (rows * math.prod(spec.shape)), spec.dtype)
                for name, spec in self._outputs.items()
            }
            answer = self._answers[rows] = PredictResponse(outputs, NO_MODEL_VERSION)
        return answer

    async def model_status(self, model_name: str, deadline: Deadline) -> ModelStatus:
        """One version, AVAILABLE."""
        return ModelStatus((VersionStatus(NO_MODEL_VERSION, "AVAILABLE"),))

    async def model_metadata(
        self, model_name: str, version: int | None, deadline: Deadline, *, label: str | None = None
    ) -> ModelMetadata:
        """The declared signature (whatever version or label is asked for)."""
        return self._metadata

    async def aclose(self) -> None:
        """Nothing to release."""


@asynccontextmanager
async def _no_model_client() -> AsyncIterator[ServingClient]:
    yield NoModelClient(fraud_route.signature)


def create_app() -> FastAPI:
    """The API's app with the fraud route only, its model named "none", and `NoModelClient`
    for a serving client. Settings otherwise come from the environment, as in the split
    (the score-event file, for one). Safe to preload, as the API is."""
    settings = Settings()
    settings.models.setdefault(fraud_route.name, ModelSettings()).model_name = NO_MODEL
    return create_api(settings, routes=[fraud_route], open_client=_no_model_client)
