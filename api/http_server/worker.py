"""The gunicorn worker class of the API: uvicorn's, running `ApiHttpProtocol`.

    gunicorn -c gunicorn.conf.py 'api.app:create_app()'   # worker_class names this class

It differs from `uvicorn_worker.UvicornWorker` only in the HTTP protocol: uvicorn's
httptools protocol with the limits of `ConnectionLimits`, taken from gunicorn's own
settings (`limit_request_line`, `limit_request_fields`, `limit_request_field_size`,
`worker_connections`; `keepalive` is uvicorn's keep-alive timeout already) and from
`API_HEADER_TIMEOUT_S` and `API_MAX_HEADER_BYTES`.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from uvicorn_worker import UvicornWorker

from api.http_server.limits import ConnectionLimits
from api.http_server.protocol import ApiHttpProtocol


class ApiUvicornWorker(UvicornWorker):
    """`UvicornWorker` serving each connection with `ApiHttpProtocol`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.connection_limits = ConnectionLimits.from_gunicorn(self.cfg, os.environ)
        self.config.http = functools.partial(ApiHttpProtocol, limits=self.connection_limits)
