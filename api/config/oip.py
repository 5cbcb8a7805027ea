"""The Open Inference Protocol front's settings (`OIP__<SETTING>`; the front itself is `api.oip`).

    OIP__MODELS=all OIP__GRPC_PORT=8001 uvicorn --factory api.app:create_app

`Settings.oip` holds them, nested (pydantic-settings' `__` delimiter), so the front adds one
field to the API's settings and keeps its own here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from pydantic import BaseModel, Field, field_validator

# A model name as the OIP front accepts it in a path, `OIP__MODELS` or a gRPC request: TF
# Serving's names are free text, but one that travels in a URL path segment and a metrics-free
# log line is kept to this (and its length bounded, so a client cannot make the API send
# serving, or cache, arbitrarily long names).
MODEL_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._\-]{0,127}")


@dataclass(frozen=True, slots=True)
class Exposure:
    """Which of serving's models the OIP front answers for.

    Attributes:
        every: every model serving has (TF Serving cannot list them: a name is tried on
            serving when asked for, and answered 404 when serving has no such model).
        names: the models exposed when not `every`; () with `every` False: none (the front
            is off).
    """

    every: bool
    names: tuple[str, ...] = ()

    @property
    def enabled(self) -> bool:
        """True when any model is exposed."""
        return self.every or bool(self.names)

    def exposes(self, model_name: str) -> bool:
        """Whether `model_name` may be called through the front."""
        return (self.every or model_name in self.names) and MODEL_NAME.fullmatch(model_name) is not None


class OipSettings(BaseModel):
    """The Open Inference Protocol (KServe v2) front: `/v2/...` on the API's port, and
    `inference.GRPCInferenceService` on a port of its own."""

    models: str = Field(
        default="none",
        description="Models reachable through the Open Inference Protocol: `none` (the front is "
        "off: no /v2 routes, no gRPC port), `all` (any model serving has, by name), or a "
        "comma-separated list of servable names (e.g. `fraud,digits`).",
    )
    grpc_port: int = Field(
        default=8001,
        ge=0,
        le=65535,
        description="Port of the OIP gRPC server (GRPCInferenceService), served by every API "
        "worker on the same port (SO_REUSEPORT); 0 leaves gRPC off. Off with OIP__MODELS=none.",
    )
    grpc_host: str = Field(
        default="0.0.0.0",
        description="Address the OIP gRPC server binds; run-server.sh sets it to API_HOST's, as it "
        "does the operational port's.",
    )
    max_body_bytes: int = Field(
        default=4 * 1024 * 1024,
        ge=1,
        description="Largest inference request, bytes: the REST body (JSON and binary tensors "
        "together) and the gRPC message alike (gRPC's own default is 4 MiB). Larger is "
        "answered 413 (REST) or RESOURCE_EXHAUSTED (gRPC) before it is parsed.",
    )
    max_models: int = Field(
        default=256,
        ge=1,
        description="Model versions whose metadata (versions, signatures) each worker keeps "
        "cached at most; the least recently used goes first.",
    )
    server_name: str = Field(
        default="tfserve-split", description="The `name` of the OIP server metadata (`GET /v2`)."
    )

    @field_validator("models")
    @classmethod
    def _models(cls, value: str) -> str:
        """`none`, `all`, or names that each fit `MODEL_NAME`."""
        text = value.strip()
        if text.lower() in ("none", "all", ""):
            return text.lower() or "none"
        names = [part.strip() for part in text.split(",") if part.strip()]
        bad = [name for name in names if not MODEL_NAME.fullmatch(name)]
        if bad:
            raise ValueError(f"not a model name: {', '.join(bad)} (expected {MODEL_NAME.pattern})")
        return ",".join(names)

    @property
    def exposure(self) -> Exposure:
        """`models` read as an `Exposure`."""
        if self.models == "all":
            return Exposure(every=True)
        if self.models == "none":
            return Exposure(every=False)
        return Exposure(every=False, names=tuple(self.models.split(",")))
