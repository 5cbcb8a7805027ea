"""Admission limits of one worker: requests in flight, the time budget, the body size.

The rules, applied to every request by `api.middleware.RequestMiddleware` before any
route runs, in this order, each answered in the API's error shape (`api.errors`):

1. In flight: at most `MAX_IN_FLIGHT_REQUESTS` requests per worker are being handled;
   one more is answered 503 `overloaded` with `Retry-After` at once. There is no queue:
   a request waits for nothing but its own work, so a burst costs a fast refusal rather
   than a growing backlog whose answers come too late anyway. Probes and metrics
   (`EXEMPT_PATHS`) are never refused nor counted.
2. Time budget: `REQUEST_TIMEOUT_S` from arrival, lowered by the caller's
   `X-Request-Timeout-Ms` (`api.deadlines`); a malformed header is answered 422. A body
   that has not fully arrived by the deadline is answered 408 `request_timeout` (uvicorn
   has no body-read timeout of its own).
3. Body size: a body over `MAX_BODY_BYTES` (or its route's own limit) is answered 413
   `payload_too_large`: at once when `Content-Length` says so, else as soon as the
   streamed (e.g. chunked) bytes counted pass the limit, before the app has buffered
   them. The app's own answer, if it started one, is dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

from api.deadlines import TIMEOUT_HEADER, parse_timeout_header

# Never refused for load: liveness/readiness must answer while the worker is busy,
# and metrics are how the overload is seen.
EXEMPT_PATHS: Final = frozenset({"/healthz", "/readyz", "/metrics"})

_TIMEOUT_HEADER: Final = TIMEOUT_HEADER.encode("ascii")
_CONTENT_LENGTH: Final = b"content-length"


@dataclass(frozen=True, slots=True)
class Limits:
    """One worker's admission limits.

    Attributes:
        max_in_flight: requests handled concurrently at most (`MAX_IN_FLIGHT_REQUESTS`).
        request_timeout_s: a request's time budget from arrival, seconds (`REQUEST_TIMEOUT_S`).
        max_body_bytes: largest body, bytes (`MAX_BODY_BYTES`).
        path_body_limits: other body limits for some paths (exact match), bytes: routes
            that take uploads.
        exempt_paths: paths never refused nor counted for load.
    """

    max_in_flight: int
    request_timeout_s: float
    max_body_bytes: int
    path_body_limits: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    exempt_paths: frozenset[str] = EXEMPT_PATHS

    def body_limit(self, path: str) -> int:
        """Largest body accepted on `path`, bytes."""
        return self.path_body_limits.get(path, self.max_body_bytes)

    def overloaded_detail(self) -> str:
        """The 503 `overloaded` message."""
        return f"this worker is at its limit of {self.max_in_flight} requests in flight"

    def time_budget(self, headers: Iterable[tuple[bytes, bytes]]) -> float:
        """The request's budget in seconds: `request_timeout_s`, lowered by `X-Request-Timeout-Ms`.

        Repeated field lines combine into one comma-separated value (RFC 9110 5.3), which a
        single number never is: a repeated header is refused, not silently half-read.

        Raises:
            BadTimeoutHeader: the header is not one positive integer of milliseconds.
        """
        values = [v for k, v in headers if k == _TIMEOUT_HEADER]
        if not values:
            return self.request_timeout_s
        header = b", ".join(values).decode("latin-1")
        try:
            return parse_timeout_header(header, self.request_timeout_s)
        except ValueError as exc:
            raise BadTimeoutHeader(str(exc), header) from None


class BadTimeoutHeader(ValueError):
    """`X-Request-Timeout-Ms` is malformed (answered 422).

    Attributes:
        detail: the 422 body's `detail`, in FastAPI's validation-error format.
    """

    def __init__(self, message: str, value: str) -> None:
        super().__init__(message)
        self.detail = [{"type": "value_error", "loc": ["header", TIMEOUT_HEADER], "msg": message, "input": value[:64]}]


def declared_length(headers: Iterable[tuple[bytes, bytes]]) -> int | None:
    """The body size `Content-Length` announces, or None without one.

    A malformed value reads as -1: uvicorn's parsers refuse such a request before the app
    sees it, so it cannot be over any limit here.
    """
    for name, value in headers:
        if name == _CONTENT_LENGTH:
            try:
                return int(value)
            except ValueError:
                return -1
    return None
