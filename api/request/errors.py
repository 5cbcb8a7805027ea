"""How errors leave the API: one JSON shape, one table for serving failures.

Every non-2xx answer of the API has this body (media type `application/json`):

    {"detail": <str or list>, "code": "<machine-readable code>", "request_id": "<id>"}

`detail` is a human-readable string, except for 422 where it keeps FastAPI's list of
validation errors (`[{"type", "loc", "msg", "input", "ctx"?}]`, with `input` echoes
truncated so the body stays small however large the request was). `request_id` is
the request's `X-Request-ID` (see `api.request.context`). `code` is one of:

| status | code | when |
| --- | --- | --- |
| 401 | `unauthenticated` | no, or no valid, credential (`api.security.front_door`; `WWW-Authenticate`) |
| 403 | `insufficient_scope` | a valid credential without the path's scope |
| 429 | `rate_limited` | over the client's rate limit (with `Retry-After`) |
| 404, 405, ... | `not_found`, `method_not_allowed`, ... | Starlette's HTTP errors |
| 413 | `payload_too_large` | body over `MAX_BODY_BYTES` (`api.request.admission.rules`) |
| 422 | `validation_error` | the body or a header failed validation |
| 500 | `internal_error` | a bug; nothing about it is echoed |
| 502 | `serving_rejected` | serving refused input that passed our validation |
| 502 | `serving_error` | serving failed running the model (INTERNAL, UNKNOWN) |
| 502 | `serving_bad_response` | serving's answer is unusable (shape, NaN, not JSON) |
| 503 | `overloaded` | this worker is at `MAX_IN_FLIGHT_REQUESTS` (with `Retry-After`) |
| 503 | `serving_unavailable` | serving unreachable, down or overloaded (with `Retry-After`) |
| 503 | `serving_misconfigured` | serving has no such model, version or signature |
| 504 | `deadline_exceeded` | the request's time budget ran out |

On the Open Inference Protocol's paths (`OIP_PATH_PREFIX`, `/v2`: `api.oip`) the body also
carries `"error"`, the detail as text, first: OIP's `{"error": "..."}`, which its clients read.
`error_document` chooses it by the request's path, for every answer: the routes', the
middleware's (admission) and the HTTP server's own refusals (`api.http_server.protocol`:
414, 431, 408, 503 from the head).

Serving failures (`api.serving_client.ServingError` subclasses) and our own deadline
are mapped to these in `ERROR_TABLE` only. Exceptions that leave a route are answered by
`api.request.middleware.RequestMiddleware` through `response_for`; FastAPI's own validation and
HTTP errors by the handlers `install_error_handlers` registers once for every route.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from http import HTTPStatus
from typing import Any, Final

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from api.request.context import current_request
from api.serving_client import (
    DeadlineExceeded,
    ServingBadResponse,
    ServingError,
    ServingInternalError,
    ServingMisconfigured,
    ServingRejected,
    ServingTimeout,
    ServingUnavailable,
)

logger = logging.getLogger("api.request.errors")

# Seconds a client should wait before retrying a 503 (`Retry-After`).
RETRY_AFTER_S = 1
#: The Open Inference Protocol's REST paths (`open_inference_rest.yaml`: `/v2`, `/v2/...`):
#: their errors carry OIP's `error` field (`error_document`), whether OIP is on or not.
OIP_PATH_PREFIX: Final = "/v2"

class PayloadTooLarge(Exception):
    """A request's payload (an uploaded file) is over its route's limit (HTTP 413); the
    exception's text says what, and is shown to the caller."""


# Exception class -> (HTTP status, code, send Retry-After). Most specific first.
ERROR_TABLE: tuple[tuple[type[Exception], int, str, bool], ...] = (
    (PayloadTooLarge, 413, "payload_too_large", False),
    (DeadlineExceeded, 504, "deadline_exceeded", False),
    (ServingTimeout, 504, "deadline_exceeded", False),
    (ServingUnavailable, 503, "serving_unavailable", True),
    (ServingMisconfigured, 503, "serving_misconfigured", False),  # NOT_FOUND included
    (ServingRejected, 502, "serving_rejected", False),
    (ServingBadResponse, 502, "serving_bad_response", False),
    (ServingInternalError, 502, "serving_error", False),
    (ServingError, 502, "serving_error", False),
)

# Bounds of a 422 body: errors listed, and characters of an input echoed per error.
MAX_VALIDATION_ERRORS = 20
MAX_ECHO_CHARS = 200


def speaks_oip(path: str) -> bool:
    """Whether `path` (a request's path, or its target with the query) is one of the Open
    Inference Protocol's (`OIP_PATH_PREFIX` itself, or below it)."""
    return path.startswith(OIP_PATH_PREFIX) and path[len(OIP_PATH_PREFIX) : len(OIP_PATH_PREFIX) + 1] in ("", "/", "?")


def error_document(
    code: str, detail: Any, request_id: str | None, path: str, extra: Mapping[str, Any] | None = None
) -> bytes:
    """The one writer of the API's JSON error body: `{"detail", "code", "request_id"}` (see
    module doc), OIP's `"error"` (the detail as text) first on an OIP path (`speaks_oip`), and
    `extra`'s keys after them where an answer says more (`/readyz`'s per-model report)."""
    body: dict[str, Any] = {"detail": detail, "code": code, "request_id": request_id}
    if speaks_oip(path):
        body = {"error": error_text(detail), **body}
    return orjson.dumps({**body, **extra} if extra else body)


def error_body(status: int, code: str, detail: Any, extra: Mapping[str, Any] | None = None) -> bytes:
    """`error_document` for the current request (`api.request.context`: its id and path)."""
    ctx = current_request()
    if ctx is None:
        return error_document(code, detail, None, "", extra)
    return error_document(code, detail, ctx.request_id, ctx.path, extra)


def error_text(detail: Any) -> str:
    """`detail` as one line of text: itself when a string, else its errors' messages joined."""
    if isinstance(detail, str):
        return detail
    if isinstance(detail, list):
        return "; ".join(str(item.get("msg", item)) if isinstance(item, Mapping) else str(item) for item in detail)
    return str(detail)


def error_response(
    status: int,
    code: str,
    detail: Any,
    headers: Mapping[str, str] | None = None,
    *,
    extra: Mapping[str, Any] | None = None,
) -> Response:
    """A `Response` in the API's error shape (also used by the ASGI middleware)."""
    return Response(
        error_body(status, code, detail, extra),
        status_code=status,
        headers=dict(headers or {}),
        media_type="application/json",
    )


def classify(exc: Exception) -> tuple[int, str, bool]:
    """(status, code, retry_after) for an exception in `ERROR_TABLE`.

    Raises:
        LookupError: `exc` is not in the table.
    """
    for cls, status, code, retry_after in ERROR_TABLE:
        if isinstance(exc, cls):
            return status, code, retry_after
    raise LookupError(type(exc).__name__)


def _status_code_name(status: int) -> str:
    try:
        return HTTPStatus(status).phrase.lower().replace(" ", "_").replace("-", "_")
    except ValueError:
        return f"http_{status}"


_INT64_MIN = -(2**63)
_UINT64_MAX = 2**64 - 1


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _beyond_64_bits(value: Any) -> bool:
    """An integer JSON allows but orjson cannot write (it stops at 64 bits)."""
    return isinstance(value, int) and not isinstance(value, bool) and not _INT64_MIN <= value <= _UINT64_MAX


# orjson writes containers nested this deep at most ("Recursion limit reached").
_ORJSON_MAX_DEPTH = 255


def _encodable(value: Any, depth: int = 0) -> Any:
    """`value` with what orjson refuses made encodable -- lone surrogates escaped (JSON text
    allows `\ud800`, UTF-8 cannot carry it), integers beyond 64 bits as their digits --
    inside lists and dicts as deep as orjson writes (deeper is left as it is)."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8") if _has_surrogate(value) else value
    if _beyond_64_bits(value):
        return str(value)
    if depth >= _ORJSON_MAX_DEPTH:
        return value
    if isinstance(value, Mapping):
        return {_encodable(k, depth + 1): _encodable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encodable(v, depth + 1) for v in value]
    return value


def _json_length(value: Any) -> int:
    """Bytes of `value`'s compact JSON as `bounded` would write it, at any depth (iterative:
    a body may nest containers deeper than orjson, or Python's recursion, goes)."""
    length = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            length += 2 + max(len(item) - 1, 0) + len(item)  # braces, commas, colons
            for key, child in item.items():
                length += len(orjson.dumps(_encodable(str(key))))
                stack.append(child)
        elif isinstance(item, (list, tuple)):
            length += 2 + max(len(item) - 1, 0)
            stack.extend(item)
        else:
            length += len(orjson.dumps(_encodable(item), default=str))
    return length


def _summary(value: Any, length: int) -> str:
    kind = "object" if isinstance(value, Mapping) else "array" if isinstance(value, Sequence) else "value"
    return f"<{kind} of {length} bytes, not echoed>"


def bounded(value: Any, limit: int = MAX_ECHO_CHARS) -> Any:
    """`value` as echoed in an error: strings cut to `limit` characters, containers
    replaced by a short summary once their JSON is longer than `limit`. Whatever a JSON body
    can hold comes back encodable: integers beyond 64 bits as their digits (a string), lone
    surrogates escaped."""
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value[: limit + 1]).decode("utf-8", "replace")
    if isinstance(value, str):
        return _encodable(value if len(value) <= limit else value[:limit] + "…")
    if _beyond_64_bits(value):
        return bounded(str(value), limit)  # its digits, cut like any string
    if value is None or isinstance(value, (bool, int, float)):
        return value
    try:
        encoded = orjson.dumps(value, default=str)
    except TypeError:  # a lone surrogate or an integer beyond 64 bits somewhere inside
        try:
            encoded = orjson.dumps(_encodable(value), default=str)
        except TypeError:
            # Nested deeper than orjson writes: at 2 bytes a level at least, that is far over
            # any limit, and it is summarised like any large value (not echoed as a repr).
            return _summary(value, _json_length(value))
    if len(encoded) <= limit:
        return orjson.loads(encoded)
    return _summary(value, len(encoded))


def bounded_validation_errors(errors: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """FastAPI's validation errors with bounded echoes, at most `MAX_VALIDATION_ERRORS`.

    Keeps each error's `type`, `loc`, `msg`; `input` and `ctx` values go through
    `bounded`. A final entry says how many errors were left out, if any.
    """
    kept: list[dict[str, Any]] = []
    for error in errors[:MAX_VALIDATION_ERRORS]:
        item: dict[str, Any] = {
            "type": error.get("type"),
            "loc": [bounded(part, 64) for part in error.get("loc", ())],
            "msg": bounded(str(error.get("msg", ""))),
        }
        if "input" in error:
            item["input"] = bounded(error["input"])
        ctx = error.get("ctx")
        if isinstance(ctx, Mapping):
            # ctx may hold exception objects (e.g. a validator's ValueError): as text.
            item["ctx"] = {
                str(k): bounded(v if isinstance(v, (str, int, float, bool)) else str(v))
                for k, v in ctx.items()
            }
        kept.append(item)
    if len(errors) > MAX_VALIDATION_ERRORS:
        kept.append(
            {
                "type": "too_many_errors",
                "loc": [],
                "msg": f"{len(errors) - MAX_VALIDATION_ERRORS} more errors not listed",
            }
        )
    return kept


async def _validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    return error_response(422, "validation_error", bounded_validation_errors(exc.errors()))


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    headers = dict(exc.headers or {})
    if exc.status_code < 200 or exc.status_code in (204, 304):
        return Response(status_code=exc.status_code, headers=headers)
    detail = exc.detail if isinstance(exc.detail, str) else bounded(exc.detail)
    return error_response(exc.status_code, _status_code_name(exc.status_code), detail, headers)


def response_for(exc: Exception) -> Response:
    """The answer to an exception that left a route: its `ERROR_TABLE` row, else a 500.

    A serving failure is logged as a warning naming the replica (which the caller never
    sees); any other exception not in the table is a bug, logged with its traceback, and
    nothing about it is echoed.
    """
    try:
        status, code, retry_after = classify(exc)
    except LookupError:
        logger.error("unhandled exception", exc_info=exc)
        return error_response(500, "internal_error", "internal server error")
    if isinstance(exc, ServingError):
        detail = f"serving tier: {exc.message}"
        logger.warning(
            "serving error %s (%s) from %s: %s", code, exc.code.name, exc.target or "-", exc.message
        )
    else:
        detail = str(getattr(exc, "message", exc))
    headers = {"Retry-After": str(RETRY_AFTER_S)} if retry_after else None
    return error_response(status, code, detail, headers)


async def _internal_error(request: Request, exc: Exception) -> Response:
    logger.error("unhandled exception", exc_info=exc)
    return error_response(500, "internal_error", "internal server error")


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers of FastAPI's own errors on `app` (once, for every route).

    Validation and HTTP errors (404, 405, ...) are raised and answered inside FastAPI's
    routing; other exceptions leave the routes and reach `RequestMiddleware`, which answers
    them with `response_for`. The `Exception` handler only answers a failure of that
    middleware itself, from Starlette's outermost `ServerErrorMiddleware`.
    """
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _internal_error)
