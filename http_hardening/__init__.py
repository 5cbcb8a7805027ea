"""The HTTP/1.1 hardening both tiers run under uvicorn: one protocol, each tier's limits.

Shared by the API (`api.http_server`) and the model server (`serving.model_servers.
http_limits`), which never import each other, as `cpu_quota` is; it imports neither.

- `limits` (stdlib only): `HttpLimits` (head size and time, lingering close, the shutdown
  drain and body timeout), `Refusal` (why a request was answered by the connection) and
  `ErrorAnswer` (that answer, in the tier's error shape);
- `protocol`: `HardenedHttpProtocol`, uvicorn's httptools protocol enforcing them, and the
  one module that relies on uvicorn's internals (its doc lists them). A tier subclasses it
  to answer a `Refusal` in its own error shape and, if it wants, to track its connections.

Nothing is imported here, so that `limits` can be read without uvicorn (the API's gunicorn
master reads its limits before anything else).
"""
