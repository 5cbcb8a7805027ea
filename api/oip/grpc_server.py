"""The OIP gRPC server (`inference.GRPCInferenceService`) in each API worker, and its call path.

    async with serve_grpc(service, settings, in_flight=board, metrics=metrics, hooks=hooks):
        ...   # in the worker's lifespan, on the worker's event loop

Process model: every API worker runs a `grpc.aio` server on its own event loop, bound to the
same port with SO_REUSEPORT (gRPC's default on Linux), so the kernel spreads connections over
the workers as it spreads HTTP ones. A call is then served by the very worker state a model
route uses: its serving client (the same coalescing batches, replicas, retries and
discovery: a gRPC and a REST request for the same model can share one Predict), the
in-flight board shared by all workers, its metrics and its access log. One extra gRPC process
instead would need a serving client, coalescing and in-flight share of its own, beside the
workers, and would be one more process to size and supervise; none of it is TensorFlow
either way.

Every call goes through `_CallPath.run`, the gRPC twin of the API's one middleware:

1. a `RequestContext` bound for the call: the caller's `x-request-id` metadata when valid
   (else a new id), returned in the trailing metadata; the deadline is `REQUEST_TIMEOUT_S`
   from arrival, lowered by the caller's gRPC deadline;
2. admission: the in-flight limit of every worker together (`MAX_IN_FLIGHT_REQUESTS`,
   `api.request.admission.in_flight`), UNAVAILABLE "overloaded" over it (the health RPCs
   are never refused nor counted); the message size bound is gRPC's own
   (`OIP__MAX_BODY_BYTES`, RESOURCE_EXHAUSTED over it);
3. the hooks, in order, each an interceptor around the rest of the call (`RpcHook`): where
   authentication, rate limits and tracing plug in, from a function of the call's metadata
   (`metadata_check` adapts one); a hook refuses with `RpcRefused`;
4. the RPC itself; an `OipError` becomes its canonical code and message, anything else
   INTERNAL without details (logged); a refusal carries in its trailing metadata what the
   REST answer has as headers: `retry-after` (seconds: REST's `Retry-After`) with
   UNAVAILABLE and RESOURCE_EXHAUSTED for overload, serving unavailable or a rate limit,
   `www-authenticate` (the 401's and 403's challenge) with UNAUTHENTICATED and
   PERMISSION_DENIED;
5. `api_request_duration_seconds{method="GRPC", route=<method path>, status=<the REST
   status of the code>}`, the stage histograms, `api_requests_in_flight`,
   `api_serving_errors_total` and one `api.access` log line, as for HTTP requests.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Final, TypeVar

import grpc
import grpc.aio
from google.protobuf.message import Message

from api.config.oip import OipSettings
from api.observability.logging_config import AccessLog
from api.observability.metrics import ApiMetrics
from api.oip.grpc_service import HEALTH_METHODS, SERVICE, InferenceServicer
from api.oip.hooks import RpcCall, RpcHook, RpcNext, RpcRefused
from api.oip.service import OipService
from api.oip.types import HTTP_STATUS, OipError
from api.request.admission.in_flight import InFlightBoard
from api.request.context import REQUEST_ID_HEADER, RequestContext, bind, new_request_id, unbind
from api.request.errors import RETRY_AFTER_S
from api.serving_client import Code, Deadline

logger = logging.getLogger("api.oip.grpc")

_VALID_REQUEST_ID: Final = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
# Answers are tensors: as large as serving's own gRPC limit (the serving client's 64 MiB).
MAX_SEND_BYTES: Final = 64 * 1024 * 1024
_Response = TypeVar("_Response", bound=Message)
#: The trailing metadata key of a refusal's "retry in this many seconds" (REST's Retry-After).
RETRY_AFTER: Final = "retry-after"
#: What an overload refusal carries: REST's 503 `Retry-After` value.
RETRY_LATER: Final = ((RETRY_AFTER, str(RETRY_AFTER_S)),)


class _CallPath:
    """Every call's context, admission, hooks, error answer and records (see module doc)."""

    def __init__(
        self,
        *,
        request_timeout_s: float,
        in_flight: InFlightBoard,
        metrics: ApiMetrics,
        access_log: AccessLog,
        hooks: Sequence[RpcHook],
    ) -> None:
        self._timeout_s = request_timeout_s
        self._in_flight = in_flight
        self._metrics = metrics
        self._access_log = access_log
        self._hooks = tuple(hooks)

    async def run(
        self,
        method: str,
        context: grpc.aio.ServicerContext[Any, Any],
        call: Callable[[Deadline], Awaitable[_Response]],
    ) -> _Response:
        started = time.monotonic()
        metadata = {
            key: value
            for key, value in (context.invocation_metadata() or ())
            if isinstance(value, str) and not key.endswith("-bin")
        }
        given_id = metadata.get(REQUEST_ID_HEADER, "")
        request_id = given_id if _VALID_REQUEST_ID.fullmatch(given_id) else new_request_id()
        budget = self._timeout_s
        remaining = context.time_remaining()
        if remaining is not None:
            budget = min(budget, max(remaining, 0.0))
        ctx = RequestContext(request_id, started, Deadline(started + budget))
        trailing = ((REQUEST_ID_HEADER, request_id),)
        context.set_trailing_metadata(trailing)
        token = bind(ctx)
        counted = method not in HEALTH_METHODS
        gauge = self._metrics.in_flight
        gauge.inc()
        code = Code.OK
        message = ""
        serving_code: Code | None = None
        refusal: tuple[tuple[str, str], ...] = ()
        try:
            if counted and self._in_flight.full():
                busy, limit = self._in_flight.totals()
                code, message = Code.UNAVAILABLE, f"overloaded: at the limit of requests in flight ({busy} of {limit})"
                refusal = RETRY_LATER
            else:
                if counted:
                    self._in_flight.enter()
                try:
                    return await self._through_hooks(RpcCall(method, metadata, context.peer()), ctx, call)
                except OipError as exc:
                    code, message, serving_code = exc.code, exc.message, exc.serving_code
                    refusal = RETRY_LATER if exc.http_status == 503 else ()  # as REST's Retry-After
                except RpcRefused as exc:
                    code, message, refusal = exc.code, exc.message, exc.trailing
                    if code in (Code.RESOURCE_EXHAUSTED, Code.UNAVAILABLE) and not _has(refusal, RETRY_AFTER):
                        refusal = (*refusal, *RETRY_LATER)
                except Exception as exc:
                    if isinstance(exc, grpc.aio.AbortError):
                        raise
                    logger.error("unhandled exception in %s", method, exc_info=exc)
                    code, message = Code.INTERNAL, "internal server error"
                finally:
                    if counted:
                        self._in_flight.leave()
            await context.abort(grpc.StatusCode[code.name], message, (*trailing, *refusal))
        finally:
            gauge.dec()
            unbind(token)
            self._record(method, ctx, code, time.monotonic() - started, serving_code, context)
        raise AssertionError("unreachable: abort raises")

    async def _through_hooks(
        self, call: RpcCall, ctx: RequestContext, rpc: Callable[[Deadline], Awaitable[_Response]]
    ) -> _Response:
        async def innermost() -> Message:
            return await rpc(ctx.deadline)

        proceed: RpcNext = innermost
        for hook in reversed(self._hooks):
            proceed = _wrap(hook, call, proceed)
        # Hooks pass the innermost call's own message through; they are typed for any message.
        return await proceed()  # type: ignore[return-value]

    def _record(
        self,
        method: str,
        ctx: RequestContext,
        code: Code,
        total: float,
        serving_code: Code | None,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> None:
        metrics = self._metrics
        status = "200" if code is Code.OK else str(HTTP_STATUS.get(code, 502))
        metrics.child(metrics.request_duration, "GRPC", method, status).observe(total)
        for name, seconds in ctx.stages.items():
            metrics.child(metrics.stage_duration, method, name).observe(seconds)
        metrics.child(metrics.stage_duration, method, "total").observe(total)
        if serving_code is not None:
            metrics.child(metrics.serving_errors, serving_code.name).inc()
        if self._access_log.enabled:
            self._access_log.write(
                f"GRPC {method} {code.name}",
                {
                    "request_id": ctx.request_id,
                    "method": "GRPC",
                    "path": method,
                    "route": method,
                    "status": status,
                    "grpc_code": code.name,
                    "duration_ms": round(total * 1000, 3),
                    "model_name": ctx.model_name,
                    "model_version": ctx.model_version,
                    "client": context.peer(),
                },
            )


def _has(metadata: Sequence[tuple[str, str]], key: str) -> bool:
    return any(name == key for name, _ in metadata)


def _wrap(hook: RpcHook, call: RpcCall, proceed: RpcNext) -> RpcNext:
    async def step() -> Message:
        return await hook(call, proceed)

    return step


@asynccontextmanager
async def serve_grpc(
    service: OipService,
    settings: OipSettings,
    *,
    request_timeout_s: float,
    in_flight: InFlightBoard,
    metrics: ApiMetrics,
    access_log: AccessLog,
    hooks: Sequence[RpcHook] = (),
) -> AsyncIterator[int]:
    """Run the OIP gRPC server of this worker while the block runs; yields the bound port.

    On exit the server stops taking calls and waits up to `request_timeout_s` for those in
    flight (each is bounded by its deadline anyway), so nothing in flight is lost.

    Raises:
        RuntimeError: the port cannot be bound.
    """
    server = grpc.aio.server(
        options=[
            ("grpc.so_reuseport", 1),
            ("grpc.max_receive_message_length", settings.max_body_bytes),
            ("grpc.max_send_message_length", MAX_SEND_BYTES),
        ]
    )
    path = _CallPath(
        request_timeout_s=request_timeout_s, in_flight=in_flight, metrics=metrics, access_log=access_log, hooks=hooks
    )
    server.add_generic_rpc_handlers((InferenceServicer(service, path.run).handler(),))
    address = f"{settings.grpc_host}:{settings.grpc_port}"
    try:
        port = server.add_insecure_port(address)
    except RuntimeError as exc:
        raise RuntimeError(f"the OIP gRPC server cannot bind {address} (OIP__GRPC_PORT): {exc}") from exc
    if port == 0:
        raise RuntimeError(f"the OIP gRPC server cannot bind {address} (OIP__GRPC_PORT)")
    await server.start()
    logger.info("OIP gRPC server (%s) listening on %s", SERVICE, address)
    try:
        yield port
    finally:
        await server.stop(request_timeout_s)
