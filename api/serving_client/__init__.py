"""The API's client to the serving tier: TF Serving's Predict and GetModelStatus.

    async with open_serving_client(ClientConfig(protocol="grpc")) as client:
        response = await client.predict(PredictRequest(ModelSpec("fraud"), inputs), deadline)

`predict`, `model_status` and `model_metadata` are TF Serving's Predict, GetModelStatus and
GetModelMetadata (its "signature_def" field).

Transport-neutral: `predict` and `model_status` are implemented once over REST
(`_rest`, TF Serving's REST API, api_rest.md) and once over gRPC (`_grpc`,
prediction_service.proto / model_service.proto through the project's own protos in
`api.protos`), chosen by `ClientConfig.protocol`. Calls are spread over replicas with
UNAVAILABLE retried on another one within the request's deadline (`_replicas`), and
concurrent predicts may be merged into one call (`_coalescing`); `open_serving_client`
builds that stack. The package needs nothing from the app: it is configured with plain
data and is usable on its own.

Every call takes the request's `Deadline` (`_deadline`: one point on the monotonic clock,
from the request's arrival to the wire); what is left of it is the gRPC deadline or the
REST call's timeout.

Every failure leaves this package as a `ServingError` subclass with a canonical
`Code`; exceptions of the HTTP/1.1 client (`_http1`) and of grpc never do (see
`_errors` for the table).

The names below are the public surface, pinned by tests/api/test_exported_members.py;
everything else is private to the package.
"""

from api.serving_client._deadline import Deadline, DeadlineExceeded
from api.serving_client._errors import (
    ServingBadResponse,
    ServingError,
    ServingInternalError,
    ServingMisconfigured,
    ServingNotFound,
    ServingRejected,
    ServingTimeout,
    ServingUnavailable,
)
from api.serving_client._factory import ClientConfig, CoalescingConfig, open_serving_client
from api.serving_client._tracing import ClientTracer
from api.serving_client._types import (
    DataType,
    MetadataProvider,
    ModelMetadata,
    ModelSpec,
    ModelStatus,
    PredictRequest,
    PredictResponse,
    ServingClient,
    SignatureInfo,
    Tensor,
    TensorInfo,
    VersionStatus,
)
from canonical_codes import Code

__all__ = [
    "ClientConfig",
    "ClientTracer",
    "CoalescingConfig",
    "Code",
    "DataType",
    "Deadline",
    "DeadlineExceeded",
    "MetadataProvider",
    "ModelMetadata",
    "ModelSpec",
    "ModelStatus",
    "PredictRequest",
    "PredictResponse",
    "ServingBadResponse",
    "ServingClient",
    "ServingError",
    "ServingInternalError",
    "ServingMisconfigured",
    "ServingNotFound",
    "ServingRejected",
    "ServingTimeout",
    "ServingUnavailable",
    "SignatureInfo",
    "Tensor",
    "TensorInfo",
    "VersionStatus",
    "open_serving_client",
]
