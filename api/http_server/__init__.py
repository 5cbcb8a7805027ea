"""The API's HTTP server layer: the connections uvicorn accepts, under gunicorn.

uvicorn's own HTTP/1.1 protocol bounds nothing before a request reaches the app: no header
size or count, no time to send the head, no limit on open connections, and a response sent
before the request's body was read is followed by a close that resets the client's
connection. This package adds those limits at the connection, where they must sit; all but
the connection cap are the shared hardening of both tiers (`http_hardening`):

- `ConnectionLimits`: the limits, from gunicorn's own settings where it has one
  (`limit_request_line`, `limit_request_fields`, `limit_request_field_size`,
  `worker_connections`, `keepalive`) and `API_HEADER_TIMEOUT_S`;
- `ApiHttpProtocol`: `http_hardening.protocol.HardenedHttpProtocol` with the API's
  limits, connection cap and error shape (`protocol`);
- `ApiUvicornWorker`: the gunicorn worker that runs it (`worker`, `gunicorn.conf.py`);
- `raise_open_files_limit`: the file-descriptor soft limit raised to the hard one at start.
"""

from api.http_server.limits import ConnectionLimits, raise_open_files_limit
from api.http_server.protocol import ApiHttpProtocol

__all__ = ["ApiHttpProtocol", "ConnectionLimits", "raise_open_files_limit"]
