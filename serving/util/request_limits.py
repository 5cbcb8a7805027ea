"""The request limits of the model server, and the errors a request over one of them gets.

TF Serving has none of these on REST (its libevent HTTP server reads any body and any head, as
slowly as the client sends them) and keeps gRPC's message limit at ``INT_MAX``. Ours are flags
(:mod:`serving.model_servers.flags`), each with a clear answer, counted in
``:tensorflow:serving:request_limit_exceeded_count{entrypoint, reason}``
(:mod:`serving.util.metrics`), and each refusing the request before it costs more than the limit:

===================  ==================================  ==========  =====================
reason               limit (flag)                        REST        gRPC
===================  ==================================  ==========  =====================
``body_bytes``       ``--rest_api_max_body_bytes``       413         (gRPC's own message
                                                                     limit, RESOURCE_EXHAUSTED)
``header_bytes``     ``--rest_api_max_header_bytes``     431 (414:   --
                     (and, when that is above 64 KiB,    the URL)
                     a URL over 65,535 bytes)
``read_timeout``     ``--rest_api_body_read_timeout...`` 408         --
``buffered_bytes``   ``--rest_api_max_buffered_body...`` 503         --
``shutdown``         ``--rest_api_shutdown_body...``     503         --
``elements``         ``--max_request_elements``          413         RESOURCE_EXHAUSTED
===================  ==================================  ==========  =====================

REST answers carry TF Serving's error body, ``{"error": "<message>"}``, and close the connection
(what is left of the request on it is not read). Pure: no framework imports.
"""

from __future__ import annotations

from dataclasses import dataclass

from serving.util.errors import Code, LimitExceeded

__all__ = [
    "MAX_URI_BYTES",
    "UNCOUNTED_BODY_BYTES",
    "BufferedBodyBudget",
    "RequestLimits",
    "body_too_large",
    "buffered_bodies_full",
    "head_too_large",
    "read_timed_out",
    "shutting_down",
    "too_many_elements",
    "uri_too_long",
]


@dataclass(frozen=True)
class RequestLimits:
    """The limits in force; ``None`` is no limit."""

    max_body_bytes: int | None = None
    """Largest REST request body, bytes."""
    max_header_bytes: int = 64 * 1024
    """Largest REST request head (request line and headers), bytes."""
    read_timeout_s: float | None = None
    """Time a REST client has to send a request's head, and then its body, seconds."""
    max_elements: int | None = None
    """Most values in a request: its input tensors' elements (Predict) or tf.Examples."""
    max_buffered_body_bytes: int | None = None
    """Most bytes of REST request bodies being received at once, over all connections
    (:class:`BufferedBodyBudget`)."""
    shutdown_read_timeout_s: float = 5.0
    """Once the server is shutting down, time a REST request still receiving its body has left
    to receive it, seconds (0: none, it is closed at once)."""

    def check_elements(self, count: int, what: str = "tensor elements") -> None:
        """Raise :func:`too_many_elements` when ``count`` is over :attr:`max_elements`."""
        if self.max_elements is not None and count > self.max_elements:
            raise too_many_elements(count, self.max_elements, what)


def body_too_large(limit: int, size: int | None = None) -> LimitExceeded:
    """413: a body over ``--rest_api_max_body_bytes`` (``size`` when its Content-Length said)."""
    told = f" of {size} bytes" if size is not None else ""
    return LimitExceeded(
        Code.RESOURCE_EXHAUSTED,
        f"Request body{told} exceeds the limit of {limit} bytes (--rest_api_max_body_bytes)",
        reason="body_bytes",
        http_status=413,
    )


#: REST bodies under this many bytes are not counted in :class:`BufferedBodyBudget`: any
#: connection can make the server hold as much anyway (uvicorn reads up to 64 KiB of a request
#: before pausing the socket, whether or not the app has asked for the body), so counting them
#: would bound nothing, and would let large stalled bodies starve small, well-behaved requests.
UNCOUNTED_BODY_BYTES = 64 * 1024


class BufferedBodyBudget:
    """The bytes of REST request bodies being received, over all connections, against
    ``--rest_api_max_buffered_body_bytes``.

    Each stalled connection sending a large body holds what it sent until the body is complete
    or times out (1 MiB for 30 s at the default limits), and nothing else bounds the number of
    such connections: measured on a shared 2-core machine, 400 of them took the server's RSS from
    776 to 1134 MB, 1000 to 1787 MB. A body of :data:`UNCOUNTED_BODY_BYTES` or more reserves its
    ``Content-Length`` when its head arrives, a chunked body its bytes as they arrive (once past
    that size); one that does not fit is refused (:func:`buffered_bodies_full`). Used on the event
    loop only: not thread-safe.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        """Most bytes held at once."""
        self.held = 0
        """Bytes reserved now."""

    def reserve(self, size: int) -> bool:
        """Reserve ``size`` bytes; ``False`` (and nothing reserved) when they do not fit."""
        if self.held + size > self.limit:
            return False
        self.held += size
        return True

    def release(self, size: int) -> None:
        """Give back ``size`` bytes reserved before."""
        self.held -= size


def buffered_bodies_full(limit: int) -> LimitExceeded:
    """503 / UNAVAILABLE: a body that does not fit in ``--rest_api_max_buffered_body_bytes`` now."""
    return LimitExceeded(
        Code.UNAVAILABLE,
        "Server is busy receiving other request bodies: they hold the limit of "
        f"{limit} bytes (--rest_api_max_buffered_body_bytes); retry later",
        reason="buffered_bytes",
        http_status=503,
    )


def shutting_down(timeout_s: float) -> LimitExceeded:
    """503 / UNAVAILABLE: a body still being received ``timeout_s`` after shutdown began."""
    return LimitExceeded(
        Code.UNAVAILABLE,
        f"Server is shutting down: request body not received within {timeout_s * 1000:.0f} ms "
        "of it (--rest_api_shutdown_body_read_timeout_in_ms)",
        reason="shutdown",
        http_status=503,
    )


def head_too_large(limit: int) -> LimitExceeded:
    """431: a request line and headers over ``--rest_api_max_header_bytes``."""
    return LimitExceeded(
        Code.RESOURCE_EXHAUSTED,
        f"Request header fields exceed the limit of {limit} bytes (--rest_api_max_header_bytes)",
        reason="header_bytes",
        http_status=431,
    )


#: The longest request URL (path and query) the HTTP parser can split (httptools, whose offsets
#: are 16-bit), whatever ``--rest_api_max_header_bytes`` allows.
MAX_URI_BYTES = 65_535


def uri_too_long() -> LimitExceeded:
    """414: a request URL over :data:`MAX_URI_BYTES` (possible only with a head limit above it;
    under the default 64 KiB head limit such a URL makes the head too large first: 431)."""
    return LimitExceeded(
        Code.RESOURCE_EXHAUSTED,
        f"Request URI exceeds the limit of {MAX_URI_BYTES} bytes",
        reason="header_bytes",
        http_status=414,
    )


def missing_host() -> LimitExceeded:
    """400 / INVALID_ARGUMENT: an HTTP/1.1 request without exactly one ``Host`` field (RFC 9112,
    section 3.2: the server MUST answer 400)."""
    return LimitExceeded(
        Code.INVALID_ARGUMENT,
        "HTTP/1.1 request without exactly one Host header field (RFC 9112, section 3.2)",
        reason="missing_host",
        http_status=400,
    )


def read_timed_out(timeout_s: float, part: str) -> LimitExceeded:
    """408: the request's ``part`` (``head`` or ``body``) did not arrive in time."""
    return LimitExceeded(
        Code.DEADLINE_EXCEEDED,
        f"Request {part} not received within {timeout_s * 1000:.0f} ms "
        "(--rest_api_body_read_timeout_in_ms)",
        reason="read_timeout",
        http_status=408,
    )


def too_many_elements(count: int, limit: int, what: str = "tensor elements") -> LimitExceeded:
    """413 / RESOURCE_EXHAUSTED: a request carrying more than ``--max_request_elements``."""
    return LimitExceeded(
        Code.RESOURCE_EXHAUSTED,
        f"Request has {count} {what}, more than the limit of {limit} (--max_request_elements)",
        reason="elements",
        http_status=413,
    )
