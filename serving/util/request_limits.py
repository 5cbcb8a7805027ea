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
                     (and a URL over 65,535 bytes)       the URL)
``read_timeout``     ``--rest_api_body_read_timeout...`` 408         --
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
    "RequestLimits",
    "body_too_large",
    "head_too_large",
    "read_timed_out",
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
    """414: a request URL over :data:`MAX_URI_BYTES` (possible only with a head limit above it)."""
    return LimitExceeded(
        Code.RESOURCE_EXHAUSTED,
        f"Request URI exceeds the limit of {MAX_URI_BYTES} bytes",
        reason="header_bytes",
        http_status=414,
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
