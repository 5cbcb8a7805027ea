"""The serving client's error hierarchy and the tables that build it.

Every failure of a call to the serving tier leaves `api.serving_client` as a
`ServingError` subclass carrying a canonical `Code` (the codes of
`tensorflow/core/protobuf/error_codes.proto`, which are gRPC's `grpc.StatusCode`; the enum
is the top-level `canonical_codes`, shared with the model server):

| Code | class | meaning for the API |
| --- | --- | --- |
| UNAVAILABLE, RESOURCE_EXHAUSTED, ABORTED, CANCELLED | `ServingUnavailable` | serving down, overloaded or unreachable |
| DEADLINE_EXCEEDED | `ServingTimeout` | no answer within the request's deadline |
| NOT_FOUND | `ServingNotFound` | model or version not loaded there |
| FAILED_PRECONDITION, UNIMPLEMENTED, PERMISSION_DENIED, UNAUTHENTICATED | `ServingMisconfigured` | no such signature |
| INVALID_ARGUMENT, OUT_OF_RANGE | `ServingRejected` | serving refused input we had validated |
| INTERNAL, UNKNOWN, DATA_LOSS, ALREADY_EXISTS | `ServingInternalError` | serving failed running it |
| (ours) | `ServingBadResponse` | serving answered something we cannot use |

Transports translate their own failures into a code in one place each: gRPC's status
code is the code; a REST status goes through `code_for_http_status`, the inverse of
TF Serving's `ToHTTPStatusCode()` (model_servers/http_server.cc). The code becomes a
class through `error_for_code` only. How each class is answered over HTTP is decided
once, in `api.request.errors`.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from api.serving_client._deadline import Deadline
from api.serving_client._tf_messages import without_graph_internals
from canonical_codes import Code

# Wordings the transports share, so one failure reads the same over REST, over gRPC and
# through coalescing.
DEADLINE_PASSED = "no answer within the request deadline"
UNREACHABLE = "connection refused or unreachable"

# Longest message kept from serving's answer: enough for TF Serving's messages, bounded
# so an error body can never echo a huge payload.
MAX_MESSAGE_CHARS = 500


def truncate(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """`text` cut to at most `limit` characters, marked with an ellipsis when cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


class ServingError(Exception):
    """The serving tier could not produce an answer.

    Attributes:
        message: human-readable reason (at most `MAX_MESSAGE_CHARS`), safe to show to
            API callers: names the model or tensor when known, never TensorFlow's graph
            nodes, tracebacks or function names (`_tf_messages.without_graph_internals`).
        code: canonical code of the failure.
        status_code: HTTP status the serving tier answered with (REST only), if any.
        replica_down: True when the replica could not be reached at all (connection
            refused, DNS, connect timeout): the caller may skip it for a while.
        target: the replica that failed (for logs; kept out of `message`, which callers
            see, so the API does not reveal its topology).
    """

    default_code = Code.UNKNOWN

    def __init__(
        self,
        message: str,
        code: Code | None = None,
        *,
        status_code: int | None = None,
        replica_down: bool = False,
        target: str | None = None,
    ) -> None:
        # Callers see it: TensorFlow's node names and tracebacks are left out first.
        self.message = truncate(without_graph_internals(message))
        super().__init__(self.message)
        self.code = code if code is not None else self.default_code
        self.status_code = status_code
        self.replica_down = replica_down
        self.target = target

    def __reduce__(self) -> tuple[object, ...]:  # copy.copy / pickle keep the keywords
        return (
            _rebuild,
            (type(self), self.message, self.code, self.status_code, self.replica_down, self.target),
        )


def _rebuild(
    cls: type[ServingError],
    message: str,
    code: Code,
    status_code: int | None,
    replica_down: bool,
    target: str | None,
) -> ServingError:
    return cls(message, code, status_code=status_code, replica_down=replica_down, target=target)


class ServingUnavailable(ServingError):
    """Serving is unreachable, down, overloaded, or dropped the connection."""

    default_code = Code.UNAVAILABLE


class ServingTimeout(ServingError):
    """Serving did not answer within the request's deadline."""

    default_code = Code.DEADLINE_EXCEEDED


class ServingMisconfigured(ServingError):
    """Serving cannot run this call as deployed: no such model, version or signature."""

    default_code = Code.FAILED_PRECONDITION


class ServingNotFound(ServingMisconfigured):
    """NOT_FOUND: serving has no such model or version loaded (TF Serving's 404)."""

    default_code = Code.NOT_FOUND


class ServingRejected(ServingError):
    """Serving refused the request's input (INVALID_ARGUMENT): a contract mismatch."""

    default_code = Code.INVALID_ARGUMENT


class ServingInternalError(ServingError):
    """Serving failed while running the request (INTERNAL, UNKNOWN, ...)."""

    default_code = Code.INTERNAL


class ServingBadResponse(ServingError):
    """Serving answered, but not with what the call needs (not JSON, wrong shape, ...)."""

    default_code = Code.INTERNAL


# The one table from canonical code to class. Codes not listed are INTERNAL-like.
ERROR_CLASS: Mapping[Code, type[ServingError]] = MappingProxyType(
    {
        Code.UNAVAILABLE: ServingUnavailable,
        Code.RESOURCE_EXHAUSTED: ServingUnavailable,
        Code.ABORTED: ServingUnavailable,
        Code.CANCELLED: ServingUnavailable,
        Code.DEADLINE_EXCEEDED: ServingTimeout,
        Code.NOT_FOUND: ServingNotFound,
        Code.FAILED_PRECONDITION: ServingMisconfigured,
        Code.UNIMPLEMENTED: ServingMisconfigured,
        Code.PERMISSION_DENIED: ServingMisconfigured,
        Code.UNAUTHENTICATED: ServingMisconfigured,
        Code.INVALID_ARGUMENT: ServingRejected,
        Code.OUT_OF_RANGE: ServingRejected,
        Code.INTERNAL: ServingInternalError,
        Code.UNKNOWN: ServingInternalError,
        Code.DATA_LOSS: ServingInternalError,
        Code.ALREADY_EXISTS: ServingInternalError,
    }
)

# REST status -> code: the inverse of TF Serving's ToHTTPStatusCode(). Where two codes
# share a status (400: INVALID_ARGUMENT, FAILED_PRECONDITION, OUT_OF_RANGE) the most
# common one is listed; see `code_for_http_status` for the one message that tells them
# apart. 502/503 also come from proxies in front of serving.
_HTTP_STATUS_CODE: Mapping[int, Code] = MappingProxyType(
    {
        400: Code.INVALID_ARGUMENT,
        401: Code.UNAUTHENTICATED,
        403: Code.PERMISSION_DENIED,
        404: Code.NOT_FOUND,
        409: Code.ABORTED,
        412: Code.FAILED_PRECONDITION,
        429: Code.RESOURCE_EXHAUSTED,
        499: Code.CANCELLED,
        500: Code.INTERNAL,
        501: Code.UNIMPLEMENTED,
        502: Code.UNAVAILABLE,
        503: Code.UNAVAILABLE,
        504: Code.DEADLINE_EXCEEDED,
    }
)

# TF Serving answers a missing signature with FAILED_PRECONDITION, which its REST API
# also sends as 400; only the message tells it from a bad input. Its wordings:
# 'Serving signature name: "x" not found in signature def' (predict) and
# 'Serving signature key "x" not found.' (metadata, classify/regress).
_MISSING_SIGNATURE = ("serving signature", "not found")


def code_for_http_status(status: int, message: str) -> Code:
    """Canonical code of a non-2xx REST answer from TF Serving.

    Args:
        status: the HTTP status.
        message: TF Serving's `{"error": ...}` text.
    """
    code = _HTTP_STATUS_CODE.get(status)
    if code is None:
        code = Code.INVALID_ARGUMENT if 400 <= status < 500 else Code.INTERNAL
    if code is Code.INVALID_ARGUMENT and all(part in message.lower() for part in _MISSING_SIGNATURE):
        return Code.FAILED_PRECONDITION
    return code


def error_for_code(
    code: Code,
    message: str,
    *,
    status_code: int | None = None,
    replica_down: bool = False,
    target: str | None = None,
) -> ServingError:
    """The `ServingError` subclass for `code` (table `ERROR_CLASS`), carrying `code`."""
    cls = ERROR_CLASS.get(code, ServingInternalError)
    return cls(message, code, status_code=status_code, replica_down=replica_down, target=target)


def is_retryable(exc: BaseException) -> bool:
    """True for failures another attempt (on another replica) may not have.

    Only UNAVAILABLE is: nothing ran, or a connection died under the call. Predict is a
    pure function of its inputs, so a call that may have run is still safe to repeat.
    """
    return isinstance(exc, ServingError) and exc.code is Code.UNAVAILABLE


def call_budget(deadline: Deadline, cap_s: float, target: str) -> float:
    """Seconds one call to `target` may take: what is left of `deadline`, at most `cap_s`.

    Raises:
        ServingTimeout: the deadline has passed; the call is not sent.
    """
    budget = deadline.budget(cap_s)
    if budget <= 0:
        raise ServingTimeout("request deadline passed before the call", target=target)
    return budget
