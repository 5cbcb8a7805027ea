"""The one middleware around every request: its context, its limits, its timing, its error answer.

`RequestMiddleware` is plain ASGI (no `BaseHTTPMiddleware`, which costs a task and a
memory stream per request), installed once, outermost among the app's own middleware
(`api.app.create_app`). For every HTTP request it:

1. takes the caller's `X-Request-ID` when it is 1-128 characters of `[A-Za-z0-9._:-]`,
   else makes one, and makes a fresh `api.request.context.RequestContext` current, with
   the request's one `Deadline`, from the request's arrival at the host when the HTTP server
   says (`http_hardening.admission`: its wait in the accept queue counts against its
   budget; one that waited its whole budget is answered 503 `overloaded` before any work),
   so the route can record stages and read the deadline and
   the serving client can forward the id; tells the loop monitor which route this task
   serves (blocks name it);
2. asks the front door (`api.security.front_door`, when authentication or rate limits are on)
   first: 401, 403 and 429 are answered before any other rule, and the accepted client's
   credential id goes into the context (and the access log);
   then applies the admission limits of `api.request.admission.rules` (503 `overloaded`, 422 for
   a bad `X-Request-Timeout-Ms`, 413 by `Content-Length`), and while the app runs, bounds
   the body's arrival by the deadline (408), counts a streamed body's bytes (413) and checks
   that a multipart body ends with its closing boundary (400);
3. answers an exception that leaves the app (`api.request.errors.response_for`: serving failures
   and the deadline by their table row, anything else 500), so every answer has the
   request id, and counts a serving failure by its canonical code;
4. adds to the response headers `X-Request-ID`, `Server-Timing` (every recorded stage
   and `total`, milliseconds, https://www.w3.org/TR/server-timing/, e.g.
   `validate;dur=0.120, features;dur=0.010, serving;dur=3.200, total;dur=3.500`, then
   `arm;desc=canary` for a model request), `X-Model-Version` when a model answered the
   request and `X-Model-Arm` once its rollout arm was chosen (`api.rollouts`);
5. afterwards records `api_request_duration_seconds`, the stage histograms (with
   `total`), `api_requests_in_flight`, `api_serving_errors_total` and, for a model request,
   `api_rollout_request_duration_seconds` by arm and version, and writes one `api.access` log
   line (with the arm);
6. when tracing is on (`api.observability.tracing`), holds the request's SERVER span, current
   while the app runs, and writes its `trace_id` and `span_id` in the access log line.

One `send` wrapper and one `receive` wrapper per request, whatever the answer. An
exception raised after the response has started cannot be answered any more: it is
re-raised (the server closes the connection) and recorded with the status that was sent.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final

from starlette.responses import Response
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.observability.logging_config import AccessLog
from api.observability.loop_monitor import LoopMonitor, route_of
from api.observability.metrics import UNMATCHED_ROUTE, ApiMetrics
from api.request.admission.in_flight import InFlightBoard, reservation_of
from api.request.admission.rules import BadTimeoutHeader, Limits, MultipartCloseWatch, declared_length
from api.request.context import REQUEST_ID_HEADER, RequestContext, bind, new_request_id, unbind
from api.request.errors import RETRY_AFTER_S, error_response, response_for
from api.security.front_door import FrontDoor, Refusal
from api.serving_client import Deadline, ServingError
from http_hardening.admission import arrival_of

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from api.observability.tracing import Tracing

_REQUEST_ID_HEADER: Final = REQUEST_ID_HEADER.encode("ascii")
# Methods used as a metric label as they are; any other token a client sends is "OTHER",
# so a client cannot grow the label's cardinality.
_KNOWN_METHODS: Final = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_VALID_REQUEST_ID: Final = re.compile(rb"[A-Za-z0-9._:\-]{1,128}")


def request_id_from(scope: Scope) -> str:
    """The caller's `X-Request-ID` if it is acceptable, else a new random one.

    Acceptable: 1-128 characters of letters, digits and `._:-`, so it is safe to echo in
    a header and to write to logs unescaped.
    """
    for name, value in scope["headers"]:
        if name == _REQUEST_ID_HEADER:
            if _VALID_REQUEST_ID.fullmatch(value):
                return str(value.decode("ascii"))
            break
    return new_request_id()


def route_template(scope: Scope) -> str:
    """The path template of the app route `scope` would reach, or `UNMATCHED_ROUTE`.

    For requests answered before routing (413 by the body limit, 503 when overloaded, 422
    for a bad timeout header), so they are counted under their route like the others. Only
    route templates are returned, so a client cannot grow the label's cardinality.
    """
    router = getattr(scope.get("app"), "router", None)
    return _template_in(getattr(router, "routes", ()), scope) or UNMATCHED_ROUTE


def _template_in(routes: Iterable[Any], scope: Scope) -> str | None:
    for route in routes:
        match, _ = route.matches(scope)
        if match is Match.NONE:
            continue
        path = getattr(route, "path", None)
        if isinstance(path, str):
            return path
        # FastAPI (>= 0.16x) wraps each included router; its routes carry the templates.
        nested = getattr(getattr(route, "original_router", route), "routes", None)
        found = _template_in(nested, scope) if nested else None
        if found is not None:
            return found
    return None


def server_timing(stages: dict[str, float], total_s: float, arm: str | None = None) -> str:
    """`Server-Timing` header value: each stage then `total`, durations in milliseconds, then the
    rollout arm (`arm;desc=<arm>`, a metric with a description only) when there is one."""
    parts = [f"{name};dur={seconds * 1000:.3f}" for name, seconds in stages.items()]
    parts.append(f"total;dur={total_s * 1000:.3f}")
    if arm is not None:
        parts.append(f"arm;desc={arm}")
    return ", ".join(parts)


class _BodyCut(Exception):
    """Raised into the app from `receive` when the body is late (408) or too large (413)."""


class RequestMiddleware:
    """ASGI middleware owning each request's context, limits, timing and error answer.

    Args:
        app: the ASGI app to wrap.
        limits: the worker's admission limits.
        in_flight: the requests in flight of every worker (`api.request.admission.in_flight`), against which
            `limits.max_in_flight` (each worker's share) is applied.
        metrics: the app's `ApiMetrics`.
        loop_monitor: told which route each request task serves; None to skip.
        access_log: where the per-request JSON line goes.
        tracing: the request spans' maker; None: tracing is off.
        front_door: authentication and rate limits, asked first; None when both are off.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        limits: Limits,
        in_flight: InFlightBoard,
        metrics: ApiMetrics,
        loop_monitor: LoopMonitor | None,
        access_log: AccessLog,
        tracing: Tracing | None = None,
        front_door: FrontDoor | None = None,
    ) -> None:
        self.app = app
        self.front_door = front_door
        self.limits = limits
        self.in_flight = in_flight
        self._metrics = metrics
        self._monitor = loop_monitor
        self._access_log = access_log
        self._in_flight_gauge = metrics.in_flight
        self._tracing = tracing

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limits = self.limits
        # The request's clock starts when its bytes reached the host, as the HTTP server read
        # it from the kernel (the accept queue counts against the budget), else now.
        started = arrival_of(scope, time.monotonic())
        ctx = RequestContext(request_id_from(scope), started, Deadline(started + limits.request_timeout_s))
        token = bind(ctx)
        task = asyncio.current_task()
        if self._monitor is not None:
            self._monitor.track(task, scope)
        self._in_flight_gauge.inc()
        status = 500
        response_started = False
        cut: tuple[int, str, str] | None = None  # (status, code, detail) replacing the app's answer
        ours = False  # the middleware is answering a cut-off body: its messages go out
        serving_error: str | None = None
        span: Span | None = None
        if self._tracing is not None:
            span = self._tracing.start_asgi_span(scope)
            span_token = self._tracing.activate(span)

        async def send_out(message: Message) -> None:
            nonlocal status, response_started
            if cut is not None and not ours:
                return  # the app's answer to a cut-off body is replaced by ours
            if message["type"] == "http.response.start":
                status = message["status"]
                response_started = True
                # In place, as Starlette's own MutableHeaders(scope=message) does: the
                # message is made for this one send.
                headers = message["headers"] = list(message.get("headers", ()))
                headers.append((_REQUEST_ID_HEADER, ctx.request_id.encode("ascii")))
                if ctx.model_version is not None:
                    headers.append((b"x-model-version", str(ctx.model_version).encode("ascii")))
                if ctx.arm is not None:
                    headers.append((b"x-model-arm", ctx.arm.encode("ascii")))
                timing = server_timing(ctx.stages, time.monotonic() - started, ctx.arm)
                headers.append((b"server-timing", timing.encode("ascii")))
            await send(message)

        # Counted on the board by the HTTP server when it admitted the head (a `Reservation`):
        # then this request is in, and leaves the board when it ends, whatever the path.
        reservation = reservation_of(scope)
        if reservation is not None and not reservation.take():
            reservation = None  # given back before the app ran: counted here, as any other
        reserved = reservation is not None
        try:
            path = scope["path"]
            ctx.path = path  # chooses the error shape (OIP's `error` on /v2: api.request.errors)
            counted = path not in limits.exempt_paths
            limit = limits.body_limit(path)
            declared = declared_length(scope["headers"])
            refusal = self._refusal(scope, ctx, counted, declared, limit, admitted=reserved)
            counted = counted and not reserved  # entered on the board here, and left below
            if refusal is not None:
                await refusal(scope, receive, send_out)
                return
            # The HTTP server delivers exactly Content-Length bytes (uvicorn's httptools and
            # h11 parsers stop there and refuse a header that conflicts with
            # Transfer-Encoding), so only a body without one needs its bytes counted.
            counting = declared is None
            received = 0
            body_done = False
            multipart = MultipartCloseWatch.for_request(scope["headers"])

            async def app_receive() -> Message:
                # uvicorn has no body-read timeout: a client that announces a body and never
                # sends it would hold the request forever. The body's arrival is bounded by
                # the request's deadline; after the body, receives pass through untouched
                # (they wait for a disconnect, which may rightly take long).
                nonlocal cut, received, body_done
                if body_done:
                    return await receive()
                try:
                    async with ctx.deadline.timeout():
                        message = await receive()
                except TimeoutError:
                    cut = (408, "request_timeout", "request body not received within the request deadline")
                    raise _BodyCut from None
                if message["type"] != "http.request":
                    body_done = True
                    return message
                if counting:
                    received += len(message.get("body", b""))
                    if received > limit:
                        cut = (413, "payload_too_large", limits.too_large(path))
                        raise _BodyCut
                body_done = not message.get("more_body", False)
                if multipart is not None:
                    multipart.feed(message.get("body", b""))
                    if body_done and not multipart.seen:
                        cut = (400, "bad_request", "malformed multipart body: it ends without its closing boundary")
                        raise _BodyCut
                return message

            if counted:
                self.in_flight.enter()
            try:
                await self.app(scope, app_receive, send_out)
            except Exception as exc:
                if cut is not None:
                    pass  # the app failed on the body it was refused; answered below
                elif response_started:
                    raise  # half an answer is out: only closing the connection is left
                else:
                    if isinstance(exc, ServingError):
                        serving_error = exc.code.name
                    await response_for(exc)(scope, receive, send_out)
            finally:
                if counted:
                    self.in_flight.leave()
            if cut is not None and not response_started:
                ours = True
                await error_response(*cut)(scope, receive, send_out)
        finally:
            if reservation is not None:
                reservation.finish()
            total = time.monotonic() - started
            self._in_flight_gauge.dec()
            if self._monitor is not None:
                self._monitor.untrack(task)
            unbind(token)
            if span is not None:
                assert self._tracing is not None
                self._tracing.deactivate(span_token)
            self._record(scope, ctx, status, total, serving_error, span)

    def _refusal(
        self,
        scope: Scope,
        ctx: RequestContext,
        counted: bool,
        declared: int | None,
        limit: int,
        *,
        admitted: bool = False,
    ) -> Response | None:
        """The answer to a request refused before the app runs (`api.request.admission.rules`, in its order),
        or None; lowers `ctx.deadline` when the timeout header asks. `admitted`: the HTTP server
        counted it on the in-flight board at its head already (`Reservation`), so that limit
        is not applied again."""
        limits = self.limits
        if self.front_door is not None:
            client = scope.get("client")
            verdict = self.front_door.check(scope["path"], scope["headers"], client[0] if client else None)
            if verdict is not None:
                ctx.credential_id = verdict.credential_id
            if isinstance(verdict, Refusal):
                return error_response(verdict.status, verdict.code, verdict.detail, verdict.headers)
        if counted and not admitted and self.in_flight.full():
            detail = self.in_flight.refusal_detail()
            return error_response(503, "overloaded", detail, {"Retry-After": str(RETRY_AFTER_S)})
        try:
            budget = limits.time_budget(scope["headers"])
        except BadTimeoutHeader as exc:
            return error_response(422, "validation_error", exc.detail)
        if budget != limits.request_timeout_s:
            ctx.deadline = Deadline(ctx.started + budget)
        if counted and ctx.deadline.remaining() <= 0:
            # Stale: it waited its whole budget before it was read. Dropped before any work.
            waited_ms = (time.monotonic() - ctx.started) * 1000
            detail = f"the request waited {waited_ms:.0f} ms before it was read, past its {budget * 1000:g} ms budget"
            return error_response(503, "overloaded", detail, {"Retry-After": str(RETRY_AFTER_S)})
        if declared is not None and declared > limit:
            return error_response(413, "payload_too_large", limits.too_large(scope["path"]))
        return None

    def _record(
        self,
        scope: Scope,
        ctx: RequestContext,
        status: int,
        total: float,
        serving_error: str | None,
        span: Span | None = None,
    ) -> None:
        metrics = self._metrics
        route = route_of(scope) or route_template(scope)
        method = scope["method"]
        label = method if method in _KNOWN_METHODS else "OTHER"
        metrics.child(metrics.request_duration, label, route, str(status)).observe(total)
        for name, seconds in ctx.stages.items():
            metrics.child(metrics.stage_duration, route, name).observe(seconds)
        metrics.child(metrics.stage_duration, route, "total").observe(total)
        if serving_error is not None:
            metrics.child(metrics.serving_errors, serving_error).inc()
        if ctx.arm is not None:
            version = str(ctx.model_version) if ctx.model_version is not None else ""
            arms = metrics.rollouts.request_duration
            metrics.child(arms, route, ctx.arm, ctx.model_name or "", version, str(status)).observe(total)
        trace_fields: dict[str, object] = {}
        if span is not None:
            trace_fields = self._end_span(span, ctx, status, route)
        if self._access_log.enabled:
            client = scope.get("client")
            path = scope["path"]
            self._access_log.write(
                f"{method} {path} {status}",
                {
                    "request_id": ctx.request_id,
                    "method": method,
                    "path": path,
                    "route": route,
                    "status": status,
                    "duration_ms": round(total * 1000, 3),
                    "model_name": ctx.model_name,
                    "model_version": ctx.model_version,
                    "arm": ctx.arm,
                    "client": f"{client[0]}:{client[1]}" if client else None,
                    **trace_fields,
                    "credential": ctx.credential_id,
                },
            )

    def _end_span(self, span: Span, ctx: RequestContext, status: int, route: str) -> dict[str, object]:
        """End the request's SERVER span; its ids for the access log ({} when not recorded)."""
        assert self._tracing is not None
        extra: dict[str, str | int] = {"tfserving.request_id": ctx.request_id}
        if ctx.model_name is not None and ctx.model_version is not None:
            extra["tfserving.model_spec.name"] = ctx.model_name
            extra["tfserving.model_spec.version"] = ctx.model_version
        if ctx.arm is not None:
            extra["tfserving.rollout.arm"] = ctx.arm  # stable, canary or pinned (api.rollouts)
        ids = self._tracing.end_server_span(span, status, route, extra)
        return {"trace_id": ids[0], "span_id": ids[1]} if ids is not None else {}
