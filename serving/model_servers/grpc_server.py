"""The gRPC server: TF Serving's ``PredictionService`` and ``ModelService`` on ``grpc.aio``.

Registered from the official generated stubs (``tensorflow_serving.apis.*_pb2_grpc``), so method
paths and messages are TF Serving's own (``/tensorflow.serving.PredictionService/Predict`` ...),
each servicer's methods wrapped once by :func:`~serving.model_servers.grpc_status_util.translated_handler`
(which also answers a request that does not parse as gRPC C++ does, ``INTERNAL``).

Server settings (``model_servers/server.cc``), each a
:class:`~serving.model_servers.flags.ServerOptions` flag:

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
  (``BuildServerCredentialsFromSSLConfigFile``); a bad file fails start-up with one line.

``grpc.aio`` runs on the server's uvloop event loop (checked: it does).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc
from tensorflow_serving.apis import model_service_pb2, prediction_service_pb2

from serving.model_servers import flags
from serving.model_servers.flags import ServerOptions
from serving.model_servers.grpc_status_util import translated_handler
from serving.model_servers.model_service_impl import ModelService
from serving.model_servers.prediction_service_impl import PredictionService
from serving.protos.tensorflow_serving.config.ssl_config_pb2 import SSLConfig
from serving.util.errors import Code, LimitExceeded, ServingError
from serving.util.malloc_trim import MallocTrimmer
from serving.util.proto_util import read_text_proto_file

if TYPE_CHECKING:
    from serving.util.tracing import ServingTracing

__all__ = ["GrpcServer", "server_arguments", "server_credentials"]

_log = logging.getLogger(__name__)

_INT32_MAX = 2**31 - 1
_SHUTDOWN_GRACE_S = 30.0  # in-flight RPCs get this long after SIGTERM; a second signal: none


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
        on_limit: Callable[[LimitExceeded], None] | None = None,
        tracing: ServingTracing | None = None,
    ) -> None:
        """``on_limit`` is told of every request refused for a limit (to count it); ``tracing``
        continues each call's trace (:mod:`serving.util.tracing`)."""
        self._server = grpc.aio.server(
            options=server_arguments(options),
            maximum_concurrent_rpcs=options.grpc_max_threads or None,
        )
        trimmer = MallocTrimmer()  # after large requests, the heap they leave free goes back
        self._server.add_generic_rpc_handlers(
            (
                translated_handler(
                    prediction_service,
                    prediction_service_pb2.DESCRIPTOR.services_by_name["PredictionService"],
                    on_limit,
                    trimmer,
                    tracing,
                ),
                translated_handler(
                    model_service,
                    model_service_pb2.DESCRIPTOR.services_by_name["ModelService"],
                    on_limit,
                    trimmer,
                    tracing,
                ),
            )
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
