"""An in-process stand-in for the serving tier behind the client's public protocol (`ServingClient`).

    fake = FakeClient({"digits": FakeModel(signature=..., answer=lambda request: {...})})
    app = create_app(settings, open_client=fake.opener)

It answers model status, metadata and predict from the models it is given and records
every predict, so route tests run the real app without a serving process. The wire
formats are the transports' own tests'.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from api.model_routes import Signature, TensorSpec
from api.serving_client import (
    Deadline,
    ModelMetadata,
    ModelStatus,
    PredictRequest,
    PredictResponse,
    ServingClient,
    ServingNotFound,
    SignatureInfo,
    Tensor,
    TensorInfo,
    VersionStatus,
)


def signature_info(signature: Signature) -> SignatureInfo:
    """The SignatureDef serving would describe for a route's declared signature."""

    def infos(specs: Mapping[str, TensorSpec]) -> dict[str, TensorInfo]:
        return {name: TensorInfo(spec.dtype, (-1, *spec.shape), f"{name}:0") for name, spec in specs.items()}

    return SignatureInfo(infos(signature.inputs), infos(signature.outputs), "tensorflow/serving/predict")


@dataclass
class FakeModel:
    """One model: its versions' states, its SignatureDefs, and how it answers a predict.

    Attributes:
        signatures: SignatureDef key -> signature served.
        answer: request -> outputs; raise a ServingError to fail the call.
        versions: version -> state.
        gone: versions answering NOT_FOUND to predict (unloaded since status was read); a
            predict for the latest version runs the latest not gone.
    """

    signatures: dict[str, SignatureInfo]
    answer: Callable[[PredictRequest], Mapping[str, Tensor]]
    versions: dict[int, str] = field(default_factory=lambda: {1: "AVAILABLE"})
    gone: set[int] = field(default_factory=set)


class FakeClient(ServingClient):
    """A `ServingClient` over `FakeModel`s; `predicts` records every predict request."""

    def __init__(self, models: dict[str, FakeModel]) -> None:
        self.models = models
        self.predicts: list[PredictRequest] = []

    def _model(self, name: str) -> FakeModel:
        model = self.models.get(name)
        if model is None:
            raise ServingNotFound(f"Could not find any versions of model {name}")
        return model

    def _version(self, name: str, version: int | None, label: str | None = None) -> int:
        """The version serving would run (TF Serving's GetServableHandle): `version` when
        AVAILABLE, else the latest AVAILABLE; NOT_FOUND otherwise. Labels are not modelled."""
        model = self._model(name)
        available = [v for v, state in model.versions.items() if state == "AVAILABLE" and v not in model.gone]
        if label is not None:
            raise ServingNotFound(f"fake serving has no version labels ({label})")
        if version is None and available:
            return max(available)
        if version is not None and version in available:
            return version
        choice = f"Specific({name}, {version})" if version is not None else f"Latest({name})"
        raise ServingNotFound(f"Servable not found for request: {choice}")

    async def predict(self, request: PredictRequest, deadline: Deadline) -> PredictResponse:
        self.predicts.append(request)
        spec = request.model_spec
        version = self._version(spec.name, spec.version, spec.version_label)
        return PredictResponse(self._model(spec.name).answer(request), version)

    async def model_status(self, model_name: str, deadline: Deadline) -> ModelStatus:
        model = self._model(model_name)
        return ModelStatus(tuple(VersionStatus(v, state) for v, state in sorted(model.versions.items())))

    async def model_metadata(
        self, model_name: str, version: int | None, deadline: Deadline, *, label: str | None = None
    ) -> ModelMetadata:
        model = self._model(model_name)
        available = [v for v, state in model.versions.items() if state == "AVAILABLE"]
        if version is None and label is None and available:
            version = max(available)
        if version is None or version not in available:
            raise ServingNotFound(f"Servable not found for request: {version}")
        return ModelMetadata(version, model.signatures)

    async def aclose(self) -> None:
        pass

    @asynccontextmanager
    async def opener(self) -> AsyncIterator[ServingClient]:
        """For `create_app(open_client=...)`."""
        yield self
