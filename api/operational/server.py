"""The operational port's app and server: `/metrics`, `/openapi.json`, `/docs`, `/healthz`.

    python -m api.operational --bind 0.0.0.0:9000 --openapi /tmp/openapi.json

One process, one event loop, at nice 10 (`NICE`), started by the gunicorn master
(`gunicorn.conf.py`) and stopped with it (`--pidfile`: it detaches, so the master's children
are its workers only, and writes its pid there); it exits by itself within a second when the
master is gone (`--parent`). It reads nothing of the workers but their metrics files
(`PROMETHEUS_MULTIPROC_DIR`) and the OpenAPI document the master wrote from the app it
preloaded, so it imports neither the app nor the routes.

Bounded like the public port: at most `MAX_CONNECTIONS` open connections (uvicorn's
`limit_concurrency`: more are answered 503), a small listen backlog, no keep-alive past 5 s.

Swagger UI (`/docs`) is served from the assets of the `swagger-ui-bundle-v2` package (the
`docs-ui` extra, Swagger UI 5, which reads OpenAPI 3.1), under `/docs/assets/`: an
air-gapped cluster needs no CDN. Without the package, `/docs` answers 404 saying so, and
`/openapi.json` is still served.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
from pathlib import Path
from typing import Final

import orjson
import uvicorn
from fastapi.openapi.docs import get_swagger_ui_html
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from api.operational.metrics_files import MetricsFiles
from api.request.admission.in_flight import process_alive

__all__ = ["MAX_CONNECTIONS", "NICE", "create_operational_app", "swagger_ui_assets"]

#: The process's CPU niceness: under contention the workers (nice 0) get about nine times
#: its share of a core (CFS weights 1024 against 110).
NICE: Final = 10
MAX_CONNECTIONS: Final = 64
BACKLOG: Final = 64
PARENT_CHECK_S: Final = 1.0
ASSETS_PATH: Final = "/docs/assets"


def swagger_ui_assets() -> Path | None:
    """The folder of Swagger UI's files from `swagger-ui-bundle-v2`, or None without it."""
    try:
        import swagger_ui_bundle  # type: ignore[import-untyped]  # ships no types
    except ImportError:
        return None
    return Path(swagger_ui_bundle.swagger_ui_path)


def create_operational_app(metrics_dir: str | None, openapi: bytes | None, title: str = "API") -> Starlette:
    """The operational app.

    Args:
        metrics_dir: the workers' multiprocess directory; None: `/metrics` answers 404.
        openapi: the app's OpenAPI document (JSON); None: `/openapi.json` and `/docs` 404.
        title: the page title of `/docs`.
    """
    files = MetricsFiles(metrics_dir) if metrics_dir else None
    assets = swagger_ui_assets()

    def not_found(detail: str) -> Response:
        return JSONResponse({"detail": detail, "code": "not_found"}, status_code=404)

    async def metrics(request: Request) -> Response:
        if files is None:
            return not_found("no PROMETHEUS_MULTIPROC_DIR: no metrics files to read")
        body, content_type = files.exposition()
        return Response(body, media_type=content_type)

    async def openapi_json(request: Request) -> Response:
        if openapi is None:
            return not_found("no OpenAPI document was given")
        return Response(openapi, media_type="application/json")

    async def docs(request: Request) -> Response:
        if openapi is None:
            return not_found("no OpenAPI document was given")
        if assets is None:
            return not_found(
                "Swagger UI's assets are not installed (the docs-ui extra: swagger-ui-bundle-v2); "
                "/openapi.json is served"
            )
        return get_swagger_ui_html(
            openapi_url="/openapi.json",
            title=f"{title} - Swagger UI",
            swagger_js_url=f"{ASSETS_PATH}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS_PATH}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS_PATH}/favicon-32x32.png",
        )

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    routes: list[Route | Mount] = [
        Route("/metrics", metrics, methods=["GET"]),
        Route("/openapi.json", openapi_json, methods=["GET"]),
        Route("/docs", docs, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
    ]
    if assets is not None:
        routes.append(Mount(ASSETS_PATH, app=StaticFiles(directory=assets)))
    return Starlette(routes=routes)


async def _watch_parent(server: uvicorn.Server, parent: int) -> None:
    """Stop when the process that started this one is gone."""
    while not server.should_exit:
        await asyncio.sleep(PARENT_CHECK_S)
        if not process_alive(parent):
            server.should_exit = True


async def _serve(server: uvicorn.Server, parent: int) -> None:
    watcher = asyncio.create_task(_watch_parent(server, parent))
    try:
        await server.serve()
    finally:
        watcher.cancel()


def main(argv: list[str] | None = None) -> None:
    """Run the operational server until SIGTERM or the parent's exit."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bind", required=True, help="host:port")
    parser.add_argument("--openapi", type=Path, help="the app's OpenAPI document (JSON file)")
    parser.add_argument("--parent", type=int, default=os.getppid(), help="exit when this process is gone")
    parser.add_argument("--pidfile", type=Path, help="detach (fork; the first process exits) and write the pid here")
    args = parser.parse_args(argv)
    if args.pidfile is not None:
        if os.fork():
            os._exit(0)
        args.pidfile.write_text(str(os.getpid()))
    host, _, port = args.bind.rpartition(":")
    openapi = args.openapi.read_bytes() if args.openapi else None
    title = str(orjson.loads(openapi).get("info", {}).get("title", "API")) if openapi else "API"
    os.nice(NICE)
    app = create_operational_app(os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None, openapi, title)
    config = uvicorn.Config(
        app,
        host=host.strip("[]") or "0.0.0.0",
        port=int(port),
        log_level="warning",
        access_log=False,
        server_header=False,
        lifespan="off",
        limit_concurrency=MAX_CONNECTIONS,
        backlog=BACKLOG,
        timeout_keep_alive=5,
    )
    # uvicorn re-raises the signal that stopped it: Ctrl-C on `make run` reaches this process
    # too (the terminal's whole foreground group), and a stop asked for is no traceback.
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(uvicorn.Server(config), args.parent))
