"""The OIP front's one internal request and answer, and its one error type with its table.

REST documents (`api.oip.rest_codec`) and gRPC messages (`api.oip.grpc_codec`) are codecs at
the edges; `api.oip.inference` works on these types only. An inference is
`InferRequest` -> `InferResult`; every failure it can meet leaves as an `OipError`, whose
canonical code is the gRPC status and, through `HTTP_STATUS`, the REST status.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from api.oip.datatypes import Datatype
from api.serving_client import Code, DeadlineExceeded, ServingBadResponse, ServingError

#: The `signature_name` request parameter: which SignatureDef an inference calls (this
#: front's extension of OIP; TF Serving's `model_spec.signature_name`).
SIGNATURE_PARAMETER: Final = "signature_name"
DEFAULT_SIGNATURE: Final = "serving_default"
#: Dimensions of a request's tensor at most (TensorFlow's own limit is 254).
MAX_RANK: Final = 64

Parameters = Mapping[str, bool | int | float | str]


@dataclass(frozen=True, slots=True)
class InferInput:
    """One input tensor of a request.

    Attributes:
        name: the signature input's alias.
        datatype: its OIP datatype, as the client declared it.
        shape: dimensions, the batch first; each >= 0.
        values: the elements, flat and row-major: bools, ints, floats, bytes (BYTES), or an
            `array.array` of the raw elements.
    """

    name: str
    datatype: Datatype
    shape: tuple[int, ...]
    values: Sequence[Any]


@dataclass(frozen=True, slots=True)
class RequestedOutput:
    """One output the client asks for: `binary` True to have it as raw bytes (REST: the binary
    tensor data extension; gRPC: `raw_output_contents`)."""

    name: str
    binary: bool | None = None


@dataclass(frozen=True, slots=True)
class InferRequest:
    """An inference request (OIP `$inference_request` / `ModelInferRequest`).

    Attributes:
        model_name / model_version: from the path or the message; version "" or None: the
            latest AVAILABLE; digits: that version; anything else: a version label.
        id: echoed in the answer when given.
        parameters: the request's parameters (`signature_name`, `binary_data_output`, ...).
        inputs: the input tensors.
        outputs: the outputs asked for, in order; () for every output of the signature.
    """

    model_name: str
    model_version: str | None
    inputs: Sequence[InferInput]
    outputs: Sequence[RequestedOutput] = ()
    id: str | None = None
    parameters: Parameters = field(default_factory=lambda: MappingProxyType({}))

    @property
    def signature_name(self) -> str:
        """The SignatureDef called: the `signature_name` parameter, else serving_default."""
        value = self.parameters.get(SIGNATURE_PARAMETER, DEFAULT_SIGNATURE)
        return value if isinstance(value, str) and value else DEFAULT_SIGNATURE


@dataclass(frozen=True, slots=True)
class InferOutput:
    """One output tensor of an answer: values flat, row-major, in `datatype`'s Python type."""

    name: str
    datatype: Datatype
    shape: tuple[int, ...]
    values: Sequence[Any]


@dataclass(frozen=True, slots=True)
class InferResult:
    """An inference answer (OIP `$inference_response` / `ModelInferResponse`)."""

    model_name: str
    model_version: str
    outputs: Sequence[InferOutput]
    id: str | None = None


@dataclass(frozen=True, slots=True)
class TensorMetadata:
    """An input or output of a model's metadata: OIP datatype name, shape with -1 for a
    variable dimension (the batch)."""

    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ModelMetadata:
    """OIP model metadata (`$metadata_model_response` / `ModelMetadataResponse`)."""

    name: str
    versions: tuple[str, ...]
    platform: str
    inputs: tuple[TensorMetadata, ...]
    outputs: tuple[TensorMetadata, ...]


# Canonical code -> the OIP REST status. The protocol says "typically 400" for a failed
# request; the statuses a client or a proxy can act on are kept apart: an unknown model or
# version 404, overload and an unreachable serving tier 503 (retry later), the deadline 504,
# a serving tier that answered something unusable or failed 502 (as the API's model routes).
HTTP_STATUS: Final[Mapping[Code, int]] = MappingProxyType(
    {
        Code.INVALID_ARGUMENT: 400,
        Code.OUT_OF_RANGE: 400,
        Code.FAILED_PRECONDITION: 400,
        Code.NOT_FOUND: 404,
        Code.UNAUTHENTICATED: 401,
        Code.PERMISSION_DENIED: 403,
        Code.RESOURCE_EXHAUSTED: 503,
        Code.UNAVAILABLE: 503,
        Code.ABORTED: 503,
        Code.CANCELLED: 503,
        Code.DEADLINE_EXCEEDED: 504,
        Code.UNIMPLEMENTED: 501,
        Code.INTERNAL: 502,
        Code.UNKNOWN: 502,
        Code.DATA_LOSS: 502,
        Code.ALREADY_EXISTS: 502,
    }
)


class OipError(Exception):
    """A request the OIP front answers with an error.

    Attributes:
        code: canonical code: the gRPC status; `HTTP_STATUS[code]` over REST.
        message: what went wrong, naming the model, version, signature or tensor; shown to
            the client (`{"error": message}`).
        serving_code: the serving tier's code when the failure was serving's (counted in
            `api_serving_errors_total`), else None.
    """

    def __init__(
        self, code: Code, message: str, *, serving_code: Code | None = None, http_status: int | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.serving_code = serving_code
        self._http_status = http_status

    @property
    def http_status(self) -> int:
        """The REST status: the one given, else `HTTP_STATUS`'s for the code."""
        return self._http_status or HTTP_STATUS.get(self.code, 502)

    @classmethod
    def from_serving(cls, exc: ServingError | DeadlineExceeded) -> OipError:
        """The answer to a serving failure or the request's own deadline.

        Serving's INVALID_ARGUMENT is the client's input here (the front passes tensors on as
        sent), so it stays 400; an answer serving should not have given is INTERNAL (502);
        serving's REST 413 (its `--rest_api_max_body_bytes`, met by the translated Predict) is
        RESOURCE_EXHAUSTED, 413 over REST, as a body over `OIP__MAX_BODY_BYTES` is.
        """
        if isinstance(exc, DeadlineExceeded):
            return cls(Code.DEADLINE_EXCEEDED, str(exc))
        if exc.status_code == 413:
            # Serving's REST body limit met the Predict this request became: the request is
            # too large for this deployment, answered as the API's own body limit is.
            return cls(
                Code.RESOURCE_EXHAUSTED,
                f"the request is too large: as TF Serving's Predict JSON it is over the serving tier's body "
                f"limit, which OIP__MAX_BODY_BYTES does not account for (serving: {exc.message}); send fewer "
                "elements per request",
                serving_code=exc.code,
                http_status=413,
            )
        code = Code.INTERNAL if isinstance(exc, ServingBadResponse) else exc.code
        return cls(code, f"serving tier: {exc.message}", serving_code=exc.code)


def invalid(message: str) -> OipError:
    """An INVALID_ARGUMENT (400) `OipError`."""
    return OipError(Code.INVALID_ARGUMENT, message)


def not_found(message: str) -> OipError:
    """A NOT_FOUND (404) `OipError`."""
    return OipError(Code.NOT_FOUND, message)
