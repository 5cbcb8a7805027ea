"""The OIP operations, protocol-neutral: what REST (`api.oip.rest`) and gRPC
(`api.oip.grpc_service`) both answer.

| operation | REST | gRPC |
| --- | --- | --- |
| `live` | `GET /v2/health/live` | `ServerLive` |
| `ready` | `GET /v2/health/ready` | `ServerReady` |
| `server_metadata` | `GET /v2` | `ServerMetadata` |
| `model_ready` | `GET /v2/models/{m}[/versions/{v}]/ready` | `ModelReady` |
| `model_metadata` | `GET /v2/models/{m}[/versions/{v}]` | `ModelMetadata` |
| `infer` | `POST /v2/models/{m}[/versions/{v}]/infer` | `ModelInfer` |

Server readiness: every listed model (`OIP__MODELS=a,b`) has a version AVAILABLE; with
`OIP__MODELS=all`, which TF Serving cannot enumerate, the models of the enabled model routes
(none: ready once live).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from api.oip.catalog import Catalog
from api.oip.inference import Inference
from api.oip.types import DEFAULT_SIGNATURE, InferRequest, InferResult, ModelMetadata, OipError
from api.serving_client import Deadline

#: OIP extensions this front implements (server metadata's `extensions`).
EXTENSIONS = ("binary_tensor_data",)


@dataclass(frozen=True, slots=True)
class ServerMetadata:
    """`$metadata_server_response`."""

    name: str
    version: str
    extensions: tuple[str, ...]


class OipService:
    """One worker's OIP operations over its serving client.

    Args:
        inference: the worker's inferences (with its catalog).
        server_name / server_version: what server metadata says.
        ready_models: the models server readiness waits for (see module doc).
    """

    def __init__(
        self, inference: Inference, *, server_name: str, server_version: str, ready_models: Sequence[str]
    ) -> None:
        self.inference = inference
        self.catalog: Catalog = inference.catalog
        self._metadata = ServerMetadata(server_name, server_version, EXTENSIONS)
        self._ready_models = tuple(ready_models)

    def live(self) -> bool:
        """Always True: the process answers (never calls serving)."""
        return True

    async def ready(self, deadline: Deadline) -> bool:
        """Whether every model readiness waits for has a version AVAILABLE (serving read now)."""
        for name in self._ready_models:
            self.catalog.forget(name)  # a probe reads serving afresh
        results = await asyncio.gather(
            *(self._model_ready_or_false(name, deadline) for name in self._ready_models)
        )
        return all(results)

    async def _model_ready_or_false(self, name: str, deadline: Deadline) -> bool:
        try:
            return await self.catalog.ready(name, None, deadline)
        except OipError:
            return False

    def server_metadata(self) -> ServerMetadata:
        """The server's name, version and extensions."""
        return self._metadata

    async def model_ready(self, model_name: str, version: str | None, deadline: Deadline) -> bool:
        """Whether `model_name` (at `version`) can answer now.

        Raises:
            OipError: NOT_FOUND (404) for a model not exposed or not on serving.
        """
        return await self.catalog.ready(model_name, version, deadline)

    async def model_metadata(
        self, model_name: str, version: str | None, deadline: Deadline, signature_name: str = DEFAULT_SIGNATURE
    ) -> ModelMetadata:
        """A model version's metadata from its SignatureDef `signature_name`.

        Raises:
            OipError: NOT_FOUND (404) for an unknown model or version, INVALID_ARGUMENT
                (400) for an unknown signature, a serving failure.
        """
        resolved = await self.catalog.resolve(model_name, version, deadline)
        return resolved.metadata(signature_name or DEFAULT_SIGNATURE)

    async def infer(self, request: InferRequest, deadline: Deadline) -> InferResult:
        """One inference (`api.oip.inference.Inference.infer`)."""
        return await self.inference.infer(request, deadline)
