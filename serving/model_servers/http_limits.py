"""The REST request limits, where each can be checked: the connection and the ASGI request.

TF Serving's HTTP server (libevent's ``evhttp``, ``util/net_http/server/internal/evhttp_server``)
reads any head and any body, as slowly as a client sends them. Ours refuses what is over the
limits of :class:`~serving.util.request_limits.RequestLimits`, answering TF Serving's error body
``{"error": "<message>"}`` with the HTTP status of the limit and closing the connection:

* :class:`HeadLimitedProtocol` -- the connection: uvicorn's httptools protocol, counting the bytes
  of each request head (request line and headers) as they arrive and refusing a head over
  ``--rest_api_max_header_bytes`` (431) or not complete within
  ``--rest_api_body_read_timeout_in_ms`` (408); a complete head is measured again before uvicorn
  reads it (a head that arrived in one read), and a URL over :data:`~serving.util.request_limits.
  MAX_URI_BYTES`, which httptools cannot parse, is 414. The check is made before the parser is fed more
  than one read past the limit, because the parser's cost is what a large head attacks: httptools
  joins the pieces of a header value by ``bytes +=`` once per read, so a 150 MB header costs
  quadratic time. Measured here before this limit: a 150 MB header kept the REST port's event loop
  busy for 24 s (small requests on other connections waited up to 4.1 s); with it, the same
  header is answered 431 after its first reads (see ``tests/serving/test_serving_limits.py``).
  A head that arrives after a pipelined request in the same read is counted from the next read,
  so a head is parsed at most ``limit`` + two reads (uvloop reads up to 256 KiB).
  Once the server shuts down, a request still receiving its body is answered 503 and closed
  after ``--rest_api_shutdown_body_read_timeout_in_ms`` (:meth:`HeadLimitedProtocol.shutdown`).
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
import http
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

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
    read_timed_out,
    shutting_down,
    uri_too_long,
)

__all__ = ["RequestLimitsMiddleware", "HeadLimitedProtocol", "LimitCallback"]

_LINGER_S = 1.0  # how long a refused connection's further bytes are read and dropped

LimitCallback = Callable[[LimitExceeded], None]
"""Told of every request refused for a limit (to count it)."""


class HeadLimitedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a size and a time limit on every request head.

    uvicorn builds one per connection (``uvicorn.Config(http=functools.partial(
    HeadLimitedProtocol, limits=..., on_limit=...))``). The time limit runs from the connection's
    start, or from the first byte of a later request, to the end of the head; idle keep-alive
    connections are uvicorn's (``timeout_keep_alive``).
    """

    def __init__(
        self,
        config: Any,
        server_state: Any,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        limits: RequestLimits,
        on_limit: LimitCallback,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._max_head_bytes = limits.max_header_bytes
        self._head_timeout_s = limits.read_timeout_s
        self._on_limit = on_limit
        self._head_started = False  # some bytes of a request head arrived, not all of them
        self._head_bytes = 0
        self._message_began = False  # a new request head began during the current read
        self._head_timer: asyncio.TimerHandle | None = None
        self._shutdown_timeout_s = limits.shutdown_read_timeout_s
        self._refused = False

    # ---- asyncio.Protocol -------------------------------------------------------------------

    # asyncio's Protocol takes any BaseTransport; uvicorn's narrows it to a stream's, as here.
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()  # the first head must arrive in time too

    def shutdown(self) -> None:
        """uvicorn's graceful shutdown of the connection (called once the server stops accepting),
        bounded for a request still receiving its body: that one is answered 503 and closed
        ``--rest_api_shutdown_body_read_timeout_in_ms`` later unless its body is in by then.
        Without this a client trickling a body kept the server from exiting for up to
        ``--rest_api_body_read_timeout_in_ms`` (forever at 0). Requests that have their body are
        left to finish."""
        super().shutdown()
        if self._receiving_body():
            self.loop.call_later(self._shutdown_timeout_s, self._shutdown_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # a refused connection lingers: what still arrives is dropped
        continued = self._head_started
        self._message_began = False
        super().data_received(data)
        if not self._head_started or self._refused or self.transport.is_closing():
            return
        # A head is still incomplete: all of this read belongs to it, unless it began inside the
        # read (after a pipelined request); those few bytes are counted with the next read.
        if continued and not self._message_began:
            self._head_bytes += len(data)
        if self._head_bytes > self._max_head_bytes:
            self._refuse(head_too_large(self._max_head_bytes))
        elif self._head_timer is None:
            self._arm_head_timer()

    # ---- parser callbacks (httptools) ---------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_started = True
        self._message_began = True
        self._head_bytes = 0

    def on_headers_complete(self) -> None:
        self._head_started = False
        self._cancel_head_timer()
        if self._refused:
            return  # a request pipelined after a refused one: dropped with its connection
        # The whole head is known here, however many reads it took: it is refused before uvicorn
        # parses its URL, which httptools cannot do past 65,535 bytes (uvicorn would answer a
        # plain-text 400, and a head that arrived in one read was only counted from the next).
        if self._head_size() > self._max_head_bytes:
            self._refuse(head_too_large(self._max_head_bytes))
        elif len(self.url) > MAX_URI_BYTES:
            self._refuse(uri_too_long())
        else:
            super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if not self._refused:
            super().on_message_complete()

    def _head_size(self) -> int:
        """The bytes of the parsed head: ``METHOD URL HTTP/1.1``, ``name: value`` lines, blank line."""
        request_line = len(self.parser.get_method()) + len(self.url) + 12  # " ", " HTTP/1.1\r\n"
        return request_line + sum(len(name) + len(value) + 4 for name, value in self.headers) + 2

    # ---- refusing -----------------------------------------------------------------------------

    def _arm_head_timer(self) -> None:
        if self._head_timeout_s is not None:
            self._head_timer = self.loop.call_later(self._head_timeout_s, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        waiting_for_first = self.cycle is None  # no request yet on this connection
        timeout_s = self._head_timeout_s
        if timeout_s is not None and (self._head_started or waiting_for_first) and not self._refused:
            self._refuse(read_timed_out(timeout_s, "head"))

    def _receiving_body(self) -> bool:
        """The request being handled on this connection is still receiving its body."""
        cycle = self.cycle
        return (
            cycle is not None
            and cycle.more_body
            and not cycle.response_started
            and not self.transport.is_closing()
        )

    def _shutdown_timed_out(self) -> None:
        if self._refused or not self._receiving_body():
            return
        if self.pipeline:  # that body is a pipelined request's: one before it is still handled
            self.loop.call_later(0.1, self._shutdown_timed_out)
            return
        self._refuse(shutting_down(self._shutdown_timeout_s), during_request=True)

    def _refuse(self, error: LimitExceeded, *, during_request: bool = False) -> None:
        """Answer ``error`` and close: between requests, or ``during_request`` (the app has not
        answered the current one; it then sees the client disconnect)."""
        self._refused = True
        self._cancel_head_timer()
        self._on_limit(error)
        if self.transport.is_closing():
            return
        if during_request or self.cycle is None or self.cycle.response_complete:
            body = error_json(error.message)
            status = http.HTTPStatus(error.http_status)
            head = [f"HTTP/1.1 {status.value} {status.phrase}\r\n".encode("ascii")]
            head += [name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers]
            head.append(
                b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
                % len(body)
            )
            self.transport.write(b"".join(head) + body)
        if during_request and self.cycle is not None:
            # The app's receive() returns http.disconnect now and what it sends is dropped: the
            # answer on the wire is this one.
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        # A lingering close: stop sending, discard what still arrives for a moment, then close.
        # Closing at once with unread data makes the kernel reset the connection, and a client
        # still sending its head would lose the answer.
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self.loop.call_later(_LINGER_S, self.transport.close)
        else:
            self.transport.close()


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
