"""uvicorn's httptools HTTP/1.1 protocol with the limits a public endpoint needs.

uvicorn's protocol bounds nothing before a request reaches the app: no head size or time,
no time for a connection that never sends, and an answer sent before the request's body was
read is followed by a close that resets the client's connection (or, kept alive, by reading
the body without bound). `HardenedHttpProtocol` is
`uvicorn.protocols.http.httptools_impl.HttpToolsProtocol` (what uvicorn runs by default)
plus, per connection (`HttpLimits` has the numbers):

- **Head size.** A request target over `max_target_bytes` is answered 414; more than
  `max_header_fields` fields, a field over `max_header_field_size` or a head over
  `max_header_bytes` 431, before the app sees anything. The bytes of a head are counted
  before they reach the parser, which is fed no more of a head than the limit: a huge
  header costs at most one read past it. (A head that begins in the read that completes a
  pipelined request is counted from the next read.)
- **Head time.** A request's head must be complete `header_timeout_s` after its first byte,
  else 408 (slowloris). A connection without a request in progress closes after uvicorn's
  keep-alive timeout, including one that never sends a byte (uvicorn arms that timer only
  after a first response).
- **Answers sent before the body was read** (the refusals here, and the app's, e.g. 413):
  the connection stops parsing, sends its FIN after the answer and reads and discards what
  the client still sends, for at most `linger_s` and `linger_max_bytes`, then closes
  ("lingering close", as Apache, nginx and Go's net/http do). Closing at once, with the body
  unread in the socket, makes the kernel reset the connection, and a client that sends its
  whole body before reading (urllib, http.client) gets "connection reset" or "broken pipe"
  instead of the answer; keeping it open as uvicorn does with keep-alive clients reads an
  unbounded body.
- **Graceful shutdown** (`shutdown`, which uvicorn calls on every connection once it stops
  accepting). uvicorn closes every connection without a request in progress at once; a
  request its client sent just before or after, unread or still on the wire, then meets a
  closed connection and is reset, unanswered. With `shutdown_drain_s` such a connection
  stays open that long: every request that starts after shutdown began is answered with
  `Connection: close`, and a connection still idle when the window ends is closed then
  (unless bytes are waiting, `FIONREAD`). Go's net/http `Shutdown` and nginx's graceful
  shutdown close idle keep-alive connections at once, leaving the race to the client;
  Envoy drains: while draining it answers HTTP/1.1 requests with `Connection: close`, and
  for HTTP/2 keeps accepting streams for `drain_timeout` after its first GOAWAY. With
  `shutdown_body_timeout_s`, a request still receiving its body that long after shutdown
  began is answered 503 and closed (its app sees the client disconnect), so a client
  trickling a body cannot hold the shutdown; requests that have their body finish.

- **Host** (`require_host`): an HTTP/1.1 request without exactly one `Host` field is
  answered 400 (RFC 9112, section 3.2).
- **Admission from the accept queue on** (`admission`, `http_hardening.admission`): each
  request's arrival is read from the kernel when its head begins (`TCP_INFO`: when its bytes
  reached the host, so its time in the accept queue counts) and passed to the app in the
  scope (`ARRIVAL_EXTENSION`, its deadline runs from there); once its head is complete, a
  request that waited longer than controlled-delay admission allows is answered 503 at once,
  before the app sees it (the paths in `exempt_paths`, the probes, never are); so is one the
  tier is at capacity for (`at_capacity`, the API's in-flight limit). A refused request whose
  announced body is at most `AdmissionLimits.keep_alive_body_bytes` is answered once that body
  is read (discarded) and its connection stays open; a larger or chunked one is answered at
  once, unread, with `Connection: close` and a lingering close.
- **Unread answers** (Envoy's per-connection buffer limit): while a connection's answers wait
  to be written above the transport's high-water mark (its client reads nothing), no further
  pipelined request is started nor read; past `max_pending_write_bytes` waiting, or writes
  paused for `write_stall_s`, the connection is closed without an answer, dropping what it
  held. One more than `max_pipelined` requests queued stops the parsing: the requests already
  parsed are answered, the last with `Connection: close`, then the connection closes. Logged
  once per reason at INFO (`connection_dropped` counts each).

A refusal is answered in the tier's error shape (`error_answer`, which each tier's subclass
writes and where it counts the refusal) with `Connection: close`. A subclass may also track
its connections (`admit_connection`, `connection_idle`, `connection_busy`,
`connection_lingering`, `connection_gone`; `close_now` closes one), as the API's per-worker
connection cap does.

**uvicorn internals.** This module is the one place either tier relies on uvicorn's
internals; they were read from uvicorn 0.54.0 (`uvicorn/protocols/http/httptools_impl.py`,
`uvicorn/server.py`), the range `pyproject.toml` pins, and `.ci/run` runs the hardening
tests (`pytest -m http_hardening`) against uvicorn's newest release to catch a change:

- `HttpToolsProtocol`'s constructor arguments `(config, server_state, app_state, _loop)`,
  and `STATUS_LINE` (status code -> `b"HTTP/1.1 <code> <phrase>\\r\\n"`);
- the methods overridden here and when uvicorn calls them: `connection_made`,
  `connection_lost`, `data_received` (replaced: `_feed` repeats its body, including the 400
  for a malformed request and the WebSocket upgrade: `send_400_response`, `_should_upgrade`,
  `handle_websocket_upgrade`, `_unsupported_upgrade_warning`), `pause_writing` and
  `resume_writing` (the transport's flow control; uvicorn's `flow.write_paused`,
  `flow.pause_reading`), the httptools callbacks
  `on_message_begin`, `on_url`, `on_header`, `on_headers_complete`, `on_message_complete`,
  `on_response_complete` (the cycle's `on_response`), and `shutdown` (called by
  `Server.shutdown` on each of `server_state.connections`, which it then waits to empty);
- the attributes `parser` (`feed_data`, `get_http_version`), `url` and `headers` (the head
  parsed so far, names lower-cased, reset by `on_message_begin`), `scope` (made by
  `on_message_begin`, completed by `on_headers_complete`; an `extensions` entry is added),
  `cycle` (the last request parsed, a `RequestResponseCycle`:
  `more_body`, `disconnected`, `response_started`, `response_complete`, `keep_alive`,
  `message_event`, and `transport`, which is swapped for `_CycleTransport`: the cycle calls
  its `write`, `is_closing`, `close` and `get_extra_info`), `pipeline` (the requests parsed
  while an earlier one is answered), `flow` (`resume_reading`), `transport`, `loop`,
  `logger`, `timeout_keep_alive`, `timeout_keep_alive_task`, `timeout_keep_alive_handler`,
  `_unset_keepalive_if_required`, and `server_state.default_headers` and
  `server_state.total_requests`;
- behaviour: the cycle closes its transport after a response when `keep_alive` is False (a
  `connection: close` response header sets it); a cycle marked `disconnected` drops what the
  app sends and makes `receive()` return `http.disconnect` once `message_event` is set;
  `eof_received` returns None, so the transport closes itself at the client's FIN.
"""

from __future__ import annotations

import array
import asyncio
import fcntl
import logging
import socket
import termios
import time
import weakref
from collections.abc import Callable
from typing import Any

import httptools
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from http_hardening.admission import ARRIVAL_EXTENSION, AdmissionLimits, ControlledDelay, arrival
from http_hardening.limits import ErrorAnswer, HttpLimits, Refusal

__all__ = ["HardenedHttpProtocol", "unread_bytes"]

#: While a pipelined request receives its body at shutdown and the one before it is still
#: answered, how often the shutdown's body timeout looks again, seconds.
_PIPELINED_RECHECK_S = 0.1
_TCP_FAMILIES = (socket.AF_INET, socket.AF_INET6)

# Connections closed because their client did not read: logged at INFO, once per server
# and reason (a client that cannot be written to is its own problem, not the server's).
_logger = logging.getLogger("http_hardening")
_admissions: weakref.WeakKeyDictionary[ServerState, ControlledDelay] = weakref.WeakKeyDictionary()
_logged: weakref.WeakKeyDictionary[ServerState, set[str]] = weakref.WeakKeyDictionary()


def admission_for(server_state: ServerState, limits: AdmissionLimits) -> ControlledDelay:
    """The admission of the server that owns `server_state` (one per worker process), made
    on its first request."""
    found = _admissions.get(server_state)
    if found is None:
        found = _admissions[server_state] = ControlledDelay(limits)
    return found


class _Drop(Exception):
    """Raised from a parser callback to close the connection without an answer."""


class _PipelineFull(Exception):
    """Raised from a parser callback: one more pipelined request than `max_pipelined`."""


class _Refused(Exception):
    """Raised from a parser callback to stop parsing and answer `refusal`."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal)
        self.refusal = refusal


class _CycleTransport:
    """The transport a request's response cycle writes to: the connection's, except that
    closing it after an early answer lingers (see module doc)."""

    __slots__ = ("close", "get_extra_info", "is_closing", "write")

    def __init__(
        self, transport: asyncio.Transport, close: Callable[[], None], write: Callable[[bytes], None]
    ) -> None:
        self.write = write
        self.is_closing = transport.is_closing
        self.get_extra_info = transport.get_extra_info
        self.close = close


def unread_bytes(transport: asyncio.BaseTransport) -> int:
    """Bytes the kernel holds for this TCP connection that nobody has read yet (FIONREAD);
    0 when the transport has no socket or the ioctl fails."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return 0
    count = array.array("i", [0])
    try:
        fcntl.ioctl(sock.fileno(), termios.FIONREAD, count)
    except (OSError, ValueError):
        return 0
    return count[0]


class HardenedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with head limits and timeouts, idle and lingering close
    and a bounded graceful shutdown (module doc).

    A tier subclasses it to write its refusals' answers (`error_answer`, required) and,
    optionally, to track its connections. uvicorn builds one per connection from a factory:
    `uvicorn.Config(http=functools.partial(Subclass, limits=...))`.

    Args:
        config, server_state, app_state, _loop: as uvicorn passes them.
        limits: this connection's limits.
    """

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        limits: HttpLimits,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.http_limits = limits
        self._in_head = True  # no request head complete since the last message ended
        self._head_bytes = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._linger_timer: asyncio.TimerHandle | None = None
        self._drain_timer: asyncio.TimerHandle | None = None
        self._shutdown_timer: asyncio.TimerHandle | None = None
        self._lingering = False
        self._discarded = 0
        self._linger_budget = limits.linger_max_bytes
        self._shutting_down = False
        self._cycle_transport: _CycleTransport | None = None
        self._sock: Any = None  # the TCP socket, for its arrival times (None: not TCP)
        self._arrival = 0.0
        self._declared = 0  # the body the request being parsed announced, bytes
        # The refusal of the request being parsed, answered once its (small) body is in.
        self._shedding: Refusal | None = None
        self._head_begun = False  # a head's first bytes were parsed, its end not yet
        self._pipeline_capped = False  # over max_pipelined: the parsed ones answered, then closed
        self._write_timer: asyncio.TimerHandle | None = None
        self._completion_held = False  # a response completed while writes were paused
        # A response's status line and headers, held for its first body write (see _write).
        self._head: bytes | None = None
        self._head_cycle: object = None  # the cycle whose head was written or is held
        self._head_flush: asyncio.Handle | None = None
        admission = limits.admission
        self._admission = admission_for(server_state, admission) if admission is not None else None

    # --- what a tier provides ---------------------------------------------------------------

    def error_answer(self, refusal: Refusal) -> ErrorAnswer:
        """The answer to `refusal` in the tier's error shape; count the refusal here.

        Called once per refusal, also when the answer cannot be sent (the connection is
        closing, or an earlier pipelined response is still being written).
        """
        raise NotImplementedError

    def shed_answer(self, refusal: Refusal, *, keep_alive: bool) -> bytes:
        """The whole response (status line to body) to a request refused for load
        (`Refusal.OVERLOADED`, `Refusal.AT_CAPACITY`) whose small body was read; count the
        refusal here, as `error_answer` does.

        Under overload most requests take this path, and each one's CPU comes out of what
        the server has left for the requests it admits, so a tier may answer from a
        pre-built response (the API does: `api.http_server.shed_answers`). The default
        builds it from `error_answer`.
        """
        return self._answer_bytes(refusal, self.error_answer(refusal), keep_alive=keep_alive)

    def admit_connection(self) -> bool:
        """A new connection: False closes it at once (the default admits every one)."""
        return True

    def connection_idle(self) -> None:
        """No request in progress (a response completed, or a new head began)."""

    def connection_busy(self) -> None:
        """A request's head is complete: the app has it until its response completes."""

    def connection_lingering(self) -> None:
        """Answered and closing (lingering close)."""

    def connection_gone(self) -> None:
        """The connection is closed (called once, from `connection_lost`)."""

    def request_waited(self, sojourn_s: float, admitted: bool) -> None:
        """A request head is complete, `sojourn_s` seconds after its bytes reached the host;
        admission let it in or not (called only with `HttpLimits.admission`)."""

    def at_capacity(self) -> bool:
        """True to refuse the request whose head is complete (`self.url`, `self.headers`)
        with 503 `Refusal.AT_CAPACITY`, before its body is read or the app sees it (the
        default refuses none). Called for every request that admission let in."""
        return False

    def connection_dropped(self, reason: str) -> None:
        """The connection is being closed without an answer: `unread_answers` (answers
        over `max_pending_write_bytes`), `write_stalled` (writes paused over
        `write_stall_s`) or, once the requests parsed up to it are answered,
        `pipelined_too_deep` (over `max_pipelined`)."""

    def close_now(self) -> None:
        """Close the connection at once, without an answer (e.g. to make room for another)."""
        self._cancel_timers()
        self.transport.close()

    # --- connection -------------------------------------------------------------------------

    # asyncio's Protocol takes any BaseTransport; uvicorn's narrows it to a stream's, as here.
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._cycle_transport = _CycleTransport(transport, self._close_after_response, self._write)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in _TCP_FAMILIES:
            self._sock = sock
        if not self.admit_connection():
            transport.close()
            return
        # Idle from the start: a connection that never sends a byte is closed like one
        # that sends nothing after its last response.
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def connection_lost(self, exc: Exception | None) -> None:
        self.connection_gone()
        self._cancel_timers()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        # Answered and closing, or answering what it has parsed past the pipelining limit and
        # then closing: what comes now is not read, only counted against a bound.
        if self._lingering or self._pipeline_capped:
            self._discarded += len(data)
            if self._discarded > self._linger_budget:
                self.transport.close()
            return
        self._unset_keepalive_if_required()
        if self._in_head:
            room = self.http_limits.max_header_bytes - self._head_bytes
            if len(data) > room:
                # Parse no more than the limit allows: the head must end within it.
                if not self._feed(data[:room]):
                    return
                if self._in_head:
                    self._refuse(Refusal.HEAD_TOO_LARGE)
                    return
                data = data[room:]
            else:
                self._head_bytes += len(data)
        self._feed(data)

    def _feed(self, data: bytes) -> bool:
        """Parse `data`, as uvicorn's `data_received` does; False when the connection ends."""
        try:
            self.parser.feed_data(data)
            if self._head_timer is None and (self._head_begun or self._shedding is not None):
                self._arm_head_timer()
        except httptools.HttpParserCallbackError as exc:
            refused = exc.__context__
            if isinstance(refused, _Refused):
                self._refuse(refused.refusal)
                return False
            if isinstance(refused, _Drop):
                self._drop(str(refused))
                return False
            if isinstance(refused, _PipelineFull):
                self._cap_pipeline()
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

    # --- parser callbacks -------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        # When this head's bytes reached the host: for a new connection's first request,
        # before it waited in the accept queue (see http_hardening.admission).
        self._arrival = arrival(self._sock) if self._sock is not None else time.monotonic()
        self.connection_idle()  # sending a head is no request yet
        # Its time limit is armed once this read is parsed (`_arm_head_timer`), and only if the
        # head is still incomplete then: nearly every head arrives in one read, and a timer
        # armed and cancelled per request is CPU that overload takes from admitted requests.
        self._head_begun = True

    def _arm_head_timer(self) -> None:
        """After a read: bound the time of a head still arriving, or of a refused request's
        body still arriving (then the connection closes unanswered), like a head."""
        timeout_s = self.http_limits.header_timeout_s
        if timeout_s is None or self._lingering or self.transport.is_closing():
            return
        if self._shedding is not None:
            self._head_timer = self.loop.call_later(timeout_s, self.close_now)
        else:
            self._head_timer = self.loop.call_later(timeout_s, self._head_timed_out)

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        limit = self.http_limits.max_target_bytes
        if limit is not None and len(self.url) > limit:
            raise _Refused(Refusal.TARGET_TOO_LONG)

    def on_header(self, name: bytes, value: bytes) -> None:
        limits = self.http_limits
        if limits.max_header_fields is not None and len(self.headers) >= limits.max_header_fields:
            raise _Refused(Refusal.TOO_MANY_HEADER_FIELDS)
        if limits.max_header_field_size is not None and len(name) + len(value) + 2 > limits.max_header_field_size:
            raise _Refused(Refusal.HEADER_FIELD_TOO_LARGE)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_begun = False
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        self._check_head()
        if self._shedding is not None:
            # Refused, answered once its (small) body is in: no cycle, no task, nothing for
            # the app. A body that does not come is bounded like a head (`_arm_head_timer`).
            return
        self.connection_busy()
        super().on_headers_complete()
        extensions = self.scope.get("extensions")
        if extensions is None:
            extensions = self.scope["extensions"] = {}
        extensions[ARRIVAL_EXTENSION] = {"monotonic": self._arrival}
        cycle = self.cycle
        if cycle is not None:
            # Duck-typed: the cycle calls only the four methods _CycleTransport binds.
            cycle.transport = self._cycle_transport  # type: ignore[assignment]
            if self._shutting_down:
                cycle.keep_alive = False

    def _check_head(self) -> None:
        """Refuse a complete head now, before the app sees it: the Host rule, the pipeline's
        depth, admission (raised to stop the parser)."""
        limits = self.http_limits
        hosts = 0
        declared = 0
        for name, value in self.headers:
            if name == b"host":
                hosts += 1
            elif name == b"content-length" and value.isdigit():
                declared = int(value)
        self._declared = declared
        if limits.require_host and hosts != 1 and self.parser.get_http_version() == "1.1":
            raise _Refused(Refusal.MISSING_HOST)
        if len(self.pipeline) >= limits.max_pipelined:
            raise _PipelineFull
        admission = self._admission
        if admission is not None:
            now = time.monotonic()
            sojourn = now - self._arrival
            admitted = admission.admit(sojourn, now)
            if not admitted and admission.limits.exempt_paths:
                path = httptools.parse_url(self.url).path.decode("latin-1")
                admitted = path in admission.limits.exempt_paths
            self.request_waited(sojourn, admitted)
            if not admitted:
                self._shed(Refusal.OVERLOADED, declared, admission.limits.keep_alive_body_bytes)
                return
        if self.at_capacity():
            # Decided here, not in the app: there the refusal waits for its task's turn
            # behind the work of every request already taken (measured: 1.1 MB OIP bodies,
            # 120 at once on one worker, were refused 2.0-3.1 s after they were sent, their
            # bodies read first).
            keep_alive_bytes = admission.limits.keep_alive_body_bytes if admission is not None else 0
            self._shed(Refusal.AT_CAPACITY, declared, keep_alive_bytes)

    def _shed(self, refusal: Refusal, declared: int, keep_alive_bytes: int) -> None:
        """Refuse the request whose head is complete: after its body when it is small (the
        connection kept open), else at once (raised to stop the parser)."""
        if self._may_shed_keeping_alive(declared, keep_alive_bytes):
            self._shedding = refusal
            return
        raise _Refused(refusal)

    def _may_shed_keeping_alive(self, declared: int, max_body: int) -> bool:
        """Whether a refused request may be answered after its body, on a connection kept open.

        A refusal that closes the connection sends its client through connect() and the
        listening socket again for its next request, and under overload most requests are
        refused: each refusal then costs an accept, a new protocol and a close besides the
        answer, and an accept queue of 256 (the API's backlog then) overflowed between the loop's
        turns (`nstat` TcpExtListenOverflows, thousands in a run), so the dropped SYNs come back after the
        kernel's 1 s and 3 s retries: requests the server never sees in time to refuse, which
        fail at the client. Measured (`python -m bench.overload --setups split`, the API and
        serving pinned to one shared CPU, keep-alive clients, three runs): at 3x capacity the
        refusals that closed left goodput at 13-61 % of capacity, most failures client
        timeouts, the 503s' p50 0.6-3.6 s; kept open, 97-101 %, the 503s' p50 23-41 ms. A small body
        is in the same read as its head (or the next), so reading it costs less than a
        reconnect; a large one (over `max_body`, or of unknown length) is refused at once
        and its connection closed lingering, so it is never read before its refusal.
        """
        if declared > max_body or self._shutting_down or self.pipeline:
            return False
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            return False  # an earlier response is still written: no answer may pass it
        return all(name != b"transfer-encoding" for name, _ in self.headers)

    def on_body(self, body: bytes) -> None:
        if self._shedding is not None:
            return  # a refused request's body: discarded
        super().on_body(body)

    def on_message_complete(self) -> None:
        refusal = self._shedding
        if refusal is not None:
            self._shedding = None
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None
            self._in_head = True
            self._head_bytes = 0
            self._answer_shed(refusal, keep_alive=self.parser.should_keep_alive() and not self._shutting_down)
            return
        super().on_message_complete()
        self._in_head = True
        self._head_bytes = 0

    def _answer_shed(self, refusal: Refusal, *, keep_alive: bool) -> None:
        """Answer a request refused for overload whose body has been read; the connection
        stays open for the client's next request when it asked to."""
        answer = self.shed_answer(refusal, keep_alive=keep_alive)
        if self.transport.is_closing():
            return
        self._flush_head()
        self._write_now(answer)
        self.server_state.total_requests += 1
        if not keep_alive:
            self.transport.close()
        elif not self.transport.is_closing():
            self.connection_idle()
            self._unset_keepalive_if_required()
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )

    def on_response_complete(self) -> None:
        self._flush_head()
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
        if self.flow.write_paused and not self.transport.is_closing():
            # Its answers are not being read: start no further pipelined request, and read
            # none, until the writes drain (resume_writing) or stall too long.
            self._completion_held = True
            self.flow.pause_reading()
            return
        self._response_completed()

    def _response_completed(self) -> None:
        super().on_response_complete()
        if not self.pipeline and not self.transport.is_closing():
            self.connection_idle()

    # --- writes: bounded, backpressure ------------------------------------------------------

    def _write(self, data: bytes) -> None:
        """What the response cycle's `transport.write` does: write, then close the
        connection if more than `max_pending_write_bytes` wait (the client does not read).

        Nothing is written once the connection is closing: the server dropped it (a client
        that did not read) while an app still answers one of its requests, and that answer
        has nowhere to go (uvloop raises on a write to a closed transport, which was logged
        as an error with its traceback, one per dropped request: a log a client could fill).
        """
        transport = self.transport
        if transport.is_closing():
            return
        cycle = self.cycle
        if self._head_cycle is not cycle:
            # A response's first write is its status line and headers (uvicorn writes them
            # on http.response.start and the body on the next send): they wait for the body
            # and go out with it in one write, or at the end of this loop iteration if the
            # app sends nothing more before it awaits. Written apart, they cost a second
            # send(2) and woke the reader twice per answer -- the API worker on serving's
            # CPU, which read the head, waited again and was woken for the body.
            self._head_cycle = cycle
            self._head = data
            self._head_flush = self.loop.call_soon(self._flush_head)
            return
        self._write_now(self._take_head() + data)

    def _take_head(self) -> bytes:
        """The held head (b"" when none), no longer held nor scheduled for its own write."""
        head, self._head = self._head, None
        if self._head_flush is not None:
            self._head_flush.cancel()
            self._head_flush = None
        return head or b""

    def _flush_head(self) -> None:
        """Write a held head now (nothing followed it in its loop iteration, or the
        response ends without a body write, e.g. HEAD, or its connection closes)."""
        head = self._take_head()
        if head and not self.transport.is_closing():
            self._write_now(head)

    def _write_now(self, data: bytes) -> None:
        transport = self.transport
        transport.write(data)
        bound = self.http_limits.max_pending_write_bytes
        if bound is not None and transport.get_write_buffer_size() > bound:
            self._drop("unread_answers")

    def pause_writing(self) -> None:
        super().pause_writing()
        stall = self.http_limits.write_stall_s
        if stall is not None and self._write_timer is None:
            self._write_timer = self.loop.call_later(stall, self._write_stalled)

    def resume_writing(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None
        super().resume_writing()
        if self._completion_held and not self.transport.is_closing():
            self._completion_held = False
            self._response_completed()

    def _write_stalled(self) -> None:
        self._write_timer = None
        if not self.transport.is_closing():
            self._drop("write_stalled")

    def _cap_pipeline(self) -> None:
        """One request more than `max_pipelined` is queued behind the one being answered:
        parse nothing more, answer the requests already parsed (the last with `Connection:
        close`) and close. The requests after them get no answer, which a pipelining client
        must expect of any connection that closes (RFC 9112, section 9.3.2: it retries them);
        dropping the connection at once left even the first unanswered."""
        self._pipeline_capped = True
        self._discarded = 0
        self._linger_budget = self.http_limits.linger_max_bytes
        self.connection_dropped("pipelined_too_deep")
        self._log_once(
            "pipelined_too_deep",
            "closing a client connection once the requests it pipelined up to the limit are answered (%s)",
        )
        last = self.pipeline[0][0] if self.pipeline else self.cycle
        if last is not None and not last.response_complete:
            last.keep_alive = False
        else:
            self.transport.close()

    def _log_once(self, reason: str, message: str) -> None:
        """Log `message` (with `reason`) at INFO once per server and reason; later ones are
        counted (`connection_dropped`), not logged."""
        logged = _logged.setdefault(self.server_state, set())
        if reason not in logged:
            logged.add(reason)
            _logger.info(message + "; later ones are counted, not logged", reason)

    def _drop(self, reason: str) -> None:
        """Close now, without an answer, dropping what waits to be written (its memory)."""
        if self.transport.is_closing():
            return
        self.connection_dropped(reason)
        waiting = self.transport.get_write_buffer_size()
        self._log_once(
            reason, f"closed a client connection without an answer (%s: {waiting} bytes waiting to be written)"
        )
        self._cancel_timers()
        self.transport.abort()

    # --- refusals, lingering close ----------------------------------------------------------

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._in_head and not self._lingering and not self.transport.is_closing():
            self._refuse(Refusal.HEAD_TIMEOUT)

    def _refuse(self, refusal: Refusal) -> None:
        """Answer `refusal` in the tier's error shape, then close lingering."""
        answer = self.error_answer(refusal)
        cycle = self.cycle
        if self.transport.is_closing():
            return
        if refusal is not Refusal.SHUTDOWN and cycle is not None and not cycle.response_complete:
            # A pipelined head went wrong while an earlier response is being written:
            # an answer now would interleave with it.
            self.transport.close()
            return
        self._flush_head()
        self.transport.write(self._answer_bytes(refusal, answer, keep_alive=False))
        if refusal is Refusal.SHUTDOWN and cycle is not None:
            # The request's app has not answered: its receive() returns http.disconnect now
            # and what it sends is dropped; the answer on the wire is this one.
            cycle.disconnected = True
            cycle.message_event.set()
        self._linger_close()

    def _answer_bytes(self, refusal: Refusal, answer: ErrorAnswer, *, keep_alive: bool) -> bytes:
        """The whole response to `refusal`: status line, headers, body."""
        head = [STATUS_LINE[refusal.status]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head += [b"content-type: ", answer.content_type, b"\r\n", b"content-length: %d\r\n" % len(answer.body)]
        for name, value in answer.headers:
            head += [name, b": ", value, b"\r\n"]
        head += [b"\r\n" if keep_alive else b"connection: close\r\n\r\n", answer.body]
        return b"".join(head)

    def _close_after_response(self) -> None:
        """What the response cycle's `transport.close()` does (see `_CycleTransport`)."""
        self._flush_head()
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
        self.connection_lingering()
        self.flow.resume_reading()  # uvicorn pauses reading while a body waits for the app
        if self.transport.can_write_eof():
            self.transport.write_eof()
        # A client that announced its body sends all of it before it reads the answer: it is
        # discarded, up to linger_declared_max_bytes (the bound below is checked per read).
        declared = min(self._declared, self.http_limits.linger_declared_max_bytes)
        self._linger_budget = max(self.http_limits.linger_max_bytes, declared)
        # The client's EOF closes it sooner: uvicorn's `eof_received` returns None, which
        # lets the transport close itself.
        self._linger_timer = self.loop.call_later(self.http_limits.linger_s, self.transport.close)

    # --- graceful shutdown ------------------------------------------------------------------

    def shutdown(self) -> None:
        """Graceful shutdown (uvicorn calls this on every connection once it stops accepting)."""
        self._shutting_down = True
        if self._lingering:
            return
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            if self.http_limits.shutdown_drain_s > 0:
                # Idle: a request may be on its way; it is answered with Connection: close.
                self._drain_timer = self.loop.call_later(self.http_limits.shutdown_drain_s, self._drain_ended)
            else:
                self.transport.close()
            return
        cycle.keep_alive = False
        if self.http_limits.shutdown_body_timeout_s is not None and self._receiving_body():
            self._shutdown_timer = self.loop.call_later(
                self.http_limits.shutdown_body_timeout_s, self._shutdown_body_timed_out
            )

    def _drain_ended(self) -> None:
        """Close the connection if it is still idle when the shutdown's drain window ends."""
        self._drain_timer = None
        cycle = self.cycle
        idle = (cycle is None or cycle.response_complete) and self._in_head and self._head_timer is None
        if idle and not self._lingering and unread_bytes(self.transport) == 0:
            self.transport.close()
        # else: a request is arriving or being answered, with Connection: close.

    def _receiving_body(self) -> bool:
        """The last request parsed on this connection is still receiving its body, unanswered."""
        cycle = self.cycle
        return (
            cycle is not None and cycle.more_body and not cycle.response_started and not self.transport.is_closing()
        )

    def _shutdown_body_timed_out(self) -> None:
        self._shutdown_timer = None
        if self._lingering or not self._receiving_body():
            return
        if self.pipeline:  # that body is a pipelined request's: one before it is still answered
            self._shutdown_timer = self.loop.call_later(_PIPELINED_RECHECK_S, self._shutdown_body_timed_out)
            return
        self._refuse(Refusal.SHUTDOWN)

    def _cancel_timers(self) -> None:
        timers = (
            self._head_timer,
            self._linger_timer,
            self._drain_timer,
            self._shutdown_timer,
            self._write_timer,
            self.timeout_keep_alive_task,
        )
        for timer in timers:
            if timer is not None:
                timer.cancel()
        self._head_timer = self._linger_timer = self._drain_timer = self._shutdown_timer = None
        self._write_timer = None
        self.timeout_keep_alive_task = None
