"""One error type for the whole model server, carrying a canonical (gRPC-style) code.

Every failure that can reach a client is a :class:`ServingError`. Foreign exceptions (TensorFlow's
``OpError``, ``OSError`` from the filesystem) are translated into it in one place,
:func:`from_exception`. Each protocol front end maps the code once:

* REST: :data:`HTTP_STATUS`, the table of ``ToHTTPStatusCode()`` in TF Serving's
  ``tensorflow_serving/model_servers/http_server.cc``, installed as one exception handler in
  :mod:`serving.model_servers.http_rest_api_handler`.
* gRPC: ``grpc.StatusCode[error.code.name]`` -- the :class:`Code` names and values are the
  canonical codes of ``tensorflow/core/protobuf/error_codes.proto`` and ``grpc.StatusCode`` (the
  enum is the top-level :mod:`canonical_codes`, shared with the API's serving client).

This module is pure: no TensorFlow, grpc or web-framework imports.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from canonical_codes import Code

__all__ = ["HTTP_STATUS", "Code", "LimitExceeded", "ServingError", "from_exception"]


#: Canonical code -> HTTP status, exactly ``ToHTTPStatusCode()`` of TF Serving's http_server.cc.
HTTP_STATUS: Mapping[Code, int] = MappingProxyType(
    {
        Code.OK: 200,
        Code.CANCELLED: 499,  # CLIENT_CLOSED_REQUEST
        Code.UNKNOWN: 500,
        Code.INVALID_ARGUMENT: 400,
        Code.DEADLINE_EXCEEDED: 504,
        Code.NOT_FOUND: 404,
        Code.ALREADY_EXISTS: 409,
        Code.PERMISSION_DENIED: 403,
        Code.RESOURCE_EXHAUSTED: 429,
        Code.FAILED_PRECONDITION: 400,
        Code.ABORTED: 409,
        Code.OUT_OF_RANGE: 400,
        Code.UNIMPLEMENTED: 501,
        Code.INTERNAL: 500,
        Code.UNAVAILABLE: 503,
        Code.DATA_LOSS: 500,
        Code.UNAUTHENTICATED: 401,
    }
)


class ServingError(Exception):
    """A failed request or load: a canonical :class:`Code` plus TF Serving's message text."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def http_status(self) -> int:
        """The HTTP status TF Serving's REST server answers with for this error."""
        return HTTP_STATUS[self.code]

    def status_string(self) -> str:
        """``absl::Status::ToString()``: ``"INVALID_ARGUMENT: <message>"``.

        TF Serving nests this form inside some messages, e.g. ``Failed to process element: 0 of
        'instances' list. Error: INVALID_ARGUMENT: ...``.
        """
        return f"{self.code.name}: {self.message}"

    def __repr__(self) -> str:
        return f"ServingError({self.code.name}, {self.message!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled with its code (Exception's default keeps only the message): errors come back
        # from the codec's worker processes (serving.util.process_executor) as they were raised.
        return (type(self), (self.code, self.message))


class LimitExceeded(ServingError):
    """A request over one of the server's limits (``--rest_api_max_body_bytes``,
    ``--max_request_elements``, ...): refused before it costs more, and counted by ``reason``.

    ``code`` is the gRPC status (``RESOURCE_EXHAUSTED``, as gRPC answers a message over its size
    limit; ``DEADLINE_EXCEEDED`` for a body that arrives too slowly; ``UNAVAILABLE`` while the
    server is busy receiving other bodies or shutting down); ``http_status`` is the REST answer,
    the status HTTP has for the case (413, 431, 408, 503) rather than the code's row of
    :data:`HTTP_STATUS` (429 is for clients sending too often, not too much).
    ``reason`` is the ``reason`` label of ``:tensorflow:serving:request_limit_exceeded_count``
    (:mod:`serving.util.metrics`): ``body_bytes``, ``header_bytes``, ``read_timeout``,
    ``buffered_bytes``, ``shutdown``, ``elements``.
    """

    def __init__(self, code: Code, message: str, *, reason: str, http_status: int) -> None:
        super().__init__(code, message)
        self.reason = reason
        self._http_status = http_status

    @property
    def http_status(self) -> int:
        """The REST status for this limit (413, 431, 408, 503)."""
        return self._http_status

    def __reduce__(self) -> tuple[Any, ...]:
        return (_limit_exceeded, (self.code, self.message, self.reason, self._http_status))


def _limit_exceeded(code: Code, message: str, reason: str, http_status: int) -> LimitExceeded:
    """Unpickles a :class:`LimitExceeded` (its keyword-only arguments)."""
    return LimitExceeded(code, message, reason=reason, http_status=http_status)


def from_exception(exc: BaseException) -> ServingError:
    """Translate any exception into a :class:`ServingError` (the one translation table).

    * :class:`ServingError` -> itself.
    * TensorFlow ``OpError`` (duck-typed: an int ``error_code`` and a ``message``) -> that code
      and message, as TF Serving passes ``Session::Run`` statuses through unchanged.
    * :class:`FileNotFoundError` / other :class:`OSError` -> ``NOT_FOUND`` / ``UNKNOWN``.
    * anything else -> ``UNKNOWN`` with ``str(exc)``.
    """
    if isinstance(exc, ServingError):
        return exc
    error_code = getattr(exc, "error_code", None)
    message = getattr(exc, "message", None)
    if isinstance(error_code, int) and isinstance(message, str):
        try:
            return ServingError(Code(error_code), message)
        except ValueError:
            return ServingError(Code.UNKNOWN, message)
    if isinstance(exc, FileNotFoundError):
        return ServingError(Code.NOT_FOUND, str(exc))
    return ServingError(Code.UNKNOWN, str(exc) or type(exc).__name__)
