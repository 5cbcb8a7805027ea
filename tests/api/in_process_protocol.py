"""`ApiHttpProtocol` in process, without a socket: uvicorn's own `Config` and `ServerState`
and a transport that records what is written, so a test can feed bytes and read every byte
of the answers, and see the protocol's state between reads.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from uvicorn.config import Config
from uvicorn.server import ServerState

from api.http_server.limits import ConnectionLimits
from api.http_server.protocol import ApiHttpProtocol


class RecordingTransport(asyncio.Transport):
    """What the protocol writes, kept; no socket (so a request's arrival is 'now')."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closing = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def get_write_buffer_size(self) -> int:
        return 0

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def never_called(scope: Any, receive: Any, send: Any) -> None:
    """An app for connections whose requests must all be refused before it."""
    raise AssertionError("a refused request reached the app")


@contextmanager
def connection(
    app: Any, loop: asyncio.AbstractEventLoop | None = None, state: ServerState | None = None
) -> Iterator[tuple[ApiHttpProtocol, RecordingTransport]]:
    """One `ApiHttpProtocol` connection to `app` (the API's default limits), on `loop` (a new
    one, closed afterwards, when None) and `state` (one server's: shared by connections)."""
    own_loop = loop is None
    loop = asyncio.new_event_loop() if loop is None else loop
    config = Config(app)
    config.load()
    if state is None:
        state = ServerState()
        state.default_headers = [(b"date", b"Wed, 02 Dec 2026 17:00:00 GMT"), (b"server", b"uvicorn")]
    conn = ApiHttpProtocol(config=config, server_state=state, app_state={}, _loop=loop, limits=ConnectionLimits())
    transport = RecordingTransport()
    conn.connection_made(transport)
    try:
        yield conn, transport
    finally:
        conn.connection_lost(None)  # what the loop calls once a transport has closed
        if own_loop:
            loop.close()
