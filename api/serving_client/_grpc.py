"""One serving replica over TF Serving's gRPC API (port 8500), through `grpc.aio`.

Uses the project's own wire-compatible protos (`api.protos`): the method paths are
TF Serving's (`/tensorflow.serving.PredictionService/Predict`,
`/tensorflow.serving.ModelService/GetModelStatus`) without importing TensorFlow. The
channel must be created inside the worker's running event loop (`grpc.aio` binds to
it), i.e. in the app's lifespan after gunicorn's fork. Each call's gRPC deadline is
what is left of the request's `Deadline`, capped by `call_timeout_s`; serving sees it
as `grpc-timeout` and can drop work nobody waits for. gRPC status codes are the
canonical codes, so the translation is `Code[status.name]`, here and nowhere else.
"""

from __future__ import annotations

from typing import TypeVar

import grpc
import grpc.aio
from google.protobuf.message import Message

from api.protos.tensorflow_serving.apis import (
    get_model_status_pb2,
    model_service_pb2_grpc,
    prediction_service_pb2_grpc,
)
from api.serving_client._deadline import Deadline
from api.serving_client._errors import (
    DEADLINE_PASSED,
    UNREACHABLE,
    ServingError,
    ServingRejected,
    call_budget,
    error_for_code,
)
from api.serving_client._tensor_proto import (
    model_metadata_from_proto,
    model_metadata_request,
    model_status_from_proto,
    predict_request_to_proto,
    predict_response_from_proto,
)
from api.serving_client._types import (
    MetadataProvider,
    ModelMetadata,
    ModelStatus,
    PredictRequest,
    PredictResponse,
    no_metadata,
)
from canonical_codes import Code

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
#: The least max receive message size when a Predict bound is given: model status and
#: metadata answers are a few KB to tens of KB (as `_rest.OTHER_RESPONSE_BYTES`).
OTHER_RESPONSE_BYTES = 1024 * 1024
_Request = TypeVar("_Request", bound=Message)
_Response = TypeVar("_Response", bound=Message)

# Channel arguments (grpc/grpc include/grpc/impl/channel_arg_names.h).
CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    # TF Serving's own client examples raise the 4 MB default for large tensors.
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # Reconnect quickly once a restarted replica is back: the defaults back off up to
    # 120 s, during which every call to that replica fails fast with UNAVAILABLE.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    # Notice a peer that vanished without closing the connection.
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    # Retries happen in one place, ReplicatedClient, which can move to another replica.
    ("grpc.enable_retries", 0),
)


class GrpcTransport:
    """TF Serving gRPC client for one replica (`ServingClient`).

    Args:
        target: "host:port" of the replica's gRPC port.
        call_timeout_s: upper bound of one call, seconds; the request's deadline
            usually ends it sooner.
        metadata: gRPC metadata added to every call, read per call (e.g. the request id).
        max_receive_bytes: the channel's max receive message size, bytes (at least
            `OTHER_RESPONSE_BYTES`, for model status and metadata); None: `MAX_MESSAGE_BYTES`.
    """

    def __init__(
        self,
        target: str,
        *,
        call_timeout_s: float,
        metadata: MetadataProvider = no_metadata,
        max_receive_bytes: int | None = None,
    ) -> None:
        self.target = target
        self._call_timeout_s = call_timeout_s
        self._metadata = metadata
        options = CHANNEL_OPTIONS
        if max_receive_bytes is not None:
            # gRPC's max receive message size: a larger answer fails RESOURCE_EXHAUSTED before
            # the message is held whole (a faulty replica cannot OOM the worker).
            receive = max(max_receive_bytes, OTHER_RESPONSE_BYTES)
            options = (*(o for o in CHANNEL_OPTIONS if o[0] != "grpc.max_receive_message_length"),
                       ("grpc.max_receive_message_length", receive))  # fmt: skip
        self._channel = grpc.aio.insecure_channel(target, options=options)
        prediction_service = prediction_service_pb2_grpc.PredictionServiceStub(self._channel)
        self._predict = prediction_service.Predict
        self._metadata_call = prediction_service.GetModelMetadata
        self._status = model_service_pb2_grpc.ModelServiceStub(self._channel).GetModelStatus

    def __repr__(self) -> str:
        return f"GrpcTransport({self.target!r})"

    async def predict(self, request: PredictRequest, deadline: Deadline) -> PredictResponse:
        """`PredictionService.Predict`, inputs as `tensor_content`.

        Raises:
            ServingError subclasses (see `api.serving_client`).
        """
        try:
            message = predict_request_to_proto(request)
        except (ValueError, TypeError, OverflowError) as exc:
            raise ServingRejected(f"an input cannot be encoded as its dtype ({exc})") from exc
        answer = await self._call(self._predict, message, deadline)
        try:
            return predict_response_from_proto(answer)
        except ServingError as exc:
            exc.target = self.target
            raise

    async def model_status(self, model_name: str, deadline: Deadline) -> ModelStatus:
        """`ModelService.GetModelStatus`: every version's state.

        Raises:
            ServingError subclasses (see `api.serving_client`).
        """
        message = get_model_status_pb2.GetModelStatusRequest()
        message.model_spec.name = model_name
        return model_status_from_proto(await self._call(self._status, message, deadline))

    async def model_metadata(
        self, model_name: str, version: int | str | None, deadline: Deadline, *, label: str | None = None
    ) -> ModelMetadata:
        """`PredictionService.GetModelMetadata`, "signature_def" field, of `version`, else of the
        version `label` names (`model_spec.version_label`; a str `version` is a label too), else
        of the latest.

        Raises:
            ServingError subclasses (see `api.serving_client`).
        """
        if isinstance(version, str):
            version, label = None, version
        message = model_metadata_request(model_name, version, label)
        answer = await self._call(self._metadata_call, message, deadline)
        try:
            return model_metadata_from_proto(answer, version)
        except ServingError as exc:
            exc.target = self.target
            raise

    async def aclose(self) -> None:
        """Close the channel (calls still running are cancelled)."""
        await self._channel.close()

    async def _call(
        self, method: grpc.aio.UnaryUnaryMultiCallable[_Request, _Response], message: _Request, deadline: Deadline
    ) -> _Response:
        """One unary call with the deadline's remaining budget as its gRPC deadline."""
        budget = call_budget(deadline, self._call_timeout_s, self.target)
        metadata = tuple(self._metadata().items())
        try:
            return await method(message, timeout=budget, metadata=metadata)
        except grpc.aio.AioRpcError as exc:
            raise self._translate(exc, deadline) from None

    def _translate(self, exc: grpc.aio.AioRpcError, deadline: Deadline) -> ServingError:
        code = Code[exc.code().name]
        message = exc.details() or code.name
        # UNAVAILABLE while the channel cannot connect means the replica is down, not
        # that one connection broke: let the caller skip it for a while.
        down = code is Code.UNAVAILABLE and (
            self._channel.get_state(try_to_connect=False) is grpc.ChannelConnectivity.TRANSIENT_FAILURE
        )
        # Our own deadline and an unreachable replica read as they do over REST; grpc's
        # wording ("Stream removed", "failed to connect to all addresses; ...") follows.
        if code is Code.DEADLINE_EXCEEDED and deadline.remaining() <= 0:
            message = f"{DEADLINE_PASSED} ({message})"
        elif down:
            message = f"{UNREACHABLE} ({message})"
        return error_for_code(code, message, replica_down=down, target=self.target)
