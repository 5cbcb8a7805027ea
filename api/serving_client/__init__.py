"""The API's client to the serving tier: TF Serving's Predict and GetModelStatus.

Transport-neutral: `predict` and `model_status` are implemented once over REST
(`RestTransport`, TF Serving's REST API, api_rest.md) and once over gRPC
(`GrpcTransport`, prediction_service.proto / model_service.proto through the
project's own protos in `api.protos`), chosen by `SERVING_PROTOCOL`.
`ReplicatedClient` spreads calls over several replicas and retries UNAVAILABLE on
another one within the request's deadline; `open_serving_client` builds the whole
stack from settings in the app's lifespan.

Every failure leaves this package as a `ServingError` subclass with a canonical
`Code`; exceptions of the HTTP/1.1 client (`_http1`) and of grpc never do (see
`_errors` for the table).
"""

from api.serving_client._errors import (
    Code,
    ServingBadResponse,
    ServingError,
    ServingInternalError,
    ServingMisconfigured,
    ServingNotFound,
    ServingRejected,
    ServingTimeout,
    ServingUnavailable,
    is_retryable,
)
from api.serving_client._factory import http_client, open_serving_client
from api.serving_client._replicas import ReplicatedClient, RoundRobin
from api.serving_client._rest import RestTransport
from api.serving_client._types import (
    DataType,
    ModelSpec,
    ModelStatus,
    PredictRequest,
    PredictResponse,
    ServingClient,
    Tensor,
    VersionStatus,
)

__all__ = [
    "Code",
    "DataType",
    "ModelSpec",
    "ModelStatus",
    "PredictRequest",
    "PredictResponse",
    "ReplicatedClient",
    "RestTransport",
    "RoundRobin",
    "ServingBadResponse",
    "ServingClient",
    "ServingError",
    "ServingInternalError",
    "ServingMisconfigured",
    "ServingNotFound",
    "ServingRejected",
    "ServingTimeout",
    "ServingUnavailable",
    "Tensor",
    "VersionStatus",
    "http_client",
    "is_retryable",
    "open_serving_client",
]


def __getattr__(name: str) -> object:
    # GrpcTransport is loaded on first use, so a REST-only worker never imports grpc.
    if name == "GrpcTransport":
        from api.serving_client._grpc import GrpcTransport

        return GrpcTransport
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
