"""`inference.GRPCInferenceService` (the spec's `open_inference_grpc.proto`) over `OipService`.

Each method only decodes its message (`api.oip.grpc_codec`), calls the service and encodes
the answer; `api.oip.grpc_server` runs every method inside its call path (context,
admission, hooks, errors, records), through the `run` function it hands this servicer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

import grpc
import grpc.aio
from google.protobuf.message import Message

from api.oip import grpc_codec
from api.oip.datatypes import TensorDataError
from api.oip.service import OipService
from api.oip.types import DEFAULT_SIGNATURE, invalid
from api.protos.inference import open_inference_grpc_pb2 as pb
from api.serving_client import Deadline

SERVICE: Final = "inference.GRPCInferenceService"
#: The probes: never refused for load, nor counted in flight.
HEALTH_METHODS: Final = frozenset({f"/{SERVICE}/ServerLive", f"/{SERVICE}/ServerReady"})

_Request = TypeVar("_Request", bound=Message)
_Response = TypeVar("_Response", bound=Message)
#: How the server runs one method: (full method path, the call's context, the method's work
#: given the call's deadline) -> the answer.
CallRunner = Callable[[str, "grpc.aio.ServicerContext[Any, Any]", Callable[[Deadline], Awaitable[Any]]], Awaitable[Any]]


class InferenceServicer:
    """The six RPCs of GRPCInferenceService.

    Args:
        service: the worker's OIP operations.
        run: the server's call path (`api.oip.grpc_server`).
    """

    def __init__(self, service: OipService, run: CallRunner) -> None:
        self._service = service
        self._run = run

    def handler(self) -> grpc.GenericRpcHandler:
        """The service's method handlers, each run through `run`."""
        methods: dict[str, tuple[type[Message], Callable[[Any, Deadline], Awaitable[Message]]]] = {
            "ServerLive": (pb.ServerLiveRequest, self._server_live),
            "ServerReady": (pb.ServerReadyRequest, self._server_ready),
            "ModelReady": (pb.ModelReadyRequest, self._model_ready),
            "ServerMetadata": (pb.ServerMetadataRequest, self._server_metadata),
            "ModelMetadata": (pb.ModelMetadataRequest, self._model_metadata),
            "ModelInfer": (pb.ModelInferRequest, self._model_infer),
        }
        handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
            name: grpc.unary_unary_rpc_method_handler(
                self._behaviour(f"/{SERVICE}/{name}", work),
                request_deserializer=request_type.FromString,
                response_serializer=lambda message: message.SerializeToString(),
            )
            for name, (request_type, work) in methods.items()
        }
        return grpc.method_handlers_generic_handler(SERVICE, handlers)

    def _behaviour(
        self, method: str, work: Callable[[Any, Deadline], Awaitable[Message]]
    ) -> Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[Message]]:
        async def behaviour(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Message:
            answer: Message = await self._run(method, context, lambda deadline: work(request, deadline))
            return answer

        return behaviour

    async def _server_live(self, request: pb.ServerLiveRequest, deadline: Deadline) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self._service.live())

    async def _server_ready(self, request: pb.ServerReadyRequest, deadline: Deadline) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=await self._service.ready(deadline))

    async def _model_ready(self, request: pb.ModelReadyRequest, deadline: Deadline) -> pb.ModelReadyResponse:
        ready = await self._service.model_ready(request.name, request.version or None, deadline)
        return pb.ModelReadyResponse(ready=ready)

    async def _server_metadata(
        self, request: pb.ServerMetadataRequest, deadline: Deadline
    ) -> pb.ServerMetadataResponse:
        metadata = self._service.server_metadata()
        return pb.ServerMetadataResponse(
            name=metadata.name, version=metadata.version, extensions=metadata.extensions
        )

    async def _model_metadata(
        self, request: pb.ModelMetadataRequest, deadline: Deadline
    ) -> pb.ModelMetadataResponse:
        metadata = await self._service.model_metadata(
            request.name, request.version or None, deadline, DEFAULT_SIGNATURE
        )
        return grpc_codec.model_metadata(metadata)

    async def _model_infer(self, request: pb.ModelInferRequest, deadline: Deadline) -> pb.ModelInferResponse:
        result = await self._service.infer(grpc_codec.infer_request(request), deadline)
        try:
            return grpc_codec.infer_response(result, raw=bool(request.raw_input_contents))
        except TensorDataError as exc:
            raise invalid(str(exc)) from None
