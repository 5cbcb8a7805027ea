"""The REST request limits, where each can be checked: the connection and the ASGI request.

TF Serving's HTTP server (libevent's ``evhttp``, ``util/net_http/server/internal/evhttp_server``)
reads any head and any body, as slowly as a client sends them. Ours refuses what is over the
limits of :class:`~serving.util.request_limits.RequestLimits`, answering TF Serving's error body
``{"error": "<message>"}`` with the HTTP status of the limit and closing the connection:

* :class:`HeadLimitedProtocol` -- the connection: the hardening both tiers share
  (:mod:`http_hardening.protocol`, uvicorn's httptools protocol) held to the flags: a request
  head over ``--rest_api_max_header_bytes`` is 431, one not complete within
  ``--rest_api_body_read_timeout_in_ms`` of its first byte 408, a URL over
  :data:`~serving.util.request_limits.MAX_URI_BYTES`, which httptools cannot parse, 414. The bytes
  of a head are counted before the parser is fed them, and it is fed no more than the limit,
  because the parser's cost is what a large head attacks: httptools joins the pieces of a header
  value by ``bytes +=`` once per read, so a 150 MB header costs quadratic time. Measured here
  before this limit: a 150 MB header kept the REST port's event loop busy for 24 s (small requests
  on other connections waited up to 4.1 s); with it, the same header is answered 431 after its
  first reads (see ``tests/serving/test_limits.py``). An answer sent before the body was
  read (these, and the middleware's 413 and 503) is followed by a lingering close, so the client
  reads it rather than a reset. A connection without a request in progress closes after uvicorn's
  keep-alive timeout (5 s), also one that never sends. Once the server shuts down, a request still
  receiving its body is answered 503 and closed after
  ``--rest_api_shutdown_body_read_timeout_in_ms``; idle connections close at once (:func:`http_limits`).
* :class:`RequestLimitsMiddleware` -- the request: ASGI middleware answering 413 at once
  when ``Content-Length`` is over ``--rest_api_max_body_bytes``, and making ``receive()`` raise
  :class:`~serving.util.errors.LimitExceeded` (413, 408) when a body without a length grows past
  the limit or does not arrive in time; the app's one error handler answers those
  (:mod:`serving.model_servers.http_server`). Bodies are never buffered past the limit.
  Large bodies being received hold their bytes in one
  :class:`~serving.util.request_limits.BufferedBodyBudget` (``--rest_api_max_buffered_body_bytes``)
  until they are in: one that does not fit is answered 503 at once (by its ``Content-Length``)
  or as soon as it grows past what is left (chunked).

Each refusal is reported to ``on_limit`` (the server counts it in
``:tensorflow:serving:request_limit_exceeded_count``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from http_hardening.limits import ErrorAnswer, HttpLimits, Refusal
from http_hardening.protocol import HardenedHttpProtocol
from serving.model_servers.http_rest_api_handler import error_json
from serving.util.errors import LimitExceeded
from serving.util.malloc_trim import MallocTrimmer
from serving.util.request_limits import (
    MAX_URI_BYTES,
    UNCOUNTED_BODY_BYTES,
    BufferedBodyBudget,
    RequestLimits,
    body_too_large,
    buffered_bodies_full,
    head_too_large,
    missing_host,
    read_timed_out,
    shutting_down,
    uri_too_long,
)

__all__ = ["HeadLimitedProtocol", "LimitCallback", "RequestLimitsMiddleware", "http_limits"]

LimitCallback = Callable[[LimitExceeded], None]
"""Told of every request refused for a limit (to count it)."""


class HeadLimitedProtocol(HardenedHttpProtocol):
    """uvicorn's httptools protocol with the shared hardening (:mod:`http_hardening.protocol`)
    held to the flags' limits, answering TF Serving's error body (see the module doc).

    uvicorn builds one per connection (``uvicorn.Config(http=functools.partial(
    HeadLimitedProtocol, limits=..., on_limit=...))``). Every refusal is passed to
    ``on_limit`` as the :class:`~serving.util.errors.LimitExceeded` it is answered with.
    """

    def __init__(
        self, *uvicorn_args: Any, limits: RequestLimits, on_limit: LimitCallback, **uvicorn_kwargs: Any
    ) -> None:
        super().__init__(*uvicorn_args, limits=http_limits(limits), **uvicorn_kwargs)
        self._limits = limits
        self._on_limit = on_limit

    def error_answer(self, refusal: Refusal) -> ErrorAnswer:
        """``refusal`` as the limit it exceeds, reported to ``on_limit``, in TF Serving's body."""
        error = self._limit_exceeded(refusal)
        self._on_limit(error)
        return ErrorAnswer(error_json(error.message))

    def _limit_exceeded(self, refusal: Refusal) -> LimitExceeded:
        if refusal is Refusal.TARGET_TOO_LONG:
            return uri_too_long()
        if refusal is Refusal.HEAD_TIMEOUT:
            assert self._limits.read_timeout_s is not None  # no head timer without it
            return read_timed_out(self._limits.read_timeout_s, "head")
        if refusal is Refusal.SHUTDOWN:
            return shutting_down(self._limits.shutdown_read_timeout_s)
        if refusal is Refusal.MISSING_HOST:
            return missing_host()
        return head_too_large(self._limits.max_header_bytes)  # the only field limit here is the head's


def http_limits(limits: RequestLimits) -> HttpLimits:
    """What the REST connection enforces of the flags' limits (:mod:`http_hardening.limits`).

    The URL is held to :data:`~serving.util.request_limits.MAX_URI_BYTES`, which httptools
    cannot parse past (uvicorn would answer a plain-text 400); the head's fields only to the
    head's size, as TF Serving has no limit of its own on them. At shutdown an idle
    connection is closed at once, as uvicorn and TF Serving's evhttp do, rather than drained
    as the API does: this tier's callers are the API's pools, which retry a request that met
    a kept-alive connection closed before any answer (``Http1Error.stale`` in
    ``api/serving_client/_http1.py``), and gRPC; a drain would add its window to every
    shutdown of a server that has idle connections.
    """
    return HttpLimits(
        max_header_bytes=limits.max_header_bytes,
        max_target_bytes=MAX_URI_BYTES,
        header_timeout_s=limits.read_timeout_s,
        shutdown_drain_s=0.0,
        shutdown_body_timeout_s=limits.shutdown_read_timeout_s,
    )


class RequestLimitsMiddleware:
    """ASGI middleware holding each request body to ``--rest_api_max_body_bytes`` and
    ``--rest_api_body_read_timeout_in_ms`` (see the module doc). ``headers`` are added to the
    answers it gives itself (CORS, when on)."""

    def __init__(
        self,
        app: ASGIApp,
        limits: RequestLimits,
        on_limit: LimitCallback,
        headers: dict[str, str] | None = None,
    ) -> None:
        self._app = app
        self._max_body_bytes = limits.max_body_bytes
        self._timeout_s = limits.read_timeout_s
        budget = limits.max_buffered_body_bytes
        self._budget = BufferedBodyBudget(budget) if budget is not None else None
        # Freed bodies stay in the heap: measured on a shared 2-core machine, 300 stalled 1 MiB
        # bodies took RSS from 723 to 1050 MB and it stayed there once they closed, until a
        # malloc_trim(0) brought it back to 727 MB. One trim per 16 MiB of bodies released (at
        # most one a second, on its own thread).
        self._trimmer = MallocTrimmer() if budget is not None else None
        self._on_limit = on_limit
        self._headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
        self._headers += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        if self._max_body_bytes is None and self._timeout_s is None and self._budget is None:
            await self._app(scope, receive, send)
            return
        length = _content_length(scope)
        limit = self._max_body_bytes
        if limit is not None and length is not None and length > limit:
            await self._refuse(body_too_large(limit, length), send)
            return
        body = _LimitedBody(receive, limit, self._timeout_s, self._budget, length)
        if not body.reserve_length():
            assert self._budget is not None
            await self._refuse(buffered_bodies_full(self._budget.limit), send)
            return
        try:
            await self._app(scope, body.receive, send)
        finally:
            body.release()  # the connection dropped, or the app answered without the whole body
            if self._trimmer is not None:
                self._trimmer.released(body.counted)

    async def _refuse(self, error: LimitExceeded, send: Send) -> None:
        self._on_limit(error)
        body = error_json(error.message)
        headers = [*self._headers, (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": error.http_status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


class _LimitedBody:
    """One request's ``receive``, raising :class:`LimitExceeded` past the body's size or time
    limit or when the body does not fit in the :class:`BufferedBodyBudget` (``budget``; bytes
    reserved there are released once the body is in)."""

    def __init__(
        self,
        receive: Receive,
        limit: int | None,
        timeout_s: float | None,
        budget: BufferedBodyBudget | None,
        length: int | None,
    ) -> None:
        self._receive = receive
        self._limit = limit
        self._timeout_s = timeout_s
        self._deadline = asyncio.get_running_loop().time() + timeout_s if timeout_s is not None else None
        self._budget = budget
        self._length = length
        self._received = 0
        self._held = 0  # bytes reserved in the budget
        self.counted = 0
        """The most bytes this body held in the budget."""
        self._complete = False

    def reserve_length(self) -> bool:
        """Reserve a large body's ``Content-Length`` in the budget; ``False`` when it does not fit."""
        if self._budget is None or self._length is None or self._length < UNCOUNTED_BODY_BYTES:
            return True
        if not self._budget.reserve(self._length):
            return False
        self._held = self.counted = self._length
        return True

    def release(self) -> None:
        """Give back what the body holds in the budget (idempotent)."""
        if self._budget is not None and self._held:
            self._budget.release(self._held)
            self._held = 0

    async def receive(self) -> Message:
        if self._complete:  # the body is in: what follows is the disconnect, whenever it comes
            return await self._receive()
        try:
            async with asyncio.timeout_at(self._deadline):
                message = await self._receive()
        except TimeoutError:
            assert self._timeout_s is not None
            raise read_timed_out(self._timeout_s, "body") from None
        if message["type"] == "http.request":
            self._received += len(message.get("body", b""))
            if self._limit is not None and self._received > self._limit:
                raise body_too_large(self._limit)
            self._complete = not message.get("more_body", False)
            if self._complete:
                self.release()
            elif self._length is None:
                self._reserve_received()
        return message

    def _reserve_received(self) -> None:
        """A chunked body's bytes so far, once they are :data:`UNCOUNTED_BODY_BYTES` or more."""
        budget = self._budget
        if budget is None or self._received < UNCOUNTED_BODY_BYTES:
            return
        if not budget.reserve(self._received - self._held):
            raise buffered_bodies_full(budget.limit)
        self._held = self.counted = self._received


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
