"""gRPC errors, translated once: TF Serving's ``grpc_status_util.cc`` (``ToGRPCStatus``).

:class:`StatusTranslated` wraps every method of a servicer: a
:class:`~serving.util.errors.ServingError` becomes the gRPC status of the same canonical code
(``NOT_FOUND Servable not found for request: Latest(foo)``, ``INVALID_ARGUMENT ...``), messages
over 1024 characters cut with ``...TRUNCATED``; any other exception is logged and answered through
:func:`serving.util.errors.from_exception`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from serving.util.errors import ServingError, from_exception

__all__ = ["StatusTranslated"]

_log = logging.getLogger(__name__)

_ERROR_MESSAGE_LIMIT = 1024  # ToGRPCStatus' kErrorMessageLimit


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
