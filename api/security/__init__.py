"""The front door: authentication (API keys, JWT, scopes) and per-client rate limits.

`front_door` (`FrontDoor.check`: one plain function of path, headers or gRPC metadata and
client address, called by the request middleware and usable from a gRPC interceptor),
`credentials` (what a request presents), `api_keys` (the hashed key file, its reload and the
`python -m api.security.api_keys` tool), `jwt_tokens` (PyJWT against a public key or a JWKS
file; the `auth` extra), `rate_limit` (token buckets shared by every gunicorn worker),
`paths` (path patterns), `file_watch` (files re-read when they change). Settings:
`api.config.security`; the manual: docs/security.md.
"""
