"""`api.http_server.ApiHttpProtocol` in a real uvicorn server on loopback, raw sockets as clients.

A small ASGI app stands in for the API so each limit is seen alone: `/` answers at once,
`/echo` reads the whole body, `/early` answers 413 without reading it (as the API's body
limit does), `/hold` waits until released. The server runs in a thread with uvicorn's
default loop (uvloop when installed, as under gunicorn).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
import uvicorn
from gunicorn.config import Config as GunicornConfig

from api.http_server import ApiHttpProtocol, ConnectionLimits
from api.http_server.connections import ConnectionRegistry, registry_for
from tests.http_hardening.wire import (
    call_on_loop,
    closed_by_peer,
    connect,
    get,
    read_response,
    serving_in_thread,
    shut_down_connections,
)
from tests.support import wait_until

pytestmark = pytest.mark.http_hardening  # on uvicorn's internals: .ci/run runs these on its newest release too


@dataclass
class StandInApp:
    loop: asyncio.AbstractEventLoop | None = None
    release: asyncio.Event | None = None
    holding: int = 0
    bodies: list[int] = field(default_factory=list)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                self.loop = asyncio.get_running_loop()
                self.release = asyncio.Event()
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        path = scope["path"]
        status, body = 200, b"ok"
        if path == "/echo":
            size, more = 0, True
            while more:
                message = await receive()
                size += len(message.get("body", b""))
                more = message.get("more_body", False)
            self.bodies.append(size)
            body = str(size).encode()
        elif path == "/early":
            status, body = 413, b'{"code":"payload_too_large"}'
        elif path == "/hold":
            assert self.release is not None
            self.holding += 1
            await self.release.wait()
        headers = [(b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


@dataclass
class Running:
    server: uvicorn.Server
    app: StandInApp
    port: int
    limits: ConnectionLimits

    def registry(self) -> ConnectionRegistry:
        """The server's registry: kept per server, so it outlives every connection (a test
        reads it after the connection it counted has closed)."""
        return registry_for(self.server.server_state, self.limits.max_connections)

    def call(self, fn: Any) -> None:
        """Run `fn()` on the server's loop and wait for it."""
        assert self.app.loop is not None
        call_on_loop(self.app.loop, fn)


def serve(limits: ConnectionLimits, *, keepalive_s: int = 5) -> Iterator[Running]:
    app = StandInApp()
    with serving_in_thread(app, functools.partial(ApiHttpProtocol, limits=limits), keepalive_s=keepalive_s) as (
        server,
        port,
    ):
        try:
            yield Running(server, app, port, limits)
        finally:
            if app.loop is not None and app.release is not None:
                app.loop.call_soon_threadsafe(app.release.set)


@pytest.fixture
def running(request: pytest.FixtureRequest) -> Iterator[Running]:
    marker = request.node.get_closest_marker("limits")
    kwargs = marker.kwargs if marker else {}
    keepalive_s = kwargs.pop("keepalive_s", 5)
    yield from serve(ConnectionLimits(**kwargs), keepalive_s=keepalive_s)


# --- head size ---------------------------------------------------------------------------------


@pytest.mark.limits(max_header_bytes=8192)
def test_a_huge_header_is_431_read_by_the_client_while_it_still_sends(running: Running) -> None:
    head = b"GET / HTTP/1.1\r\nHost: t\r\nX-Big: " + b"a" * (4 << 20) + b"\r\n\r\n"
    with connect(running.port) as s:
        started = time.monotonic()
        s.sendall(head)  # all 4 MB go: the server discards what follows its answer
        status, headers, body = read_response(s)
        elapsed = time.monotonic() - started
        assert closed_by_peer(s)
    assert status == 431, body
    answer = orjson.loads(body)
    assert answer["code"] == "request_header_fields_too_large"
    assert answer["request_id"] == headers["x-request-id"]
    assert headers["connection"] == "close"
    assert elapsed < 2.0
    assert running.registry().metrics.value("header_too_large") == 1
    assert get(running.port) == 200  # the worker is fine


@pytest.mark.limits(max_header_fields=10)
def test_too_many_header_fields_are_431(running: Running) -> None:
    fields = "".join(f"X-F{i}: v\r\n" for i in range(11))
    with connect(running.port) as s:
        s.sendall(f"GET / HTTP/1.1\r\nHost: t\r\n{fields}\r\n".encode())
        status, _, body = read_response(s)
    assert status == 431, body


@pytest.mark.limits(max_header_field_size=100)
def test_a_header_field_over_its_limit_is_431_and_one_under_it_passes(running: Running) -> None:
    with connect(running.port) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: t\r\nX-A: " + b"a" * 90 + b"\r\n\r\n")
        assert read_response(s)[0] == 200
        s.sendall(b"GET / HTTP/1.1\r\nHost: t\r\nX-A: " + b"a" * 100 + b"\r\n\r\n")
        assert read_response(s)[0] == 431


@pytest.mark.limits(max_request_line=64)
def test_a_long_request_target_is_414(running: Running) -> None:
    assert get(running.port, "/" + "a" * 40) == 200
    status = get(running.port, "/" + "a" * 100)
    assert status == 414


# --- head time, idle connections ------------------------------------------------------------------


@pytest.mark.limits(header_timeout_s=0.5)
def test_a_head_sent_a_byte_at_a_time_is_cut_off_with_408(running: Running) -> None:
    with connect(running.port) as s:
        started = time.monotonic()
        answer = b""
        for byte in b"GET / HTTP/1.1\r\nHost: t\r\nX-Slow: " + b"a" * 100:
            try:
                s.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                break
            s.settimeout(0.05)
            try:
                answer += s.recv(4096)
            except TimeoutError:
                continue
            if answer:
                break
        if not answer:  # the server answered while a send was failing: read it now
            s.settimeout(2)
            with contextlib.suppress(OSError):
                answer = s.recv(4096)
        assert answer.startswith(b"HTTP/1.1 408 "), answer
        assert b'"code":"request_timeout"' in answer
        assert 0.4 < time.monotonic() - started < 3.0
    assert running.registry().metrics.value("header_timeout") == 1


@pytest.mark.limits(keepalive_s=1)
def test_a_connection_that_never_sends_is_closed_after_the_keepalive_timeout(running: Running) -> None:
    with connect(running.port) as s:
        started = time.monotonic()
        assert closed_by_peer(s, timeout_s=5)
        assert 0.8 < time.monotonic() - started < 3.0


# --- the connection cap ----------------------------------------------------------------------


@pytest.mark.limits(max_connections=8)
def test_at_the_cap_the_longest_idle_connection_makes_room(running: Running) -> None:
    idle = [connect(running.port) for _ in range(8)]
    try:
        wait_until(lambda: len(running.server.server_state.connections) == 8, 5, "8 connections")
        assert get(running.port) == 200  # one more: the oldest idle one was closed for it
        assert closed_by_peer(idle[0], timeout_s=2)
        assert running.registry().metrics.value("evicted") == 1
        for s in idle[1:]:
            s.setblocking(False)
            with pytest.raises(BlockingIOError):
                s.recv(1)  # still open, nothing sent
    finally:
        for s in idle:
            s.close()


@pytest.mark.limits(max_connections=4)
def test_at_the_cap_with_every_connection_busy_a_new_one_is_closed(running: Running) -> None:
    busy = [connect(running.port) for _ in range(4)]
    try:
        for s in busy:
            s.sendall(b"GET /hold HTTP/1.1\r\nHost: t\r\n\r\n")
        wait_until(lambda: running.app.holding == 4, 5, "4 held requests")
        with connect(running.port) as extra:
            assert closed_by_peer(extra, timeout_s=2)
        assert running.registry().metrics.value("refused_at_limit") == 1
        running.call(running.app.release.set)  # type: ignore[union-attr]
        for s in busy:
            assert read_response(s)[0] == 200
    finally:
        for s in busy:
            s.close()


# --- answers before the body: lingering close ----------------------------------------------------


def test_urllib_reads_an_early_413_on_a_large_body(running: Running) -> None:
    """urllib sends `Connection: close` and its whole body before reading the answer."""
    request = urllib.request.Request(f"http://127.0.0.1:{running.port}/early", data=b"x" * (20 << 20))
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=10)
    assert caught.value.code == 413


@pytest.mark.limits(linger_max_bytes=1 << 20, linger_declared_max_bytes=1 << 20)
def test_a_body_after_an_early_answer_is_discarded_up_to_a_bound_then_the_connection_closes(
    running: Running,
) -> None:
    with connect(running.port) as s:
        s.sendall(b"POST /early HTTP/1.1\r\nHost: t\r\nContent-Length: 104857600\r\n\r\n")
        status, headers, _ = read_response(s)
        assert status == 413
        sent = 0
        with pytest.raises(OSError):  # reset once the server stops discarding
            while sent < 100 << 20:
                sent += s.send(b"x" * 65536)
        assert sent < 50 << 20, sent
    assert get(running.port, "/") == 200


def test_a_kept_alive_connection_still_works_after_a_fully_read_body(running: Running) -> None:
    with connect(running.port) as s:
        for size in (10, 100_000):
            s.sendall(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % size + b"x" * size)
            status, _, body = read_response(s)
            assert (status, body) == (200, str(size).encode())


# --- graceful shutdown ----------------------------------------------------------------------


def test_a_request_unread_when_shutdown_begins_is_answered_with_connection_close(running: Running) -> None:
    with connect(running.port) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        assert read_response(s)[0] == 200  # now idle, kept alive
        assert running.app.loop is not None
        # Hold the loop, send the next request meanwhile (it waits unread in the socket),
        # then begin the shutdown before the loop reads it: what a busy worker sees when
        # SIGTERM lands just as a client reuses its connection.
        sent = threading.Event()
        conns = running.server.server_state.connections

        def busy_then_shutdown() -> None:
            assert sent.wait(5)
            time.sleep(0.1)  # the bytes reach the server's socket
            for conn in list(conns):
                conn.shutdown()

        running.app.loop.call_soon_threadsafe(busy_then_shutdown)
        time.sleep(0.1)
        s.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        sent.set()
        status, headers, _ = read_response(s)
        assert status == 200
        assert headers["connection"] == "close"
        assert closed_by_peer(s)


def begin_shutdown(running: Running) -> float:
    """Do what uvicorn's shutdown does to every open connection; when it did, monotonic."""
    assert running.app.loop is not None
    shut_down_connections(running.server, running.app.loop)
    return time.monotonic()


@pytest.mark.limits(shutdown_drain_s=1.0)
def test_a_request_sent_just_after_shutdown_began_on_an_idle_connection_is_answered_with_close(
    running: Running,
) -> None:
    """The race of a kept-alive connection at SIGTERM: the server finds it idle, the client's
    next request is already on its way. Within the drain window it is answered."""
    with connect(running.port) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        status, headers, _ = read_response(s)
        assert status == 200 and headers.get("connection") != "close"  # kept alive, idle
        begin_shutdown(running)
        time.sleep(0.05)  # the request leaves the client 50 ms later
        s.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        status, headers, _ = read_response(s)
        assert (status, headers["connection"]) == (200, "close")
        assert closed_by_peer(s, timeout_s=2)


@pytest.mark.limits(shutdown_drain_s=0.5)
def test_an_idle_connection_is_closed_when_the_drain_window_ends(running: Running) -> None:
    with connect(running.port) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        assert read_response(s)[0] == 200
        began = time.monotonic()
        begin_shutdown(running)
        assert closed_by_peer(s, timeout_s=3)
        assert 0.4 < time.monotonic() - began < 2.0


def test_the_drain_window_comes_from_the_environment_within_gunicorns_graceful_timeout() -> None:
    cfg = GunicornConfig()
    assert ConnectionLimits.from_gunicorn(cfg, {}).shutdown_drain_s == 1.0
    assert ConnectionLimits.from_gunicorn(cfg, {"API_SHUTDOWN_DRAIN_S": "0.3"}).shutdown_drain_s == 0.3
    cfg.set("graceful_timeout", 1)
    assert ConnectionLimits.from_gunicorn(cfg, {"API_SHUTDOWN_DRAIN_S": "5"}).shutdown_drain_s == 0.5
