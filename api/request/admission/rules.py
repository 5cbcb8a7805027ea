"""Admission limits of one worker: requests in flight, the time budget, the body size.

The rules, applied to every request by `api.request.middleware.RequestMiddleware` before any
route runs, in this order, each answered in the API's error shape (`api.request.errors`):

1. In flight: at most `MAX_IN_FLIGHT_REQUESTS` requests per worker are being handled,
   counted over all the workers together (`api.request.admission.in_flight`: a worker may
   take up to twice its share while others have room); one more is answered 503 `overloaded`
   with `Retry-After` at once. There is no queue: a request waits for nothing but its own
   work, so a burst costs a fast refusal rather than a growing backlog whose answers come
   too late anyway. Probes and metrics (`EXEMPT_PATHS`) are never refused nor counted.
2. Time budget: `REQUEST_TIMEOUT_S` from arrival, lowered by the caller's
   `X-Request-Timeout-Ms` (`parse_timeout_header`); a malformed header is answered 422. A body
   that has not fully arrived by the deadline is answered 408 `request_timeout` (uvicorn
   has no body-read timeout of its own).
3. Body size: a body over `MAX_BODY_BYTES` (or its route's own limit) is answered 413
   `payload_too_large`: at once when `Content-Length` says so, else as soon as the
   streamed (e.g. chunked) bytes counted pass the limit, before the app has buffered
   them. The app's own answer, if it started one, is dropped.
4. Multipart framing: a `multipart/form-data` body that ends without its closing
   boundary (cut short, or empty) is answered 400 `bad_request` (`MultipartCloseWatch`):
   the form parser keeps the parts it finished and says nothing, so the route would
   otherwise report its file as missing (422), as if the client had not sent it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from email.message import Message
from types import MappingProxyType
from typing import Final

# The header a caller lowers its budget with: a positive integer, milliseconds.
TIMEOUT_HEADER: Final = "x-request-timeout-ms"

# Never refused for load: liveness/readiness must answer while the worker is busy,
# and metrics are how the overload is seen.
EXEMPT_PATHS: Final = frozenset({"/healthz", "/readyz", "/metrics"})
#: The Open Inference Protocol's probes (`api.oip`), exempt like ours while its front is on.
OIP_PROBE_PATHS: Final = frozenset({"/v2/health/live", "/v2/health/ready"})

_TIMEOUT_HEADER: Final = TIMEOUT_HEADER.encode("ascii")
_CONTENT_LENGTH: Final = b"content-length"
_CONTENT_TYPE: Final = b"content-type"
_MULTIPART_FORM_DATA: Final = b"multipart/form-data"


@dataclass(frozen=True, slots=True)
class Limits:
    """One worker's admission limits.

    Attributes:
        max_in_flight: each worker's share of the requests handled concurrently
            (`MAX_IN_FLIGHT_REQUESTS`; `api.request.admission.in_flight`).
        request_timeout_s: a request's time budget from arrival, seconds (`REQUEST_TIMEOUT_S`).
        max_body_bytes: largest body, bytes (`MAX_BODY_BYTES`).
        path_body_limits: other body limits for some paths (exact match), bytes: routes
            that take uploads.
        prefix_body_limits: other body limits for the paths under a prefix, bytes (the Open
            Inference Protocol's `/v2/`); an exact match comes first.
        exempt_paths: paths never refused nor counted for load.
        path_limit_settings: the setting that raises a path's limit, named in its 413
            (`MODELS__<ROUTE>__MAX_BODY_BYTES`); other paths name `MAX_BODY_BYTES`.
    """

    max_in_flight: int
    request_timeout_s: float
    max_body_bytes: int
    path_body_limits: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    exempt_paths: frozenset[str] = EXEMPT_PATHS
    prefix_body_limits: tuple[tuple[str, int], ...] = ()
    path_limit_settings: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def body_limit(self, path: str) -> int:
        """Largest body accepted on `path`, bytes."""
        limit = self.path_body_limits.get(path)
        if limit is not None:
            return limit
        for prefix, prefix_limit in self.prefix_body_limits:
            if path.startswith(prefix):
                return prefix_limit
        return self.max_body_bytes

    def too_large(self, path: str) -> str:
        """The 413's detail for `path`: the limit, and the setting that raises it."""
        setting = self.path_limit_settings.get(path, "MAX_BODY_BYTES")
        return f"request body is larger than {self.body_limit(path)} bytes (raise the limit with {setting})"

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


def parse_timeout_header(value: str | None, default_s: float) -> float:
    """The request's budget in seconds: `default_s`, lowered by `X-Request-Timeout-Ms`.

    Args:
        value: the header's value, or None when absent.
        default_s: the configured budget (`REQUEST_TIMEOUT_S`), seconds, > 0.

    Returns:
        min(default_s, value / 1000). A larger header value, of any number of digits, does
        not raise the budget: it is clamped.

    Raises:
        ValueError: the value is not a positive integer number of milliseconds; the
            message says so (answered 422 by the caller).
    """
    if value is None:
        return default_s
    text = value.strip()
    if not text.isascii() or not text.isdigit():
        raise ValueError("must be a positive integer number of milliseconds")
    digits = text.lstrip("0")
    if not digits:
        raise ValueError("must be a positive integer number of milliseconds")
    if len(digits) > 12:  # over 31 years: above any budget (and never parsed as a huge int)
        return default_s
    budget = int(digits) / 1000.0
    return budget if budget < default_s and math.isfinite(budget) else default_s


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


def multipart_boundary(content_type: bytes) -> bytes | None:
    """The `boundary` parameter of a `multipart/form-data` Content-Type, unquoted; None for
    another media type or without one.

    Read as the form parser (python-multipart's `parse_options_header`) reads it: media type
    and parameter names in any case, a quoted value with its `\\` and `\"` escapes undone,
    the RFC 2231 form (`boundary*=`), which RFC 7578 forbids here, not taken. The standard
    library's header parser does that (the API itself does not depend on python-multipart: only
    a route that takes an upload needs it). Only a multipart request pays for the parse.
    """
    if content_type.partition(b";")[0].strip(b" \t").lower() != _MULTIPART_FORM_DATA:
        return None
    header = Message()
    header["content-type"] = content_type.decode("latin-1")
    boundary = header.get_param("boundary")
    return boundary.encode("latin-1") if isinstance(boundary, str) and boundary else None


class MultipartCloseWatch:
    """Watches a `multipart/form-data` body, chunk by chunk, for its close delimiter
    (RFC 2046 5.1.1: `--` boundary `--`, after the last part), without holding the body.

    Attributes:
        seen: the close delimiter has passed.
    """

    def __init__(self, boundary: bytes) -> None:
        self._delimiter = b"--" + boundary + b"--"
        self._tail = b""  # the last len(delimiter) - 1 bytes, for a delimiter split over chunks
        self.seen = False

    @classmethod
    def for_request(cls, headers: Iterable[tuple[bytes, bytes]]) -> MultipartCloseWatch | None:
        """A watch for a `multipart/form-data` request with a boundary; None for any other
        (one without a boundary is refused by the form parser itself)."""
        for name, value in headers:
            if name == _CONTENT_TYPE:
                boundary = multipart_boundary(value)
                return cls(boundary) if boundary else None
        return None

    def feed(self, chunk: bytes) -> None:
        """Look at the next chunk of the body."""
        if self.seen or not chunk:
            return
        data = self._tail + chunk
        if self._delimiter in data:
            self.seen = True
        else:
            self._tail = data[-(len(self._delimiter) - 1) :]
