"""The operational port: `/metrics`, `/docs` and `/openapi.json` off the request path.

    python -m api.operational --bind 0.0.0.0:9000 --openapi /tmp/openapi.json   # gunicorn.conf.py starts it

Under gunicorn these are not served by the workers on the public port (`API_BIND`) but by one
process of their own, started by the gunicorn master once it is ready (`gunicorn.conf.py`,
`API_OPS_BIND`, default `0.0.0.0:9000`; empty puts them back on the public port), at a lower
CPU priority than the workers (nice 10): a scrape or a flood of scrapes takes only what
scoring leaves, and the workers' event loops never see it. Measured before, on the public
port (2 workers, 2 cores): 150 scrapes/s beside 50 scores/s left 38 of 300 scores within
budget, each scrape ~30 ms of a worker's CPU reading ~21 multiprocess files.

- `metrics_files`: the workers' Prometheus multiprocess files, read at most once per
  `CACHE_S` however often it is scraped, with dead workers' files merged into one archive
  per type first (so a scrape reads the live workers' files and the archive, not every
  worker that ever ran);
- `server`: the Starlette app and its uvicorn server: `/metrics`, `/openapi.json` (written by
  the master from the app it preloaded), `/docs` (Swagger UI from the assets the
  `swagger-ui-bundle-v2` package ships, the `docs-ui` extra: never a CDN), `/healthz`.

The probes stay on the public port (`/healthz`, `/readyz`, never refused for load): they
must say whether the workers answer.
"""
