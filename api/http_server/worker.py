"""The gunicorn worker class of the API: uvicorn's, running `ApiHttpProtocol`.

    gunicorn -c gunicorn.conf.py 'api.app:create_app()'   # worker_class names this class

It differs from `uvicorn_worker.UvicornWorker` in the HTTP protocol: uvicorn's
httptools protocol with the limits of `ConnectionLimits`, taken from gunicorn's own
settings (`limit_request_line`, `limit_request_fields`, `limit_request_field_size`,
`worker_connections`; `keepalive` is uvicorn's keep-alive timeout already) and from
`API_HEADER_TIMEOUT_S`, `API_MAX_HEADER_BYTES` and `API_SHUTDOWN_DRAIN_S`; and in the listening sockets it hands
uvicorn (`run`).
"""

from __future__ import annotations

import functools
import os
from typing import Any

from uvicorn_worker import UvicornWorker

from api.http_server.limits import ConnectionLimits
from api.http_server.protocol import ApiHttpProtocol


class ApiUvicornWorker(UvicornWorker):  # type: ignore[misc]  # uvicorn-worker ships no types: its class is Any
    """`UvicornWorker` serving each connection with `ApiHttpProtocol`."""

    sockets: list[Any]  # gunicorn's listeners (its socket wrappers), set by the arbiter before run

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.connection_limits = ConnectionLimits.from_gunicorn(self.cfg, os.environ)
        self.config.http = functools.partial(ApiHttpProtocol, limits=self.connection_limits)

    def run(self) -> None:
        """Serve on gunicorn's listening sockets themselves, not on gunicorn's wrappers of them.

        At shutdown uvloop's server closes its listener's descriptor through libuv, then
        deals with the object it was given: a `socket.socket` it detaches, anything else
        (gunicorn's `TCPSocket` wrapper) it closes once more. That second close(2) of the
        same number failed with EBADF ("Error while closing socket", once per worker at
        every SIGTERM) -- or, when another thread of the worker had opened a file in
        between and been given that number (the score-event file, opened in a thread),
        closed that file under it: its batch was dropped and the app's shutdown failed.
        """
        self.sockets = [getattr(listener, "sock", listener) for listener in self.sockets]
        super().run()
