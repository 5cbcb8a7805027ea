"""The declaration of a model route: what the app needs to know, and nothing it can derive.

Plain frozen dataclasses and pydantic models, no web framework: a declaration can be
built, inspected and its functions tested without an app.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict

from api.serving_client import DataType

RequestT = TypeVar("RequestT")
ResponseT = TypeVar("ResponseT", bound=BaseModel)
OptionsT = TypeVar("OptionsT", bound=BaseModel)

_NAME = re.compile(r"[a-z][a-z0-9_]*")


class ModelInfo(BaseModel):
    """The servable that answered a request: put it in a route's response."""

    name: str
    version: int


class NoOptions(BaseModel):
    """The options of a route that has none beyond the common per-model settings."""

    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One input or output of the signature a route calls, for one example.

    Attributes:
        dtype: element type (`DataType.DT_FLOAT` for float32).
        shape: dimensions of one example, the batch dimension left out: (11,) for a
            feature vector the served model takes as [batch, 11]; () for a scalar per example.
        bounds: outputs only: every value must lie within [low, high], else the answer is
            502 `serving_bad_response` (e.g. (0.0, 1.0) for a probability).
    """

    dtype: DataType = DataType.DT_FLOAT
    shape: tuple[int, ...] = ()
    bounds: tuple[float, float] | None = None


@dataclass(frozen=True, slots=True)
class Signature:
    """The served model a route calls: servable name, SignatureDef, its tensors.

    Attributes:
        model_name: servable name in serving's model config (the default; the deployment
            may override it, `MODELS__<ROUTE>__MODEL_NAME`).
        inputs: input alias -> spec, as in the SignatureDef (`saved_model_cli show`).
        outputs: output alias -> spec; only these are read from the answer.
        signature_name: SignatureDef key (overridable: `MODELS__<ROUTE>__SIGNATURE_NAME`).
    """

    model_name: str
    inputs: Mapping[str, TensorSpec]
    outputs: Mapping[str, TensorSpec]
    signature_name: str = "serving_default"


@dataclass(frozen=True, slots=True)
class JsonBody(Generic[RequestT]):
    """The request is a JSON body validated by a pydantic model (FastAPI's 422 when it is not).

    Attributes:
        model: the pydantic model of the body; preprocess gets an instance.
        max_bytes: largest body, bytes; None: the API's `MAX_BODY_BYTES`.
    """

    model: type[RequestT]
    max_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class FileUpload:
    """The request is one uploaded file, a multipart form field; preprocess gets an `Upload`.

    Attributes:
        field: the form field's name (`curl -F field=@file`).
        description: what the file must be (OpenAPI).
        max_bytes: largest file, bytes (413 above it); the body may exceed it by the
            multipart framing.
        media_types: accepted Content-Types of the part (422 for others); () accepts any,
            for routes that look at the bytes themselves.
    """

    field: str
    description: str
    max_bytes: int
    media_types: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Upload:
    """An uploaded file, read whole (at most `FileUpload.max_bytes`)."""

    data: bytes
    filename: str | None
    content_type: str | None


@dataclass(frozen=True, slots=True)
class Prediction:
    """What postprocess gets: the served model's outputs for the request's example.

    Attributes:
        outputs: output alias -> value of the declared shape: nested lists (a float or int
            for shape ()), checked against the `TensorSpec` (shape, finite, bounds).
        model: the servable and version that answered.
    """

    outputs: Mapping[str, Any]
    model: ModelInfo


class InvalidInput(ValueError):
    """Raised by preprocess for input the request schema let through but the model cannot use.

    Answered 422 in FastAPI's validation-error format, located at the body (a JSON route)
    or at the upload's form field; the message is shown to the caller.
    """


@dataclass(frozen=True, slots=True)
class PayloadCapture:
    """Which of a route's requests and responses are copied for monitoring, and what is left out.

    A captured pair goes to the deployment's capture sink (`PAYLOAD_CAPTURE__URL`) as two
    CloudEvents in the format of KServe's inference logger, off the request path
    (`api.observability.payload_capture`); nothing is captured while no sink is set.

    Attributes:
        sample_rate: the fraction of answered requests captured, 0 to 1 (a deployment may set
            its own, `MODELS__<ROUTE>__CAPTURE_SAMPLE_RATE`); 0: none.
        redact: fields whose values are replaced by "[REDACTED]" in the captured request and
            response, each a dotted path from the body's top (`"user_id"`, `"device.id"`; through
            a list, every element). A JSON route's only: an upload is captured as its bytes.
    """

    sample_rate: float = 0.0
    redact: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not 0.0 <= self.sample_rate <= 1.0:
            raise ValueError(f"a capture sample_rate is between 0 and 1, got {self.sample_rate}")
        if any(not path or "" in path.split(".") for path in self.redact):
            raise ValueError(f"a redacted field is a dotted path of field names: {self.redact!r}")


def _no_input_id(request: Any) -> str | None:
    return None


def _no_event_fields(request: Any, response: Any) -> Mapping[str, object]:
    return {}


def _no_rollout_key(request: Any) -> str | None:
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelRoute(Generic[RequestT, ResponseT, OptionsT]):
    """One model route: request in, features out, the served model, its answer back.

    From it the app derives the served-model client (version pinning, retries), the HTTP
    route and its OpenAPI entry, readiness (`/readyz` checks the model, signature and
    tensors), the body limit, the metrics labels (the path), the score events and the
    per-model settings (`MODELS__<NAME>__...`). The request path is:

        preprocess(request, options) -> {input alias: one example}    # stage "features"
        the served model, pinned to its latest AVAILABLE version      # stage "serving"
        postprocess(request, Prediction, options) -> response

    Attributes:
        name: the route's name: its settings key (`MODELS__<NAME>__...`; lower-case
            letters, digits and `_`), OpenAPI tag and the score events' `route`.
        path: the HTTP path, e.g. "/v1/fraud/score" (POST).
        request: `JsonBody(Model)` or `FileUpload(...)`.
        response: pydantic model of the answer (`response_model`).
        signature: the served model, signature and tensors it calls.
        preprocess: request, options -> input alias -> one example's value (nested lists
            of the input's declared shape). Raise `InvalidInput` for a 422. Pure.
        postprocess: request, prediction, options -> the response. Pure.
        options: pydantic model of the route's own settings (`MODELS__<NAME>__<OPTION>`);
            its defaults apply when unset. Give it `extra="forbid"`.
        preprocess_in_thread: run preprocess in a worker thread (at most one per usable
            CPU at a time): for CPU work of more than about a millisecond, such as
            decoding an image; a thread hop costs about 0.15 ms.
        input_id: the request's own id for score events (e.g. a transaction id).
        event_fields: extra fields of the score event (request, response) -> fields.
        rollout_key: what a request's rollout arm is a stable hash of (e.g. a user id, so one
            user sees one version during a canary); None, or a function returning None: the
            request id (`api.rollouts.assignment`).
        capture: the sampled copy of requests and responses for monitoring, and the fields
            redacted from it (`PayloadCapture`); by default none is captured.
        summary: one line for OpenAPI.
    """

    name: str
    path: str
    request: JsonBody[RequestT] | FileUpload
    response: type[ResponseT]
    signature: Signature
    preprocess: Callable[[RequestT, OptionsT], Mapping[str, Any]]
    postprocess: Callable[[RequestT, Prediction, OptionsT], ResponseT]
    # A default fits only the routes whose OptionsT is NoOptions, which a class-level default
    # of a generic dataclass cannot say: the one place the type is looser than the use.
    options: type[OptionsT] = NoOptions  # type: ignore[assignment]
    preprocess_in_thread: bool = False
    input_id: Callable[[RequestT], str | None] = _no_input_id
    event_fields: Callable[[RequestT, ResponseT], Mapping[str, object]] = _no_event_fields
    rollout_key: Callable[[RequestT], str | None] = _no_rollout_key
    capture: PayloadCapture = PayloadCapture()
    summary: str = ""

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise ValueError(f"a route name is lower-case letters, digits and '_' (a settings key): {self.name!r}")
        if not self.path.startswith("/"):
            raise ValueError(f"route {self.name!r}: the path must start with '/': {self.path!r}")
        if not self.signature.inputs or not self.signature.outputs:
            raise ValueError(f"route {self.name!r}: the signature needs at least one input and one output")
