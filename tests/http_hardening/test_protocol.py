"""`http_hardening.protocol.HardenedHttpProtocol` with a minimal tier's subclass, on loopback.

What each tier's own tests do not reach: limits left off (no field limits, no shutdown body
timeout, no drain), the shutdown's body timeout on its own, and that every refusal reaches the
tier's `error_answer` once. The API's limits are in `tests/api/test_http_server.py`, the model
server's in `tests/serving/test_limits.py`.
"""

from __future__ import annotations

import asyncio
import functools
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
import uvicorn

from http_hardening.limits import ErrorAnswer, HttpLimits, Refusal
from http_hardening.protocol import HardenedHttpProtocol
from tests.http_hardening.wire import (
    closed_by_peer,
    connect,
    get,
    read_response,
    serving_in_thread,
    shut_down_connections,
)
from tests.support import wait_until

pytestmark = pytest.mark.http_hardening


class PlainProtocol(HardenedHttpProtocol):
    """A tier's subclass at its smallest: answers `{"refused": <refusal>}`, remembers each,
    and records every write it hands its transport (`writes`)."""

    refused: list[Refusal]
    writes: list[bytes]

    def error_answer(self, refusal: Refusal) -> ErrorAnswer:
        self.refused.append(refusal)
        return ErrorAnswer(orjson.dumps({"refused": refusal.value}), [(b"x-tier", b"plain")])

    def _write_now(self, data: bytes) -> None:
        self.writes.append(data)
        super()._write_now(data)


@dataclass
class App:
    """`/` answers at once; `/echo` reads the whole body and answers its size, noting a
    disconnect met while reading; `/big` answers 1 MiB, counted in `big`; `/late-body` sends
    its head, then its body once `release` is set."""

    loop: asyncio.AbstractEventLoop | None = None
    release: asyncio.Event | None = None
    big: int = 0
    reading: int = 0
    disconnects: int = 0
    sizes: list[int] = field(default_factory=list)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                self.loop = asyncio.get_running_loop()
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b"ok"
        if scope["path"] == "/big":
            self.big += 1
            body = b"x" * (1 << 20)
        if scope["path"] == "/echo":
            self.reading += 1
            size, more = 0, True
            while more:
                message = await receive()
                if message["type"] == "http.disconnect":
                    self.disconnects += 1
                    return
                size += len(message.get("body", b""))
                more = message.get("more_body", False)
            self.sizes.append(size)
            body = str(size).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]})
        if scope["path"] == "/late-body":
            self.release = asyncio.Event()
            await self.release.wait()
        await send({"type": "http.response.body", "body": body})


@dataclass
class Running:
    server: uvicorn.Server
    app: App
    port: int
    refused: list[Refusal]
    writes: list[bytes]

    def shut_down(self) -> None:
        assert self.app.loop is not None
        shut_down_connections(self.server, self.app.loop)


def serve(limits: HttpLimits) -> Iterator[Running]:
    app, refused, writes = App(), [], []
    protocol = type("Protocol", (PlainProtocol,), {"refused": refused, "writes": writes})
    with serving_in_thread(app, functools.partial(protocol, limits=limits)) as (server, port):
        yield Running(server, app, port, refused, writes)


@pytest.fixture
def running(request: pytest.FixtureRequest) -> Iterator[Running]:
    marker = request.node.get_closest_marker("limits")
    yield from serve(HttpLimits(**{"max_header_bytes": 4096, **(marker.kwargs if marker else {})}))


def test_a_huge_head_is_refused_once_in_the_tiers_shape_and_the_connection_closes(running: Running) -> None:
    with connect(running.port) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: t\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n")
        status, headers, body = read_response(s)
        assert closed_by_peer(s)
    assert (status, orjson.loads(body), headers["x-tier"], headers["connection"]) == (
        431,
        {"refused": "head_too_large"},
        "plain",
        "close",
    )
    assert running.refused == [Refusal.HEAD_TOO_LARGE]
    assert get(running.port) == 200


def test_fields_are_bounded_only_by_the_heads_size_unless_limited(running: Running) -> None:
    fields = "".join(f"X-F{i}: v\r\n" for i in range(300))  # 3 KiB: within the head's 4 KiB
    with connect(running.port) as s:
        s.sendall(f"GET / HTTP/1.1\r\nHost: t\r\n{fields}\r\n".encode())
        assert read_response(s)[0] == 200
    assert running.refused == []


@pytest.mark.limits(max_target_bytes=100)
def test_a_target_over_its_limit_is_414(running: Running) -> None:
    assert get(running.port, "/" + "a" * 99) == 200
    assert get(running.port, "/" + "a" * 100) == 414
    assert running.refused == [Refusal.TARGET_TOO_LONG]


def test_without_a_drain_an_idle_connection_closes_as_shutdown_begins(running: Running) -> None:
    with connect(running.port) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        assert read_response(s)[0] == 200
        began = time.monotonic()
        running.shut_down()
        assert closed_by_peer(s, timeout_s=2)
        assert time.monotonic() - began < 0.5


@pytest.mark.limits(shutdown_body_timeout_s=0.3)
def test_a_body_still_arriving_when_the_shutdowns_timeout_ends_is_503(running: Running) -> None:
    with connect(running.port) as s:
        s.sendall(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n" + b"x" * 10)
        wait_until(lambda: running.app.reading == 1, 5, "the app reading the body")
        began = time.monotonic()
        running.shut_down()
        status, headers, body = read_response(s)
        answered_after = time.monotonic() - began
        assert closed_by_peer(s)
    assert (status, orjson.loads(body), headers["connection"]) == (503, {"refused": "shutdown"}, "close")
    assert 0.25 < answered_after < 2.0
    assert running.refused == [Refusal.SHUTDOWN]
    wait_until(lambda: running.app.disconnects == 1, 5, "the app to see the client disconnect")


def test_without_a_shutdown_body_timeout_a_body_still_arriving_is_waited_for(running: Running) -> None:
    with connect(running.port) as s:
        s.sendall(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n" + b"x" * 10)
        wait_until(lambda: running.app.reading == 1, 5, "the app reading the body")
        running.shut_down()
        time.sleep(0.3)
        s.sendall(b"x" * 990)
        status, headers, body = read_response(s)
    assert (status, body, headers["connection"]) == (200, b"1000", "close")
    assert running.refused == []


def assert_head_only(s: socket.socket) -> None:
    """Read a 200's head and nothing more (a body would arrive with it, in the same write)."""
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(65536)
        assert chunk, "closed before the head"
        head += chunk
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and head.endswith(b"\r\n\r\n")


def test_an_answers_head_and_body_go_out_in_one_write(running: Running) -> None:
    with connect(running.port) as s:
        for _ in range(2):  # and again on the kept-alive connection
            s.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            assert read_response(s)[::2] == (200, b"ok")
    assert len(running.writes) == 2
    assert all(w.startswith(b"HTTP/1.1 200 OK\r\n") and w.endswith(b"\r\n\r\nok") for w in running.writes)


def test_a_head_whose_body_comes_later_is_written_without_waiting_for_it(running: Running) -> None:
    with connect(running.port) as s:
        s.sendall(b"GET /late-body HTTP/1.1\r\nHost: t\r\n\r\n")
        assert_head_only(s)
        assert running.app.loop is not None and running.app.release is not None
        running.app.loop.call_soon_threadsafe(running.app.release.set)
        assert s.recv(65536) == b"ok"
        s.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        assert read_response(s)[::2] == (200, b"ok")


def test_a_head_only_answer_is_written_and_its_connection_stays_usable(running: Running) -> None:
    with connect(running.port) as s:
        s.sendall(b"HEAD / HTTP/1.1\r\nHost: t\r\n\r\n")
        assert_head_only(s)
        s.sendall(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        status, headers, body = read_response(s)
        assert (status, body, headers["connection"]) == (200, b"ok", "close")
        assert closed_by_peer(s)
