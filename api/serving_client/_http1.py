"""A lean asyncio HTTP/1.1 keep-alive client for the calls to serving's REST replicas.

Why not httpx on this path: under 32 concurrent requests a worker spent ~4.1 ms of CPU
per request, ~70% of it in httpx/httpcore (every request scans the whole pool and polls
each idle socket through anyio to see whether it expired). This client does only what
the serving client needs, on `asyncio.Protocol` and httptools (llhttp, uvicorn's parser):

- plain `http://` origins only (serving is on loopback or the cluster network), or
  `unix:/path` for serving's REST API on a Unix-domain socket of the same host (run-server.sh's
  one-container mode: no TCP stack between the tiers, measured below); no TLS, proxies,
  redirects, cookies, compression or HEAD (a HEAD answer would be misread);
- one exchange per connection at a time (no pipelining); responses delimited by
  Content-Length, chunked encoding, or the server closing the connection; a server's
  `Connection: close` (or HTTP/1.0 without keep-alive) is honoured;
- `ConnectionPool`: one per origin, at most `max_connections` connections. Idle ones
  are kept LIFO (the most recently used is reused first, so a burst's extra connections
  go cold and expire) and not reused once idle for `keepalive_expiry_s`, judged from a
  timestamp when a request looks for one (the expired ones at the bottom are closed
  then), never by polling sockets; a connection the server closes while idle is noticed
  by `connection_lost` and leaves the pool at once. A request that finds none free
  waits, first come first served, bounded by its `timeout`.
- Cancellation safety: a request cancelled or timed out mid-exchange closes its
  connection (it may still carry the late answer), never returns it to the pool.

Failures are `Http1Error` subclasses; `Http1Error.stale` marks the one case the caller
may simply repeat on a fresh connection (see there). `api.serving_client._rest` turns
them into `ServingError`s; nothing else leaves this module.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Protocol
from urllib.parse import urlsplit

import httptools

# --- errors ----------------------------------------------------------------------------


class Http1Error(Exception):
    """A request to serving failed below HTTP: no usable answer arrived.

    Attributes:
        stale: True when the request went out on a kept-alive connection that had
            already served an exchange, and that connection failed before any byte of
            the answer arrived. That is what serving closing an idle connection just as
            the request was sent looks like; the request may be repeated once on a
            fresh connection (`ConnectionPool.request(..., fresh=True)`).
    """

    def __init__(self, message: str, *, stale: bool = False) -> None:
        super().__init__(message)
        self.stale = stale


class ConnectError(Http1Error):
    """The TCP connection could not be opened: refused, unreachable, name not resolved."""


class ConnectTimeout(Http1Error):
    """The TCP connection was not established within the connect timeout."""


class PoolTimeout(Http1Error):
    """Every connection stayed busy until the request's wait timeout ran out."""


class PoolClosed(Http1Error):
    """The pool was closed (the worker is shutting down)."""


class ServerDisconnected(Http1Error):
    """The server closed the connection before the answer was complete."""


class ReadError(Http1Error):
    """The connection failed (e.g. reset) while waiting for or reading the answer."""


class WriteError(Http1Error):
    """The connection failed (broken pipe) while sending the request."""


class RemoteProtocolError(Http1Error):
    """The server's bytes are not a valid HTTP/1.1 response."""


class ResponseTooLarge(Http1Error):
    """The response's body is over the request's `max_response_bytes` (announced by its
    Content-Length, or counted as it arrived): the exchange is abandoned at once and the
    connection dropped, so a faulty replica cannot make a worker hold an unbounded body."""


# --- messages ----------------------------------------------------------------------------


class Response:
    """One HTTP response, fully read.

    Attributes:
        status: the status code, e.g. 200.
        reason: the reason phrase, e.g. "OK" (may be empty).
        headers: header names lower-cased -> value; a repeated header's values are
            joined with ", ".
        body: the whole body (empty when there is none).
    """

    __slots__ = ("body", "headers", "reason", "status")

    def __init__(self, status: int, reason: str, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.reason = reason
        self.headers = headers
        self.body = body

    def __repr__(self) -> str:
        return f"Response({self.status}, {len(self.body)} bytes)"


class Request:
    """What `MockClient` hands its handler: the request as it would have been sent.

    Attributes:
        method, url (origin + path), path: as given.
        headers: lower-cased names -> value, including host, content-type and
            content-length as the real pool sends them.
        body: the body bytes (empty when there is none).
    """

    __slots__ = ("body", "headers", "method", "path", "url")

    def __init__(self, method: str, url: str, path: str, headers: dict[str, str], body: bytes) -> None:
        self.method = method
        self.url = url
        self.path = path
        self.headers = headers
        self.body = body


# Characters that would let a path or header value inject lines into the request.
_UNSAFE_LINE = re.compile(r"[\r\n\0]")
_UNSAFE_TARGET = re.compile(r"[\s\0]")
# Statuses that never carry a body (RFC 9112, 6.3); for all others a response with
# neither Content-Length nor Transfer-Encoding runs until the server closes.
_NO_BODY_STATUSES = frozenset({204, 304})
# Bodies at least this large are written apart from the head instead of being copied
# into one buffer with it.
_SEPARATE_WRITE_BYTES = 64 * 1024


#: The Host header sent over a Unix-domain socket (RFC 9112 needs one; serving ignores it).
UNIX_HOST = "localhost"


def unix_socket_path(origin: str) -> str | None:
    """The socket path of a "unix:/path" origin, None for any other origin."""
    if not origin.startswith("unix:"):
        return None
    path = origin.removeprefix("unix:")
    if not path:
        raise ValueError(f"a unix: origin needs a socket path, not {origin!r}")
    return path


def _origin_parts(origin: str) -> tuple[str, str, int]:
    """(normalised origin, host, port) of "http://host[:port]" (of "unix:/path": the origin
    as given, the Host header to send and port 0); ValueError otherwise."""
    if unix_socket_path(origin) is not None:
        return origin, UNIX_HOST, 0
    parts = urlsplit(origin)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"only http://host[:port] origins are supported, not {origin!r}")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise ValueError(f"an origin has no path, query or user: {origin!r}")
    port = parts.port or 80
    host = parts.hostname
    netloc = f"[{host}]" if ":" in host else host
    if port != 80:
        netloc = f"{netloc}:{port}"
    return f"http://{netloc}", host, port


def _head(
    method: str,
    path: str,
    host: str,
    headers: Mapping[str, str] | None,
    body: bytes | None,
    content_type: str | None,
) -> bytes:
    """The request line and headers, encoded; ValueError for an unsafe method, path or header."""
    if _UNSAFE_TARGET.search(method) or _UNSAFE_TARGET.search(path) or not path.startswith("/"):
        raise ValueError(f"invalid method or path: {method!r} {path!r}")
    lines = [method, " ", path, " HTTP/1.1\r\nhost: ", host, "\r\n"]
    if headers:
        for name, value in headers.items():
            if _UNSAFE_LINE.search(name) or _UNSAFE_LINE.search(value):
                raise ValueError(f"header {name!r} contains a line break or NUL")
            lines += (name, ": ", value, "\r\n")
    if body is not None:
        if content_type is not None:
            lines += ("content-type: ", content_type, "\r\n")
        lines += ("content-length: ", str(len(body)), "\r\n")
    lines.append("\r\n")
    return "".join(lines).encode("latin-1")


# --- one connection ----------------------------------------------------------------------


class _Connection(asyncio.Protocol):
    """One TCP connection to the origin and the response parser on it.

    The pool drives it: `exchange` sends one request and returns the future of its
    `Response`; the parser's callbacks fill that in as bytes arrive, and
    `connection_lost` fails it. Not reusable unless `reusable()` after the exchange.
    """

    __slots__ = (
        "_body", "_body_bytes", "_got_bytes", "_headers", "_headers_done", "_keep_alive",
        "_max_body", "_parser", "_pool", "_reason", "_reused", "_status", "_transport",
        "_until_close", "_waiter", "closed", "idle", "idle_since", "served",
    )  # fmt: skip

    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[Response] | None = None
        self._reused = False
        self._got_bytes = False
        self._status = 0
        self._reason = b""
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._body_bytes = 0
        self._max_body: int | None = None  # of the exchange in progress
        self._headers_done = False
        self._until_close = False
        self._keep_alive = True
        self.closed = False
        self.idle = False  # in the pool's idle stack
        self.idle_since = 0.0  # time.monotonic() when it last went idle
        self.served = 0  # exchanges completed on it

    # -- driven by the pool

    def exchange(self, head: bytes, body: bytes | None, max_body: int | None = None) -> asyncio.Future[Response]:
        """Send one request; the future of its response (whose body may be `max_body` bytes
        at most, else it fails with `ResponseTooLarge`).

        Raises:
            ServerDisconnected: the connection is already closing (stale if reused).
        """
        transport = self._transport
        reused = self.served > 0
        if self.closed or transport is None or transport.is_closing():
            # asyncio drops writes to a closing transport silently: fail here instead.
            raise ServerDisconnected("server closed the connection before the request was sent", stale=reused)
        waiter = asyncio.get_running_loop().create_future()
        self._waiter = waiter
        self._reused = reused
        self._got_bytes = False
        self._max_body = max_body
        if body is None or not body:
            transport.write(head)
        elif len(body) < _SEPARATE_WRITE_BYTES:
            transport.write(head + body)
        else:
            transport.write(head)
            transport.write(body)
        return waiter

    def reusable(self) -> bool:
        """True when the last exchange completed and both sides keep the connection."""
        return self._keep_alive and not self.closed and self._waiter is None

    def close(self) -> None:
        """Close gracefully (the buffered request bytes, if any, are still sent)."""
        if self._transport is not None:
            self._transport.close()

    def abort(self) -> None:
        """Close at once, dropping whatever is buffered: the exchange on it is abandoned."""
        self._waiter = None
        self._keep_alive = False
        if self._transport is not None:
            self._transport.abort()

    # -- asyncio.Protocol

    # asyncio's Protocol takes any BaseTransport; a connection made by create_connection is
    # a stream's (uvloop's does not subclass asyncio.Transport, so an isinstance check cannot say so).
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        if self._waiter is None:
            # Bytes nobody asked for (a second response, junk): the stream can no
            # longer be trusted to line up with our requests.
            self._keep_alive = False
            if self._transport is not None:  # bytes arrive only after connection_made
                self._transport.abort()
            return
        self._got_bytes = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(RemoteProtocolError("serving switched protocols unasked"))
        except httptools.HttpParserError as exc:
            self._fail(RemoteProtocolError(f"invalid HTTP response: {exc}"))

    def eof_received(self) -> bool:
        return False  # close our side too; connection_lost decides what it means

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._keep_alive = False
        waiter = self._waiter
        self._waiter = None
        if waiter is not None and not waiter.done():
            if exc is None and self._until_close and self._headers_done:
                waiter.set_result(self._response())  # a close-delimited body ends here
            else:
                stale = self._reused and not self._got_bytes
                if exc is None:
                    when = "before the response was complete" if self._got_bytes else "without sending a response"
                    error: Http1Error = ServerDisconnected(f"server disconnected {when}", stale=stale)
                elif isinstance(exc, BrokenPipeError):
                    error = WriteError(str(exc) or type(exc).__name__, stale=stale)
                else:
                    error = ReadError(str(exc) or type(exc).__name__, stale=stale)
                waiter.set_exception(error)
        if self.idle:
            self._pool._idle_lost(self)
        self._pool._forget(self)

    # -- httptools callbacks (names fixed by httptools)

    def on_message_begin(self) -> None:
        if self._waiter is None:
            self._keep_alive = False  # a second response after ours: see data_received

    def on_status(self, reason: bytes) -> None:
        self._reason += reason  # llhttp may hand the phrase over in pieces

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        previous = self._headers.get(key)
        self._headers[key] = text if previous is None else f"{previous}, {text}"

    def on_headers_complete(self) -> None:
        self._status = status = self._parser.get_status_code()
        self._headers_done = True
        headers = self._headers
        self._until_close = (
            status >= 200
            and status not in _NO_BODY_STATUSES
            and "content-length" not in headers
            and "transfer-encoding" not in headers
        )
        limit = self._max_body
        announced = headers.get("content-length", "")
        if limit is not None and announced.isdigit() and int(announced) > limit:
            self._too_large(f"{announced} bytes announced")

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        limit = self._max_body
        if limit is not None and self._body_bytes > limit:
            self._too_large(f"over {self._body_bytes} bytes so far")
            return
        self._body.append(body)

    def _too_large(self, what: str) -> None:
        self._body = []
        self._fail(ResponseTooLarge(f"serving's response is larger than {self._max_body} bytes ({what})"))

    def on_message_complete(self) -> None:
        if self._status < 200:
            self._reset()  # an interim 1xx answer: the real one follows
            return
        self._keep_alive = self._parser.should_keep_alive()
        waiter = self._waiter
        self._waiter = None
        response = self._response()
        if waiter is not None and not waiter.done():
            waiter.set_result(response)

    # -- helpers

    def _response(self) -> Response:
        body = self._body
        response = Response(
            self._status,
            self._reason.decode("latin-1"),
            self._headers,
            body[0] if len(body) == 1 else b"".join(body),
        )
        self._reset()
        return response

    def _reset(self) -> None:
        self._status = 0
        self._reason = b""
        self._headers = {}
        self._body = []
        self._body_bytes = 0
        self._headers_done = False
        self._until_close = False

    def _fail(self, error: Http1Error) -> None:
        waiter = self._waiter
        self.abort()
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)


# --- the pool ----------------------------------------------------------------------------


class Pool(Protocol):
    """What `RestTransport` needs of a pool: `ConnectionPool`, or `MockClient`'s."""

    async def request(
        self,
        method: str,
        path: str,
        *,
        headers: Mapping[str, str] | None = None,
        body: bytes | None = None,
        content_type: str | None = None,
        timeout: float,
        connect_timeout: float,
        fresh: bool = False,
        max_response_bytes: int | None = None,
    ) -> Response: ...

    async def aclose(self) -> None: ...


class ConnectionPool:
    """Kept-alive HTTP/1.1 connections to one origin (see the module doc).

    Args:
        origin: "http://host[:port]", or "unix:/path" (serving's REST socket on this host).
        max_connections: connections open at most, busy and idle together (>= 1).
        keepalive_expiry_s: an idle connection is closed once idle this long, seconds;
            keep it below the server's own idle timeout so the pool seldom picks a
            connection the server is closing.

    Raises:
        ValueError: not an http:// origin, or max_connections < 1.
    """

    def __init__(self, origin: str, *, max_connections: int, keepalive_expiry_s: float) -> None:
        if max_connections < 1:
            raise ValueError("max_connections must be >= 1")
        self.origin, self._host, self._port = _origin_parts(origin)
        self._unix_path = unix_socket_path(self.origin)
        self._host_header = self._host if self._unix_path else self.origin.removeprefix("http://")
        self._max = max_connections
        self._expiry_s = keepalive_expiry_s
        # Idle connections, oldest on the left: reuse pops on the right (LIFO), expiry
        # trims on the left, so neither scans the rest.
        self._idle: deque[_Connection] = deque()
        self._busy = 0  # connections (or slots being connected) held by requests
        self._waiters: deque[asyncio.Future[_Connection | None]] = deque()
        self._open: set[_Connection] = set()  # every open connection, for aclose
        self._closed = False

    def __repr__(self) -> str:
        return f"ConnectionPool({self.origin!r}, busy={self._busy}, idle={len(self._idle)})"

    @property
    def connections(self) -> int:
        """Connections open or being opened now, busy and idle."""
        return self._busy + len(self._idle)

    @property
    def idle_connections(self) -> int:
        """Idle connections kept now."""
        return len(self._idle)

    async def request(
        self,
        method: str,
        path: str,
        *,
        headers: Mapping[str, str] | None = None,
        body: bytes | None = None,
        content_type: str | None = None,
        timeout: float,
        connect_timeout: float,
        fresh: bool = False,
        max_response_bytes: int | None = None,
    ) -> Response:
        """Send one request and read its whole response.

        Args:
            method: "GET", "POST", ... (not HEAD).
            path: origin-form target, e.g. "/v1/models/fraud:predict".
            headers: extra headers, sent as given (after host).
            body: the body; content-length (and content-type, when given) are added.
            timeout: seconds to wait for a free connection when all are busy. The
                exchange itself is bounded by the caller (`asyncio.timeout`), which
                cancels cleanly.
            connect_timeout: seconds a new TCP connection may take.
            fresh: do not reuse an idle connection (the retry of a `stale` failure).
            max_response_bytes: the response's body at most, bytes; None: no bound.

        Returns:
            the response, whatever its status.

        Raises:
            ConnectError, ConnectTimeout: no connection could be opened.
            PoolTimeout: every connection stayed busy for `timeout`.
            ServerDisconnected, ReadError, WriteError, RemoteProtocolError: the
                exchange failed; the connection is closed (see `Http1Error.stale`).
            ResponseTooLarge: the body is over `max_response_bytes`; the connection is dropped.
            PoolClosed: after `aclose`.
            ValueError: a path or header that would break the request's framing.
        """
        head = _head(method, path, self._host_header, headers, body, content_type)
        conn = None if fresh else self._take_idle()
        if conn is None:
            conn = await self._acquire(timeout, connect_timeout, fresh)
        try:
            response = await conn.exchange(head, body, max_response_bytes)
        except BaseException:
            # Failed, cancelled or timed out mid-exchange: a late answer may still be
            # on its way on this connection, so it is never handed out again.
            self._discard(conn)
            raise
        conn.served += 1
        self._release(conn)
        return response

    async def aclose(self) -> None:
        """Close every connection; requests still running fail, later ones raise PoolClosed."""
        self._closed = True
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_exception(PoolClosed("connection pool closed"))
        self._waiters.clear()
        for conn in list(self._open):
            conn.close()
        self._idle.clear()

    # -- acquiring and releasing

    def _take_idle(self) -> _Connection | None:
        """The most recently used idle connection that has not expired, marked busy."""
        idle = self._idle
        if not idle:
            return None
        stale_before = time.monotonic() - self._expiry_s
        while idle and idle[0].idle_since <= stale_before:
            old = idle.popleft()
            old.idle = False
            old.close()
        if not idle:
            return None
        conn = idle.pop()
        conn.idle = False
        self._busy += 1
        return conn

    async def _acquire(self, timeout: float, connect_timeout: float, fresh: bool) -> _Connection:
        """A connection for one exchange: an idle one, a new one, or the next one freed."""
        if self._closed:
            raise PoolClosed("connection pool closed")
        if fresh and self._idle and self._busy + len(self._idle) >= self._max:
            old = self._idle.popleft()  # make room for the fresh one: drop the oldest
            old.idle = False
            old.close()
        if self._busy + len(self._idle) < self._max:
            self._busy += 1
            return await self._connect(min(connect_timeout, timeout))
        # All taken: wait in line. A releaser hands over its connection, or None when
        # it closed its connection, passing on the slot to open a new one.
        waiter: asyncio.Future[_Connection | None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        started = time.monotonic()
        try:
            async with asyncio.timeout(timeout):
                granted = await waiter
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self._pass_on(waiter.result())  # granted just as we gave up
            else:
                waiter.cancel()
                try:
                    self._waiters.remove(waiter)
                except ValueError:
                    pass
            if isinstance(exc, TimeoutError):
                raise PoolTimeout(f"no free connection to {self.origin} within {timeout:.3f} s") from None
            raise
        if granted is not None and not fresh:
            return granted
        if granted is not None:
            granted.abort()  # a fresh one was asked for; keep the slot
        left = timeout - (time.monotonic() - started)
        return await self._connect(max(0.0, min(connect_timeout, left)))

    async def _connect(self, connect_timeout: float) -> _Connection:
        """Open a connection for a slot already counted in `_busy` (freed on failure)."""
        conn = _Connection(self)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(connect_timeout):
                if self._unix_path is not None:
                    await loop.create_unix_connection(lambda: conn, self._unix_path)
                else:
                    await loop.create_connection(lambda: conn, self._host, self._port)
        except BaseException as exc:
            conn.abort()  # connected just as the timeout or a cancel struck
            self._free_slot()
            if isinstance(exc, TimeoutError):
                raise ConnectTimeout(f"connect to {self.origin} took over {connect_timeout:.3f} s") from None
            if isinstance(exc, OSError):
                raise ConnectError(f"connect to {self.origin}: {exc}") from exc
            raise
        if self._closed:
            conn.abort()
            self._free_slot()
            raise PoolClosed("connection pool closed")
        self._open.add(conn)
        return conn

    def _release(self, conn: _Connection) -> None:
        """After a complete exchange: hand `conn` to the next waiter, keep it idle, or close it."""
        if not conn.reusable() or self._closed:
            conn.close()
            self._free_slot()
            return
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)  # the slot goes with it
                return
        self._busy -= 1
        conn.idle = True
        conn.idle_since = time.monotonic()
        self._idle.append(conn)

    def _discard(self, conn: _Connection) -> None:
        conn.abort()
        self._free_slot()

    def _pass_on(self, granted: _Connection | None) -> None:
        """Give a grant that arrived too late to the next in line (or back to the pool)."""
        if granted is None:
            self._free_slot()
        else:
            self._release(granted)

    def _free_slot(self) -> None:
        """A busy slot ends: the next waiter may open a connection with it."""
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._busy -= 1

    # -- called by connections

    def _idle_lost(self, conn: _Connection) -> None:
        """An idle connection was closed (by the server, or by expiry): drop it."""
        conn.idle = False
        try:
            self._idle.remove(conn)
        except ValueError:
            pass

    def _forget(self, conn: _Connection) -> None:
        self._open.discard(conn)


# --- the per-worker client -----------------------------------------------------------------


class Http1Client:
    """The worker's HTTP/1.1 connections to serving: one `ConnectionPool` per origin.

    Each replica gets a pool of its own, created on first use, so replicas never wait
    on each other's connections and a replica's pool is found once (by `RestTransport`
    at construction), not looked up per request.

    Args:
        max_connections: per origin (>= 1).
        keepalive_expiry_s: idle expiry, seconds (see `ConnectionPool`).
    """

    def __init__(self, *, max_connections: int, keepalive_expiry_s: float) -> None:
        self._max_connections = max_connections
        self._keepalive_expiry_s = keepalive_expiry_s
        self._pools: dict[str, ConnectionPool] = {}

    def pool(self, origin: str) -> Pool:
        """The pool for "http://host[:port]" or "unix:/path" (the same one for the same origin).

        Raises:
            ValueError: not an http:// or unix: origin.
        """
        key, _, _ = _origin_parts(origin)
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = ConnectionPool(
                key, max_connections=self._max_connections, keepalive_expiry_s=self._keepalive_expiry_s
            )
        return pool

    async def aclose(self) -> None:
        """Close every pool's connections."""
        for pool in self._pools.values():
            await pool.aclose()

    async def close_pool(self, origin: str) -> None:
        """Close and forget the pool for `origin` (a replica that left).

        A later `pool(origin)` makes a new one, so an address that comes back (a new
        replica on a reused IP) starts afresh.
        """
        key, _, _ = _origin_parts(origin)
        pool = self._pools.pop(key, None)
        if pool is not None:
            await pool.aclose()


class MockClient(Http1Client):
    """An `Http1Client` whose requests go to `handler` instead of a socket (for tests).

    Args:
        handler: called with each `Request`; returns the `Response` or raises an
            `Http1Error` to simulate a transport failure.
    """

    def __init__(self, handler: Callable[[Request], Response]) -> None:
        super().__init__(max_connections=1, keepalive_expiry_s=1.0)
        self._handler = handler

    def pool(self, origin: str) -> Pool:
        """A pool that calls the handler (`origin` checked as the real one does)."""
        key, _, _ = _origin_parts(origin)
        return _MockPool(key, self._handler)


class _MockPool:
    def __init__(self, origin: str, handler: Callable[[Request], Response]) -> None:
        self.origin = origin
        self._handler = handler

    async def request(
        self,
        method: str,
        path: str,
        *,
        headers: Mapping[str, str] | None = None,
        body: bytes | None = None,
        content_type: str | None = None,
        timeout: float,
        connect_timeout: float,
        fresh: bool = False,
        max_response_bytes: int | None = None,
    ) -> Response:
        head = _head(method, path, self.origin.removeprefix("http://"), headers, body, content_type)
        lines = head.decode("latin-1").split("\r\n")[1:-2]
        sent = {name.lower(): value for name, _, value in (line.partition(": ") for line in lines)}
        response = self._handler(Request(method, self.origin + path, path, sent, body or b""))
        if max_response_bytes is not None and len(response.body) > max_response_bytes:
            raise ResponseTooLarge(f"serving's response is larger than {max_response_bytes} bytes")
        return response

    async def aclose(self) -> None:
        pass
