"""The gRPC front end: TF Serving's ``PredictionService`` and ``ModelService`` on ``grpc.aio``.

Registered from the official generated stubs (``tensorflow_serving.apis.*_pb2_grpc``), so method
paths and messages are TF Serving's own (``/tensorflow.serving.PredictionService/Predict`` ...):

* ``PredictionService``: Predict (:class:`~serving.servables.tensorflow.predict_impl.Predictor`), Classify, Regress,
  MultiInference (:class:`~serving.servables.tensorflow.classifier.InferenceRunner`), GetModelMetadata
  (:mod:`serving.servables.tensorflow.get_model_metadata_impl`) -- ``model_servers/prediction_service_impl.cc``;
* ``ModelService``: GetModelStatus and HandleReloadConfigRequest --
  ``model_servers/model_service_impl.cc``.

Like the REST handler, the servicers only decode (:mod:`serving.util.proto_codec`), call the core and
encode. Errors are translated once, by :class:`StatusTranslated` around every method:
a :class:`~serving.util.errors.ServingError` becomes the gRPC status of the same canonical code
(``NOT_FOUND Servable not found for request: Latest(foo)``, ``INVALID_ARGUMENT ...``), messages
over 1024 characters cut with ``...TRUNCATED`` (``ToGRPCStatus`` of grpc_status_util.cc); any
other exception is logged and answered through :func:`serving.util.errors.from_exception`.

Server settings (``model_servers/server.cc``), each a :class:`~serving.model_servers.flags.ServerOptions` flag:

* listens on ``--grpc_host:--port`` (``0.0.0.0`` like TF Serving) and, with
  ``--grpc_socket_path``, on ``unix:<path>``; a port already in use fails start-up (gRPC's
  ``SO_REUSEPORT`` is turned off, so two servers cannot silently share a port);
* messages up to ``INT_MAX`` bytes both ways (``SetMaxMessageSize(kint32max)``), not gRPC's 4 MB
  receive default -- lower it with ``--grpc_channel_arguments=grpc.max_receive_message_length=N``
  (they replace the defaults key by key); a client still needs its own
  ``grpc.max_receive_message_length`` for large responses;
* ``--grpc_max_threads`` caps concurrent RPCs (``RESOURCE_EXHAUSTED`` beyond it);
* ``--ssl_config_file`` (an ``SSLConfig`` text proto: ``server_key``, ``server_cert`` PEM text,
  optional ``custom_ca``, ``client_verify``) serves TLS on every listener instead of plaintext,
  requiring client certificates signed by ``custom_ca`` when ``client_verify`` is set
  (``BuildServerCredentialsFromSSLConfigFile``); a bad file fails start-up with one line;
* the call's deadline bounds the ``Session`` run (``enforce_session_run_timeout``, TF Serving's
  default): the remaining time, rounded up to a power of two milliseconds so that the cached
  Session callables (one per distinct timeout) stay few; gRPC itself still ends the call with
  ``DEADLINE_EXCEEDED`` at the exact deadline.

Predict answers with the typed ``*_val`` fields (TF Serving's default ``kAsProtoField``: clients
reading ``outputs["y"].float_val`` work); ``--grpc_response_tensor_content`` switches to
``tensor_content``. ``grpc.aio`` runs on the server's uvloop event loop (checked: it does).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    inference_pb2,
    model_management_pb2,
    model_service_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)
from tensorflow_serving.config.model_server_config_pb2 import ModelServerConfig

from serving.core.manager import ServableManager
from serving.model_servers import flags
from serving.model_servers.flags import ServerOptions
from serving.protos.tensorflow_serving.config.ssl_config_pb2 import SSLConfig
from serving.servables.tensorflow import get_model_metadata_impl as metadata
from serving.servables.tensorflow.inference_runner import InferenceService
from serving.servables.tensorflow.predict_impl import PredictService
from serving.util import proto_codec
from serving.util.errors import Code, ServingError, from_exception
from serving.util.proto_util import read_text_proto_file

__all__ = [
    "GrpcServer",
    "ModelService",
    "PredictionService",
    "StatusTranslated",
    "server_arguments",
    "server_credentials",
    "session_timeout_ms",
]

_log = logging.getLogger(__name__)

_INT32_MAX = 2**31 - 1
_ERROR_MESSAGE_LIMIT = 1024  # ToGRPCStatus' kErrorMessageLimit
_SHUTDOWN_GRACE_S = 30.0  # in-flight RPCs get this long after SIGTERM; a second signal: none

ReloadConfig = Callable[[ModelServerConfig], Awaitable[None]]


def session_timeout_ms(context: grpc.aio.ServicerContext) -> int | None:
    """The ``Session`` run timeout for a call: its remaining deadline in ms, rounded up to a
    power of two (see module doc); ``None`` without a deadline or once it has passed (gRPC
    ends the call then; TF Serving likewise treats a timeout <= 0 as none)."""
    remaining = context.time_remaining()
    if remaining is None or remaining <= 0:
        return None
    millis = max(1, math.ceil(remaining * 1000))
    return 1 << (millis - 1).bit_length()


class PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):
    """``tensorflow.serving.PredictionService``."""

    def __init__(
        self,
        predictor: PredictService,
        inference: InferenceService,
        manager: ServableManager,
        *,
        response_tensor_content: bool = False,
    ) -> None:
        self._predictor = predictor
        self._inference = inference
        self._manager = manager
        self._tensor_content = response_tensor_content

    async def Predict(  # noqa: N802 - the generated servicer's method names
        self, request: predict_pb2.PredictRequest, context: grpc.aio.ServicerContext
    ) -> predict_pb2.PredictResponse:
        """``Predict``: tensors in, tensors out (see :meth:`Predictor.predict`)."""
        core_request = proto_codec.predict_request_from_proto(request)
        response = await self._predictor.predict(
            core_request, timeout_ms=session_timeout_ms(context)
        )
        return proto_codec.predict_response_to_proto(response, as_content=self._tensor_content)

    async def Classify(  # noqa: N802
        self, request: classification_pb2.ClassificationRequest, context: grpc.aio.ServicerContext
    ) -> classification_pb2.ClassificationResponse:
        """``Classify``: tf.Examples in, (label, score) lists out."""
        core_request = proto_codec.example_request_from_proto(request)
        response = await self._inference.classify(
            core_request, timeout_ms=session_timeout_ms(context)
        )
        return proto_codec.classification_response_to_proto(response)

    async def Regress(  # noqa: N802
        self, request: regression_pb2.RegressionRequest, context: grpc.aio.ServicerContext
    ) -> regression_pb2.RegressionResponse:
        """``Regress``: tf.Examples in, one value each out."""
        core_request = proto_codec.example_request_from_proto(request)
        response = await self._inference.regress(
            core_request, timeout_ms=session_timeout_ms(context)
        )
        return proto_codec.regression_response_to_proto(response)

    async def MultiInference(  # noqa: N802
        self, request: inference_pb2.MultiInferenceRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.MultiInferenceResponse:
        """``MultiInference``: several classify/regress signatures, one Session run."""
        core_request = proto_codec.multi_inference_request_from_proto(request)
        response = await self._inference.multi_inference(
            core_request, timeout_ms=session_timeout_ms(context)
        )
        return proto_codec.multi_inference_response_to_proto(response)

    async def GetModelMetadata(  # noqa: N802
        self,
        request: get_model_metadata_pb2.GetModelMetadataRequest,
        context: grpc.aio.ServicerContext,
    ) -> get_model_metadata_pb2.GetModelMetadataResponse:
        """``GetModelMetadata``: the servable's SignatureDefs, ``Any``-packed
        ``SignatureDefMap`` under ``metadata["signature_def"]`` (the only field there is)."""
        proto_codec.require_model_spec(request)
        spec = proto_codec.model_spec_from_proto(request.model_spec)
        return metadata.get_model_metadata(self._manager, spec, request.metadata_field)


class ModelService(model_service_pb2_grpc.ModelServiceServicer):
    """``tensorflow.serving.ModelService``.

    ``reload_config`` applies a new ``ModelServerConfig`` (``ServerCore::ReloadConfig``) and
    raises :class:`ServingError` when it is refused.
    """

    def __init__(self, manager: ServableManager, reload_config: ReloadConfig) -> None:
        self._manager = manager
        self._reload_config = reload_config

    async def GetModelStatus(  # noqa: N802
        self,
        request: get_model_status_pb2.GetModelStatusRequest,
        context: grpc.aio.ServicerContext,
    ) -> get_model_status_pb2.GetModelStatusResponse:
        """``GetModelStatus``: every version's state (or the requested one's), latest first."""
        proto_codec.require_model_spec(request)
        spec = proto_codec.model_spec_from_proto(request.model_spec)
        return metadata.get_model_status(self._manager, spec)

    async def HandleReloadConfigRequest(  # noqa: N802
        self,
        request: model_management_pb2.ReloadConfigRequest,
        context: grpc.aio.ServicerContext,
    ) -> model_management_pb2.ReloadConfigResponse:
        """``HandleReloadConfigRequest``: only a ``model_config_list`` config is accepted.

        On success the response's ``status`` is OK; a refused config is the call's error status
        (TF Serving also fills ``status``, which gRPC does not deliver with an error).
        """
        config = request.config
        if config.WhichOneof("config") != "model_config_list":
            raise ServingError(
                Code.INVALID_ARGUMENT,
                "ServerModelConfig type not supported by HandleReloadConfigRequest. Only "
                "ModelConfigList is currently supported",
            )
        for index, model in enumerate(config.model_config_list.config):
            _log.info(
                "Config entry index: %d path: %s name: %s platform: %s",
                index,
                model.base_path,
                model.name,
                model.model_platform,
            )
        await self._reload_config(config)
        response = model_management_pb2.ReloadConfigResponse()
        response.status.error_code = Code.OK
        return response


class StatusTranslated:
    """``servicer`` with each of ``service``'s methods wrapped once by the front end's one error
    translation (``ToGRPCStatus``), so an exception a method raises ends the call with the
    matching status instead of gRPC's generic ``UNKNOWN``.

    Wrapping the methods before registration, rather than with a ``grpc.aio.ServerInterceptor``,
    keeps grpc.aio on its handler fast path: an interceptor is awaited on every call.

    Args:
        servicer: the object the generated ``add_<Service>Servicer_to_server`` reads methods from.
        service: the service's descriptor (``<module>_pb2.DESCRIPTOR.services_by_name[...]``).
    """

    def __init__(self, servicer: Any, service: Any) -> None:
        for method in service.methods:
            behavior = getattr(servicer, method.name)
            path = f"/{service.full_name}/{method.name}"
            setattr(self, method.name, _translating_errors(behavior, path))


def _translating_errors(
    behavior: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]], method: str
) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]:
    async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await behavior(request, context)
        except grpc.aio.AbortError:  # already a status (context.abort)
            raise
        except ServingError as exc:
            error = exc
        except Exception as exc:  # noqa: BLE001 - any failure must become a status, not a crash
            _log.exception("%s failed", method)
            error = from_exception(exc)
        await context.abort(grpc.StatusCode[error.code.name], _status_message(error.message))

    return call


def _status_message(message: str) -> str:
    if len(message) > _ERROR_MESSAGE_LIMIT:
        return message[:_ERROR_MESSAGE_LIMIT] + "...TRUNCATED"
    return message


def server_arguments(options: ServerOptions) -> list[tuple[str, int | str]]:
    """The ``grpc.aio.server`` options: TF Serving's defaults, replaced key by key by
    ``--grpc_channel_arguments`` (gRPC would keep the first of two equal keys)."""
    arguments: dict[str, int | str] = {
        "grpc.max_receive_message_length": _INT32_MAX,
        "grpc.max_send_message_length": _INT32_MAX,
        "grpc.so_reuseport": 0,
    }
    arguments.update(flags.grpc_channel_arguments(options))
    return list(arguments.items())


def server_credentials(ssl_config_file: str) -> grpc.ServerCredentials | None:
    """TLS credentials from ``--ssl_config_file``; ``None`` (plaintext) when it is empty.

    Raises ``INVALID_ARGUMENT`` for a file that cannot be read or parsed, or keys and
    certificates gRPC refuses (e.g. ``client_verify`` without ``custom_ca``).
    """
    if not ssl_config_file:
        return None
    config = read_text_proto_file(ssl_config_file, SSLConfig(), "SSL config")
    try:
        return grpc.ssl_server_credentials(
            [(config.server_key.encode(), config.server_cert.encode())],
            root_certificates=config.custom_ca.encode() or None,
            require_client_auth=config.client_verify,
        )
    except (TypeError, ValueError) as exc:
        raise ServingError(
            Code.INVALID_ARGUMENT, f"Invalid SSL config '{ssl_config_file}': {exc}"
        ) from None


class GrpcServer:
    """The gRPC front end's lifecycle: bound at construction, then ``start``/``stop``/``force``.

    Binding in the constructor makes a busy port fail start-up (``UNAVAILABLE Failed to
    BuildAndStart gRPC server``) before any model is loaded.
    """

    def __init__(
        self,
        options: ServerOptions,
        prediction_service: PredictionService,
        model_service: ModelService,
    ) -> None:
        self._server = grpc.aio.server(
            options=server_arguments(options),
            maximum_concurrent_rpcs=options.grpc_max_threads or None,
        )
        prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
            StatusTranslated(
                prediction_service,
                prediction_service_pb2.DESCRIPTOR.services_by_name["PredictionService"],
            ),
            self._server,
        )
        model_service_pb2_grpc.add_ModelServiceServicer_to_server(
            StatusTranslated(
                model_service, model_service_pb2.DESCRIPTOR.services_by_name["ModelService"]
            ),
            self._server,
        )
        self._credentials = server_credentials(options.ssl_config_file)
        self.addresses: list[str] = []
        if options.port:
            host = f"[{options.grpc_host}]" if ":" in options.grpc_host else options.grpc_host
            self._bind(f"{host}:{options.port}")
        if options.grpc_socket_path:
            self._bind(f"unix:{options.grpc_socket_path}")
        self.task: asyncio.Future[Any] | None = None
        self._forced: asyncio.Future[None] | None = None

    def _bind(self, address: str) -> None:
        try:
            if self._credentials is None:
                bound = self._server.add_insecure_port(address)
            else:
                bound = self._server.add_secure_port(address, self._credentials)
        except RuntimeError:
            bound = 0
        if not bound and not address.startswith("unix:"):
            raise ServingError(
                Code.UNAVAILABLE, f"Failed to BuildAndStart gRPC server at {address}"
            )
        self.addresses.append(address)

    async def start(self) -> None:
        """Start serving on the bound addresses."""
        await self._server.start()
        self.task = asyncio.ensure_future(self._server.wait_for_termination())
        for address in self.addresses:
            _log.info("Running gRPC ModelServer at %s ...", address)

    async def stop(self) -> None:
        """Refuse new RPCs at once, let in-flight ones finish (up to a grace period)."""
        await self._server.stop(_SHUTDOWN_GRACE_S)
        if self.task is not None:
            with contextlib.suppress(Exception):
                await self.task

    def force(self) -> None:
        """End every in-flight RPC now (a second signal)."""
        self._forced = asyncio.ensure_future(self._server.stop(0))
