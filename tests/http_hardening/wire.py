"""uvicorn serving an ASGI app with a given HTTP protocol in a thread, and raw-socket clients.

For the tests of the HTTP hardening (`http_hardening`, `api.http_server`): each limit is
seen on the wire, byte by byte where it matters. The server runs uvicorn's default loop
(uvloop when installed, as under gunicorn and in the model server).
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

from tests.support import free_port, wait_until


@contextmanager
def serving_in_thread(
    app: Any, http: Callable[..., asyncio.Protocol], *, keepalive_s: int = 5
) -> Iterator[tuple[uvicorn.Server, int]]:
    """uvicorn serving `app` with the protocol factory `http` on a free loopback port, in a
    daemon thread; yields (the server, its port) once it accepts, and stops it afterwards."""
    port = free_port()
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, http=http, log_level="error", timeout_keep_alive=keepalive_s  # type: ignore[arg-type]
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 10, "uvicorn to start")
    try:
        yield server, port
    finally:
        server.should_exit = True
        thread.join(10)


def call_on_loop(loop: asyncio.AbstractEventLoop, fn: Callable[[], object]) -> None:
    """Run `fn()` on the server's loop and wait for it (5 s at most)."""
    done = threading.Event()

    def run() -> None:
        try:
            fn()
        finally:
            done.set()

    loop.call_soon_threadsafe(run)
    assert done.wait(5)


def shut_down_connections(server: uvicorn.Server, loop: asyncio.AbstractEventLoop) -> None:
    """Do what uvicorn's shutdown does to every open connection."""
    call_on_loop(loop, lambda: [conn.shutdown() for conn in list(server.server_state.connections)])


def connect(port: int) -> socket.socket:
    """A TCP connection to 127.0.0.1:`port`, Nagle off, 5 s timeout."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def read_response(s: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response with Content-Length: (status, headers lower-cased, body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed after {data!r}")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = s.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(lines[0].split()[1]), headers, body


def closed_by_peer(s: socket.socket, timeout_s: float = 5.0) -> bool:
    """True when the server closes the connection (EOF or reset) within `timeout_s`."""
    s.settimeout(timeout_s)
    try:
        while True:
            if not s.recv(65536):
                return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def get(port: int, path: str = "/") -> int:
    """GET `path` on a connection of its own; the status."""
    with connect(port) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
        return read_response(s)[0]
