"""The REST transport's HTTP/1.1 client (`api.serving_client._http1`) against real sockets.

Each test starts a small asyncio HTTP server on 127.0.0.1 (a free port) that answers
the way the case needs (keep-alive, chunked, close-delimited, hanging, malformed) and
counts the TCP connections it sees, so reuse and closing are observed from the server's
side, not inferred from the pool's.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest

from api.serving_client._http1 import (
    ConnectError,
    ConnectionPool,
    Http1Client,
    PoolClosed,
    PoolTimeout,
    RemoteProtocolError,
    ServerDisconnected,
)

pytestmark = pytest.mark.anyio

TIMEOUTS = {"timeout": 5.0, "connect_timeout": 1.0}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Received:
    """One request as the server read it."""

    connection: int  # 1-based number of the connection it came on
    head: bytes
    body: bytes

    @property
    def path(self) -> str:
        return self.head.split(b" ", 2)[1].decode()

    def header(self, name: str) -> str | None:
        for line in self.head.split(b"\r\n")[1:]:
            key, _, value = line.partition(b":")
            if key.strip().lower() == name.encode():
                return value.strip().decode()
        return None


# What the server does with one request: write the answer; return False to stop reading
# on this connection (the handler then closes it).
Respond = Callable[[Received, asyncio.StreamWriter], Awaitable[bool]]


@dataclass
class Server:
    respond: Respond
    connections: int = 0
    closed_by_client: int = 0  # connections where the server read EOF from us
    requests: list[Received] = field(default_factory=list)
    port: int = 0

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    self.closed_by_client += 1
                    return
                request = Received(number, head, b"")
                length = request.header("content-length")
                if length:
                    request.body = await reader.readexactly(int(length))
                self.requests.append(request)
                if not await self.respond(request, writer):
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            self.closed_by_client += 1
        finally:
            writer.close()


@asynccontextmanager
async def serve(respond: Respond) -> AsyncIterator[Server]:
    server = Server(respond)
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    server.port = listener.sockets[0].getsockname()[1]
    async with listener:
        yield server


def ok(body: bytes = b"ok", *extra: bytes) -> bytes:
    headers = b"".join(h + b"\r\n" for h in extra)
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n%s\r\n%s" % (len(body), headers, body)


async def answer_ok(request: Received, writer: asyncio.StreamWriter) -> bool:
    writer.write(ok(request.path.encode()))
    await writer.drain()
    return True


async def settle(condition: Callable[[], bool], seconds: float = 2.0) -> None:
    """Let the loop run until `condition` holds (a socket event both sides must see)."""
    for _ in range(int(seconds / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


def pool_for(server: Server, **kwargs: float) -> ConnectionPool:
    options = {"max_connections": 4, "keepalive_expiry_s": 5.0} | kwargs
    return ConnectionPool(server.origin, **options)  # type: ignore[arg-type]


async def test_sequential_requests_reuse_one_connection() -> None:
    async with serve(answer_ok) as server:
        pool = pool_for(server)
        for i in range(10):
            response = await pool.request("GET", f"/r{i}", headers={"x-request-id": f"id{i}"}, **TIMEOUTS)
            assert (response.status, response.reason, response.body) == (200, "OK", f"/r{i}".encode())
            assert response.headers == {"content-length": str(len(f"/r{i}"))}
        assert server.connections == 1 and pool.connections == pool.idle_connections == 1
        first = server.requests[0]
        assert first.head.startswith(b"GET /r0 HTTP/1.1\r\n")
        assert first.header("host") == f"127.0.0.1:{server.port}" and first.header("x-request-id") == "id0"
        assert first.header("content-length") is None  # no body, no length
        await pool.aclose()
        await settle(lambda: server.closed_by_client == 1)


async def test_a_post_carries_its_body_type_and_length() -> None:
    async with serve(answer_ok) as server:
        pool = pool_for(server)
        await pool.request("POST", "/p", body=b'{"a": 1}', content_type="application/json", **TIMEOUTS)
        [sent] = server.requests
        assert sent.body == b'{"a": 1}' and sent.header("content-length") == "8"
        assert sent.header("content-type") == "application/json"
        await pool.aclose()


async def test_an_idle_connection_the_server_closed_is_dropped_and_the_next_request_works() -> None:
    async def answer_then_close(request: Received, writer: asyncio.StreamWriter) -> bool:
        writer.write(ok())  # keep-alive as far as the headers say, but then closed
        await writer.drain()
        return False

    async with serve(answer_then_close) as server:
        pool = pool_for(server)
        await pool.request("GET", "/", **TIMEOUTS)
        await settle(lambda: pool.idle_connections == 0)  # noticed by connection_lost
        assert pool.connections == 0
        assert (await pool.request("GET", "/", **TIMEOUTS)).body == b"ok"
        assert server.connections == 2
        await pool.aclose()


async def test_a_reused_connection_dying_unanswered_is_stale_and_a_fresh_one_works() -> None:
    async def second_request_dies(request: Received, writer: asyncio.StreamWriter) -> bool:
        if request.connection == 1 and len(server.requests) == 2:
            return False  # closed with the request unanswered
        writer.write(ok())
        await writer.drain()
        return True

    async with serve(second_request_dies) as server:
        pool = pool_for(server)
        await pool.request("GET", "/", **TIMEOUTS)
        with pytest.raises(ServerDisconnected) as caught:
            await pool.request("GET", "/", **TIMEOUTS)
        assert caught.value.stale
        assert (await pool.request("GET", "/", fresh=True, **TIMEOUTS)).body == b"ok"
        assert server.connections == 2 and pool.connections == 1
        await pool.aclose()


async def test_a_new_connection_dying_unanswered_is_not_stale() -> None:
    async def close(request: Received, writer: asyncio.StreamWriter) -> bool:
        return False

    async with serve(close) as server:
        pool = pool_for(server)
        with pytest.raises(ServerDisconnected) as caught:
            await pool.request("GET", "/", **TIMEOUTS)
        assert not caught.value.stale and pool.connections == 0
        await pool.aclose()


async def test_chunked_response() -> None:
    async def chunked(request: Received, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nx-a: 1\r\nX-A: 2\r\n\r\n")
        for piece in (b"hello ", b"chunked ", b"world"):
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
            await asyncio.sleep(0.01)  # the parser sees the body across reads
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True

    async with serve(chunked) as server:
        pool = pool_for(server)
        for _ in range(2):
            response = await pool.request("GET", "/", **TIMEOUTS)
            assert response.body == b"hello chunked world"
            assert response.headers["x-a"] == "1, 2"  # names lower-cased, repeats joined
        assert server.connections == 1  # a chunked answer keeps the connection
        await pool.aclose()


async def test_connection_close_from_the_server_is_honoured() -> None:
    async def close_after(request: Received, writer: asyncio.StreamWriter) -> bool:
        writer.write(ok(b"bye", b"connection: close"))
        await writer.drain()
        await asyncio.sleep(0.2)  # the server does not close first: the client must
        return True

    async with serve(close_after) as server:
        pool = pool_for(server)
        assert (await pool.request("GET", "/", **TIMEOUTS)).body == b"bye"
        assert pool.connections == 0  # not kept
        await settle(lambda: server.closed_by_client == 1)
        assert (await pool.request("GET", "/", **TIMEOUTS)).body == b"bye"
        assert server.connections == 2
        await pool.aclose()


async def test_close_delimited_body() -> None:
    async def until_close(request: Received, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\npart one, ")
        await writer.drain()
        await asyncio.sleep(0.02)
        writer.write(b"part two")
        await writer.drain()
        return False  # the end of the body is the end of the connection

    async with serve(until_close) as server:
        pool = pool_for(server)
        response = await pool.request("GET", "/", **TIMEOUTS)
        assert response.body == b"part one, part two" and response.headers["content-type"] == "text/plain"
        assert pool.connections == 0
        await pool.aclose()


async def test_a_waiter_gets_the_next_freed_connection_in_turn() -> None:
    gates: list[asyncio.Event] = []

    async def held(request: Received, writer: asyncio.StreamWriter) -> bool:
        gate = asyncio.Event()
        gates.append(gate)
        await gate.wait()
        writer.write(ok(request.path.encode()))
        await writer.drain()
        return True

    async with serve(held) as server:
        pool = pool_for(server, max_connections=1)
        first = asyncio.create_task(pool.request("GET", "/1", **TIMEOUTS))
        await settle(lambda: len(gates) == 1)
        second = asyncio.create_task(pool.request("GET", "/2", **TIMEOUTS))
        third = asyncio.create_task(pool.request("GET", "/3", **TIMEOUTS))
        await asyncio.sleep(0.05)
        assert not second.done() and not third.done() and pool.connections == 1
        gates[0].set()
        assert (await first).body == b"/1"
        await settle(lambda: len(gates) == 2)
        assert server.requests[1].path == "/2"  # first come, first served
        gates[1].set()
        await settle(lambda: len(gates) == 3)
        gates[2].set()
        assert [(await second).body, (await third).body] == [b"/2", b"/3"]
        assert server.connections == 1  # handed over, never a second connection
        await pool.aclose()


async def test_the_wait_for_a_connection_is_bounded() -> None:
    gate = asyncio.Event()

    async def held(request: Received, writer: asyncio.StreamWriter) -> bool:
        await gate.wait()
        writer.write(ok())
        await writer.drain()
        return True

    async with serve(held) as server:
        pool = pool_for(server, max_connections=1)
        busy = asyncio.create_task(pool.request("GET", "/", **TIMEOUTS))
        await settle(lambda: len(server.requests) == 1)
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(PoolTimeout):
            await pool.request("GET", "/", timeout=0.1, connect_timeout=1.0)
        assert 0.09 <= loop.time() - started < 1.0
        gate.set()
        assert (await busy).body == b"ok"
        assert (await pool.request("GET", "/", **TIMEOUTS)).body == b"ok"  # the line is empty
        assert server.connections == 1
        await pool.aclose()


async def test_cancelling_mid_request_closes_that_connection_and_the_pool_goes_on() -> None:
    async def first_hangs(request: Received, writer: asyncio.StreamWriter) -> bool:
        if request.connection == 1:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhal")  # and no more
            await writer.drain()
            return True  # reads on, to see our side close
        writer.write(ok())
        await writer.drain()
        return True

    async with serve(first_hangs) as server:
        pool = pool_for(server, max_connections=1)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await pool.request("GET", "/", **TIMEOUTS)
        assert pool.connections == 0  # the slot is free, the connection gone
        await settle(lambda: server.closed_by_client == 1)
        assert (await pool.request("GET", "/", **TIMEOUTS)).body == b"ok"
        assert server.connections == 2
        await pool.aclose()


async def test_a_waiter_cancelled_in_line_leaves_it() -> None:
    gate = asyncio.Event()

    async def held(request: Received, writer: asyncio.StreamWriter) -> bool:
        await gate.wait()
        writer.write(ok())
        await writer.drain()
        return True

    async with serve(held) as server:
        pool = pool_for(server, max_connections=1)
        busy = asyncio.create_task(pool.request("GET", "/", **TIMEOUTS))
        await settle(lambda: len(server.requests) == 1)
        waiting = asyncio.create_task(pool.request("GET", "/", **TIMEOUTS))
        await asyncio.sleep(0.02)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        gate.set()
        await busy
        assert pool.connections == pool.idle_connections == 1  # not handed to the cancelled one
        assert (await pool.request("GET", "/", **TIMEOUTS)).body == b"ok"
        await pool.aclose()


async def test_idle_connections_expire() -> None:
    async with serve(answer_ok) as server:
        pool = pool_for(server, keepalive_expiry_s=0.1)
        await pool.request("GET", "/", **TIMEOUTS)
        await pool.request("GET", "/", **TIMEOUTS)
        assert server.connections == 1
        await asyncio.sleep(0.15)
        await pool.request("GET", "/", **TIMEOUTS)
        assert server.connections == 2 and pool.connections == 1
        await settle(lambda: server.closed_by_client == 1)  # the expired one was closed
        await pool.aclose()


async def test_the_most_recently_used_idle_connection_goes_first() -> None:
    gates = {"/a": asyncio.Event(), "/b": asyncio.Event()}

    async def held(request: Received, writer: asyncio.StreamWriter) -> bool:
        if request.path in gates:
            await gates[request.path].wait()
        writer.write(ok(str(request.connection).encode()))
        await writer.drain()
        return True

    async with serve(held) as server:
        pool = pool_for(server)
        a = asyncio.create_task(pool.request("GET", "/a", **TIMEOUTS))
        b = asyncio.create_task(pool.request("GET", "/b", **TIMEOUTS))
        await settle(lambda: len(server.requests) == 2)
        gates["/a"].set()
        on_a = (await a).body
        gates["/b"].set()
        on_b = (await b).body  # b's connection went idle last
        assert on_a != on_b and pool.idle_connections == 2
        for _ in range(3):
            assert (await pool.request("GET", "/", **TIMEOUTS)).body == on_b
        await pool.aclose()


async def test_a_megabyte_each_way() -> None:
    async def echo(request: Received, writer: asyncio.StreamWriter) -> bool:
        writer.write(ok(request.body[::-1]))
        await writer.drain()
        return True

    payload = bytes(range(256)) * 4096  # 1 MiB
    async with serve(echo) as server:
        pool = pool_for(server)
        for _ in range(2):
            response = await pool.request("POST", "/echo", body=payload, **TIMEOUTS)
            assert response.body == payload[::-1]
        assert server.connections == 1
        await pool.aclose()


async def test_a_malformed_response_is_a_protocol_error_and_the_connection_is_dropped() -> None:
    async def garbage(request: Received, writer: asyncio.StreamWriter) -> bool:
        if request.connection == 1:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: nope\r\n\r\n")
        else:
            writer.write(ok())
        await writer.drain()
        return True

    async with serve(garbage) as server:
        pool = pool_for(server)
        with pytest.raises(RemoteProtocolError) as caught:
            await pool.request("GET", "/", **TIMEOUTS)
        assert not caught.value.stale and pool.connections == 0
        assert (await pool.request("GET", "/", **TIMEOUTS)).body == b"ok"
        assert server.connections == 2
        await pool.aclose()


async def test_an_interim_1xx_answer_is_skipped() -> None:
    async def continue_first(request: Received, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n" + ok(b"final"))
        await writer.drain()
        return True

    async with serve(continue_first) as server:
        pool = pool_for(server)
        response = await pool.request("GET", "/", **TIMEOUTS)
        assert (response.status, response.body) == (200, b"final")
        await pool.aclose()


async def test_refused_connection_and_closed_pool() -> None:
    async with serve(answer_ok) as server:
        port = server.port
    pool = ConnectionPool(f"http://127.0.0.1:{port}", max_connections=1, keepalive_expiry_s=1.0)
    with pytest.raises(ConnectError) as caught:
        await pool.request("GET", "/", **TIMEOUTS)
    assert not caught.value.stale and pool.connections == 0  # the slot came back
    await pool.aclose()
    with pytest.raises(PoolClosed):
        await pool.request("GET", "/", **TIMEOUTS)


async def test_requests_that_would_break_framing_are_refused() -> None:
    pool = ConnectionPool("http://127.0.0.1:9", max_connections=1, keepalive_expiry_s=1.0)
    for bad in ({"path": "/a b"}, {"path": "a"}, {"headers": {"x-a": "1\r\nx-b: 2"}}):
        with pytest.raises(ValueError):
            await pool.request("GET", **({"path": "/"} | bad), **TIMEOUTS)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="only http"):
        ConnectionPool("https://serving:8501", max_connections=1, keepalive_expiry_s=1.0)


def test_one_pool_per_origin() -> None:
    client = Http1Client(max_connections=2, keepalive_expiry_s=1.0)
    assert client.pool("http://serving:8501/") is client.pool("http://serving:8501")
    assert client.pool("http://serving:80") is client.pool("http://serving")
    assert client.pool("http://serving-2:8501") is not client.pool("http://serving:8501")


async def test_a_unix_socket_origin_is_served_over_its_socket(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """run-server.sh's one-container mode: serving's REST API on a Unix-domain socket."""
    server = Server(answer_ok)
    path = str(tmp_path / "rest.sock")
    listener = await asyncio.start_unix_server(server.handle, path)
    async with listener:
        client = Http1Client(max_connections=2, keepalive_expiry_s=5.0)
        pool = client.pool(f"unix:{path}")
        assert client.pool(f"unix:{path}") is pool  # one pool per origin, as for TCP
        for i in range(3):
            response = await pool.request("POST", f"/v1/models/m:predict{i}", body=b"{}",
                                          content_type="application/json", **TIMEOUTS)
            assert (response.status, response.body) == (200, f"/v1/models/m:predict{i}".encode())
        assert server.connections == 1  # kept alive like a TCP connection
        assert server.requests[0].header("host") == "localhost"
        await client.aclose()


async def test_a_missing_unix_socket_is_a_connect_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    pool = ConnectionPool(f"unix:{tmp_path / 'none.sock'}", max_connections=1, keepalive_expiry_s=1.0)
    with pytest.raises(ConnectError):
        await pool.request("GET", "/", **TIMEOUTS)


def test_a_unix_origin_needs_a_path() -> None:
    with pytest.raises(ValueError):
        ConnectionPool("unix:", max_connections=1, keepalive_expiry_s=1.0)
