"""gRPC errors, translated once: TF Serving's ``grpc_status_util.cc`` (``ToGRPCStatus``).

:func:`translated_handler` registers a servicer's methods with each one wrapped: a
:class:`~serving.util.errors.ServingError` becomes the gRPC status of the same canonical code
(``NOT_FOUND Servable not found for request: Latest(foo)``, ``INVALID_ARGUMENT ...``), messages
over 1024 characters cut with ``...TRUNCATED``; any other exception is logged and answered through
:func:`serving.util.errors.from_exception`.

A request whose bytes do not parse as the method's message is ``INTERNAL``, as gRPC C++ answers it
for TF Serving (``GenericDeserialize`` in ``grpcpp/impl/proto_utils.h``: ``Status(INTERNAL,
msg->InitializationErrorString())``, which the unary handler sends instead of calling the method).
grpc.aio would answer ``UNKNOWN Unexpected <class 'google.protobuf.message.DecodeError'>: ...``:
the request deserializer here never raises, and the wrapper answers. The message differs on
purpose: gRPC C++'s is empty for TF Serving's proto3 messages (no required field is ever missing);
ours says what failed.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf import message_factory
from google.protobuf.message import DecodeError

from serving.util.errors import LimitExceeded, ServingError, from_exception
from serving.util.malloc_trim import LARGE_REQUEST_BYTES, MallocTrimmer

if TYPE_CHECKING:
    from serving.util.tracing import ServingTracing

__all__ = ["translated_handler"]

_log = logging.getLogger(__name__)

_ERROR_MESSAGE_LIMIT = 1024  # ToGRPCStatus' kErrorMessageLimit

Behavior = Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]]


class _Unparsable:
    """What the request deserializer returns for bytes that are not the method's message."""

    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message


class _Large:
    """What the request deserializer returns for a message of :data:`LARGE_REQUEST_BYTES` or
    more: the parsed message, marked so that the heap is trimmed once it is answered."""

    __slots__ = ("message",)

    def __init__(self, message: Any) -> None:
        self.message = message


def translated_handler(
    servicer: Any,
    service: Any,
    on_limit: Callable[[LimitExceeded], None] | None = None,
    trimmer: MallocTrimmer | None = None,
    tracing: ServingTracing | None = None,
) -> grpc.GenericRpcHandler:
    """The handler of ``service``'s (unary) methods, each calling ``servicer``'s method of the
    same name behind the one error translation (``ToGRPCStatus``), so that nothing a method
    raises, and no request that does not parse, ends as gRPC's generic ``UNKNOWN``.

    Wrapping the methods at registration, rather than with a ``grpc.aio.ServerInterceptor``,
    keeps grpc.aio on its handler fast path: an interceptor is awaited on every call.

    Args:
        servicer: the object with one ``async`` method per RPC (the generated servicer's names).
        service: the service's descriptor (``<module>_pb2.DESCRIPTOR.services_by_name[...]``).
        on_limit: told of every request refused for one of the server's limits (to count it).
        trimmer: told when a request of :data:`LARGE_REQUEST_BYTES` or more has been handled.
        tracing: puts a SERVER span around each call, continuing the trace in its metadata.
    """
    handlers = {}
    for method in service.methods:
        request_class = message_factory.GetMessageClass(method.input_type)
        response_class = message_factory.GetMessageClass(method.output_type)
        path = f"/{service.full_name}/{method.name}"
        handlers[method.name] = grpc.unary_unary_rpc_method_handler(
            _traced(_translating_errors(getattr(servicer, method.name), path, on_limit, trimmer), path, tracing),
            request_deserializer=_parser(request_class, large=trimmer is not None),
            response_serializer=response_class.SerializeToString,
        )
    return grpc.method_handlers_generic_handler(service.full_name, handlers)


def _parser(request_class: Any, *, large: bool) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        try:
            message = request_class.FromString(data)
        except DecodeError:
            return _Unparsable(f"Failed to parse request: not a {request_class.DESCRIPTOR.full_name}")
        return _Large(message) if large and len(data) >= LARGE_REQUEST_BYTES else message

    return parse


def _translating_errors(
    behavior: Behavior,
    method: str,
    on_limit: Callable[[LimitExceeded], None] | None,
    trimmer: MallocTrimmer | None,
) -> Behavior:
    async def call(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        if type(request) is _Large:
            assert trimmer is not None
            try:
                return await call(request.message, context)
            finally:
                trimmer.large_request_done()
        if type(request) is _Unparsable:
            code, message = grpc.StatusCode.INTERNAL, request.message
        else:
            try:
                return await behavior(request, context)
            except grpc.aio.AbortError:  # already a status (context.abort)
                raise
            except Exception as exc:  # noqa: BLE001 - any failure must become a status, not a crash
                code, message = _status(exc, method, on_limit)
        # The status is set, not raised with context.abort(): grpc.aio keeps abort()'s exception
        # in the call's state, which (grpcio 1.85, measured) is never freed, and the exception's
        # traceback holds this frame, so the request -- each refused request of 17M empty strings
        # (34 MB, ~800 MB parsed) stayed in memory, +800 MB RSS per request. Only the status
        # outlives the except block, for the same reason. A unary handler that returns after a
        # non-OK code sends that status and no message.
        context.set_code(code)
        context.set_details(message)
        return None

    return call


def _traced(behavior: Behavior, method: str, tracing: ServingTracing | None) -> Behavior:
    """``behavior`` inside a SERVER span recording the status it leaves (itself when not tracing)."""
    if tracing is None:
        return behavior

    async def call(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        async with tracing.grpc_call(method, context.invocation_metadata()) as span:
            try:
                return await behavior(request, context)
            finally:  # the status the translation (or an abort) set; none set: OK
                code = context.code()
                tracing.grpc_status(span, code.name if code is not None else "OK", context.details() or "")

    return call


def _status(
    exc: Exception, method: str, on_limit: Callable[[LimitExceeded], None] | None
) -> tuple[grpc.StatusCode, str]:
    """``ToGRPCStatus`` of what a method raised (logged when unexpected; limits told to ``on_limit``)."""
    if not isinstance(exc, ServingError):
        _log.error("%s failed", method, exc_info=exc)
    error = from_exception(exc)
    if isinstance(error, LimitExceeded) and on_limit is not None:
        on_limit(error)
    return grpc.StatusCode[error.code.name], _status_message(error.message)


def _status_message(message: str) -> str:
    if len(message) > _ERROR_MESSAGE_LIMIT:
        return message[:_ERROR_MESSAGE_LIMIT] + "...TRUNCATED"
    return message

