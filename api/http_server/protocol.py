"""uvicorn's httptools HTTP/1.1 protocol with the limits a public endpoint needs.

`ApiHttpProtocol` is `uvicorn.protocols.http.httptools_impl.HttpToolsProtocol` (what
uvicorn runs by default) plus, per connection (`ConnectionLimits` has the numbers):

- **Head size.** A request line longer than `max_request_line` is answered 414, more than
  `max_header_fields` fields, a field over `max_header_field_size` or a head over
  `max_header_bytes` 431, before the app sees anything. The bytes of a head are counted
  before they reach the parser, so a huge header costs at most one read past the limit.
- **Head time.** A request's head must be complete `header_timeout_s` after its first byte,
  else 408 (slowloris); a connection with no request in progress closes after uvicorn's
  keep-alive timeout, including one that never sends a byte (uvicorn arms that timer only
  after a first response).
- **Open connections.** At most `max_connections` per worker (`connections`): the one
  without a request for the longest is closed to make room, else the new one.
- **Answers sent before the body was read** (413, and the refusals above): the connection
  then stops parsing, sends its FIN after the answer and reads and discards what the client
  still sends, for at most `linger_s` and `linger_max_bytes`, then closes ("lingering
  close", as Apache, nginx and Go's net/http do). Closing at once, with the body unread in
  the socket, makes the kernel reset the connection, and a client that sends its whole body
  before reading (urllib, http.client) gets "connection reset" or "broken pipe" instead of
  the 413; keeping it open as uvicorn does with keep-alive clients reads an unbounded body.
- **Graceful shutdown.** uvicorn closes every connection without a request in progress at
  once; a request the client sent on a kept-alive connection just before or after, unread
  or still on the wire, then meets a closed connection and is reset, unanswered (measured
  under load: requests sent up to ~50 ms after SIGTERM). Here such a connection stays open
  for a drain window (`shutdown_drain_s`, 1 s): every request that starts after shutdown
  began is answered with `Connection: close`, and a connection still idle when the window
  ends is closed then (unless bytes are waiting, `FIONREAD`). Go's net/http `Shutdown` and
  nginx's graceful shutdown (`ngx_close_idle_connections`) close idle keep-alive
  connections at once, leaving this race to the client (golang/go#23829); Envoy drains
  instead: while draining it answers HTTP/1.1 requests with `Connection: close`, and for
  HTTP/2 it keeps accepting streams for `drain_timeout` after its first GOAWAY, "a grace
  period for new streams that race with the final GOAWAY frame". The window here is that
  grace period for HTTP/1.1.

Refusals are answered in the API's error shape (`api.request.errors`) with a fresh request id.
"""

from __future__ import annotations

import array
import asyncio
import fcntl
import termios
from collections.abc import Callable
from typing import Any, Final

import httptools
import orjson
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from api.http_server.connections import registry_for
from api.http_server.limits import ConnectionLimits
from api.request.context import new_request_id

_DEFAULT_LIMITS: Final = ConnectionLimits()


class _Refused(Exception):
    """Raised from a parser callback to stop parsing and answer (status, code, detail)."""

    def __init__(self, status: int, code: str, detail: str, reason: str) -> None:
        super().__init__(status, code, detail, reason)
        self.status, self.code, self.detail, self.reason = status, code, detail, reason


class _CycleTransport:
    """The transport a request's response cycle writes to: the connection's, except that
    closing it after an early answer lingers (see module doc)."""

    __slots__ = ("close", "get_extra_info", "is_closing", "write")

    def __init__(self, transport: asyncio.Transport, close: Callable[[], None]) -> None:
        self.write = transport.write
        self.is_closing = transport.is_closing
        self.get_extra_info = transport.get_extra_info
        self.close = close


def unread_bytes(transport: asyncio.BaseTransport) -> int:
    """Bytes the kernel holds for this TCP connection that nobody has read yet (FIONREAD)."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return 0
    count = array.array("i", [0])
    try:
        fcntl.ioctl(sock.fileno(), termios.FIONREAD, count)
    except (OSError, ValueError):
        return 0
    return count[0]


class ApiHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with head limits, timeouts, a connection cap and
    lingering close (module doc).

    Args:
        config, server_state, app_state, _loop: as uvicorn passes them.
        limits: this worker's limits; give them with `functools.partial` (as
            `api.http_server.worker.ApiUvicornWorker` does).
    """

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        limits: ConnectionLimits = _DEFAULT_LIMITS,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.limits = limits
        self.registry = registry_for(server_state, limits.max_connections)
        self._in_head = True  # no request head complete since the last message ended
        self._head_bytes = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._linger_timer: asyncio.TimerHandle | None = None
        self._drain_timer: asyncio.TimerHandle | None = None
        self._lingering = False
        self._discarded = 0
        self._shutting_down = False
        self._cycle_transport: _CycleTransport | None = None

    # --- connection -------------------------------------------------------------------

    # asyncio's Protocol takes any BaseTransport; uvicorn's narrows it to a stream's, as here.
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._cycle_transport = _CycleTransport(transport, self._close_after_response)
        if not self.registry.admit(self):
            transport.close()
            return
        # Idle from the start: a connection that never sends a byte is closed like one
        # that sends nothing after its last response.
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def connection_lost(self, exc: Exception | None) -> None:
        self.registry.gone(self)
        self._cancel_timers()
        super().connection_lost(exc)

    def close_connection(self, reason: str) -> None:
        """Close now (the registry needs room); counted under `reason`."""
        self.registry.closed(reason)
        self._cancel_timers()
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            self._discarded += len(data)
            if self._discarded > self.limits.linger_max_bytes:
                self.transport.close()
            return
        self._unset_keepalive_if_required()
        if self._in_head:
            room = self.limits.max_header_bytes - self._head_bytes
            if len(data) > room:
                # Parse no more than the limit allows: the head must end within it.
                if not self._feed(data[:room]):
                    return
                if self._in_head:
                    self._refuse(
                        431,
                        "request_header_fields_too_large",
                        f"the request head is larger than {self.limits.max_header_bytes} bytes",
                        "header_too_large",
                    )
                    return
                data = data[room:]
            else:
                self._head_bytes += len(data)
        self._feed(data)

    def _feed(self, data: bytes) -> bool:
        """Parse `data`, as uvicorn's `data_received` does; False when the connection ends."""
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            refused = exc.__context__
            if isinstance(refused, _Refused):
                self._refuse(refused.status, refused.code, refused.detail, refused.reason)
                return False
            self.logger.warning("Invalid HTTP request received.")
            self.send_400_response("Invalid HTTP request received.")
            return False
        except httptools.HttpParserError:
            self.logger.warning("Invalid HTTP request received.")
            self.send_400_response("Invalid HTTP request received.")
            return False
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
        return True

    # --- parser callbacks ---------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.registry.idle(self)  # sending a head is no request yet: still evictable
        self._head_timer = self.loop.call_later(self.limits.header_timeout_s, self._head_timed_out)

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        if len(self.url) > self.limits.max_request_line:
            raise _Refused(
                414,
                "uri_too_long",
                f"the request target is longer than {self.limits.max_request_line} bytes",
                "request_line_too_long",
            )

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(self.headers) >= self.limits.max_header_fields:
            raise _Refused(
                431,
                "request_header_fields_too_large",
                f"more than {self.limits.max_header_fields} header fields",
                "header_too_large",
            )
        if len(name) + len(value) + 2 > self.limits.max_header_field_size:
            raise _Refused(
                431,
                "request_header_fields_too_large",
                f"a header field is larger than {self.limits.max_header_field_size} bytes",
                "header_too_large",
            )
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        self.registry.busy(self)
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None:
            # Duck-typed: the cycle calls only the four methods _CycleTransport binds.
            cycle.transport = self._cycle_transport  # type: ignore[assignment]
            if self._shutting_down:
                cycle.keep_alive = False

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head = True
        self._head_bytes = 0

    def on_response_complete(self) -> None:
        if self._lingering:  # closed by the cycle after an early answer (Connection: close)
            self.server_state.total_requests += 1
            return
        cycle = self.cycle
        if not self.pipeline and cycle.more_body and not cycle.disconnected and not self.transport.is_closing():
            # Answered before its body arrived (413, 408): the rest of the body is not
            # parsed as the next request, nor read without bound.
            self.server_state.total_requests += 1
            self._linger_close()
            return
        super().on_response_complete()
        if not self.pipeline and not self.transport.is_closing():
            self.registry.idle(self)

    # --- refusals, lingering close, shutdown ------------------------------------------------

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._in_head and not self._lingering and not self.transport.is_closing():
            self._refuse(
                408,
                "request_timeout",
                f"request head not received within {self.limits.header_timeout_s:g} s",
                "header_timeout",
            )

    def _refuse(self, status: int, code: str, detail: str, reason: str) -> None:
        """Answer `status` in the API's error shape, then close lingering."""
        self.registry.closed(reason)
        if self.cycle is not None and not self.cycle.response_complete:
            # A pipelined head went wrong while an earlier response is being written:
            # an answer now would interleave with it.
            self.transport.close()
            return
        request_id = new_request_id()
        body = orjson.dumps({"detail": detail, "code": code, "request_id": request_id})
        head = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head += [
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"x-request-id: " + request_id.encode("ascii") + b"\r\n",
            b"connection: close\r\n\r\n",
            body,
        ]
        self.transport.write(b"".join(head))
        self._linger_close()

    def _close_after_response(self) -> None:
        """What the response cycle's `transport.close()` does (see `_CycleTransport`)."""
        cycle = self.cycle
        if not self.pipeline and cycle is not None and cycle.more_body and not cycle.disconnected:
            self._linger_close()
        else:
            self.transport.close()

    def _linger_close(self) -> None:
        """Stop parsing, send FIN after what is written, discard what comes (bounded), close."""
        if self._lingering or self.transport.is_closing():
            return
        self._lingering = True
        self._cancel_timers()
        self.registry.lingering(self)
        self.flow.resume_reading()  # uvicorn pauses reading while a body waits for the app
        if self.transport.can_write_eof():
            self.transport.write_eof()
        # The client's EOF closes it sooner: uvicorn's `eof_received` returns None, which
        # lets the transport close itself.
        self._linger_timer = self.loop.call_later(self.limits.linger_s, self.transport.close)

    def shutdown(self) -> None:
        """Graceful shutdown (uvicorn calls this on every connection once it stops accepting)."""
        self._shutting_down = True
        if self._lingering:
            return
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            # Idle: a request may be on its way; it is answered with Connection: close.
            self._drain_timer = self.loop.call_later(self.limits.shutdown_drain_s, self._drain_ended)
            return
        cycle.keep_alive = False

    def _drain_ended(self) -> None:
        """Close the connection if it is still idle when the shutdown's drain window ends."""
        self._drain_timer = None
        cycle = self.cycle
        idle = (cycle is None or cycle.response_complete) and self._in_head and self._head_timer is None
        if idle and not self._lingering and unread_bytes(self.transport) == 0:
            self.transport.close()
        # else: a request is arriving or being answered, with Connection: close.

    def _cancel_timers(self) -> None:
        for timer in (self._head_timer, self._linger_timer, self._drain_timer, self.timeout_keep_alive_task):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._linger_timer = self._drain_timer = self.timeout_keep_alive_task = None
