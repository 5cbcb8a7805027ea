"""The API's app factory and composition root.

    uvicorn --factory api.app:create_app          # one process
    gunicorn -c gunicorn.conf.py 'api.app:create_app()'

Nothing happens at import time: settings are read inside `create_app`, and the serving
client (HTTP/1.1 connection pools or gRPC channels,
`api.serving_client.open_serving_client`) is created in the lifespan, i.e. in each worker
after fork, inside its event loop.

Middleware: one, `api.request.middleware.RequestMiddleware`, owns each request's context,
limits, timing and error answer; FastAPI's own validation and HTTP errors are answered in
the same shape by the handlers of `api.request.errors`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
from fastapi import FastAPI

from api.config.enabled_routes import RouteConfigError, configure_routes, load_routes
from api.config.rollouts import RolloutFileError, file_signature, read_rollout_file
from api.config.serving_config import served_models
from api.config.settings import Settings
from api.inference.readiness import ModelsNotServed, require_models
from api.inference.response_bound import predict_response_bound
from api.inference.served_model import ServedModel
from api.model_routes import ModelRoute
from api.observability.wiring import install_observability
from api.oip.front import OipFront
from api.ops import start_failure
from api.ops.cpu_budget import available_cpus
from api.request.admission.in_flight import InFlightBoard
from api.request.admission.rules import EXEMPT_PATHS, Limits
from api.request.context import outgoing_headers
from api.request.errors import install_error_handlers
from api.request.middleware import RequestMiddleware
from api.rollouts import RolloutWatcher, RouteRollout, ShadowMirror
from api.rollouts.router import Role
from api.rollouts.watcher import rollouts_in_force
from api.routes import health, metrics
from api.routes.model_endpoint import ModelEndpoint
from api.security.front_door import FrontDoor
from api.serving_client import Deadline, ServingClient, open_serving_client

if TYPE_CHECKING:
    from api.observability.tracing import Tracing

ClientOpener = Callable[[], AbstractAsyncContextManager[ServingClient]]


def _open_from_settings(
    settings: Settings, models: Sequence[str], max_response_bytes: int | None, tracing: Tracing | None = None
) -> AbstractAsyncContextManager[ServingClient]:
    """The serving client `SERVING_*` describe, sending each request's id (`X-Request-ID`) and,
    when tracing, its trace context and spans; a newly discovered replica gets calls once it has
    `models` AVAILABLE; a Predict answer over `max_response_bytes` (the routes' bound,
    `api.inference.response_bound`) is refused."""
    config = settings.serving_client_config(models, max_response_bytes)
    if tracing is None:
        return open_serving_client(config, metadata=outgoing_headers)
    metadata = tracing.with_trace_context(outgoing_headers)
    return open_serving_client(config, metadata=metadata, tracer=tracing.client)


def _served_model(
    client: ServingClient, settings: Settings, signature_name: str, model_name: str, role: Role
) -> ServedModel:
    """A route's `ServedModel` for one of its rollout's models (`role`: primary arms or shadow,
    each with its own latency estimate)."""
    return ServedModel(
        client,
        model_name=model_name,
        signature_name=signature_name,
        version_ttl_s=settings.model_version_ttl_s,
        status_timeout_s=settings.serving_timeout_s,
        shedding=settings.deadline_shedding,
    )


def create_app(
    settings: Settings | None = None,
    *,
    routes: Sequence[ModelRoute[Any, Any, Any]] | None = None,
    open_client: ClientOpener | None = None,
) -> FastAPI:
    """Build the FastAPI app.

    Args:
        settings: configuration; read from the environment when None.
        routes: the model routes to serve; None: those `settings.model_routes` names.
        open_client: opens the worker's serving client in the lifespan; None:
            `open_serving_client` as the settings say (a test passes its own `ServingClient`).

    Raises:
        api.config.enabled_routes.RouteConfigError: a route cannot be loaded or its settings are wrong.
        api.security.front_door.SecurityConfigError: authentication's key file or JWT key cannot be loaded.
    """
    settings = settings if settings is not None else Settings()
    declared = routes if routes is not None else load_routes(settings.model_routes)
    endpoints = [ModelEndpoint(configured) for configured in configure_routes(declared, settings)]
    models = [e.configured.signature.model_name for e in endpoints]
    oip = OipFront(settings, route_models=models)  # the Open Inference Protocol front (OIP__MODELS)
    rows = settings.coalescing_max_batch_rows if settings.coalescing_enabled else 1
    # OIP calls any tensor of any served model: their answers are bounded by the setting alone.
    bound = None if oip.enabled else predict_response_bound((e.configured.signature for e in endpoints), rows)
    opener: ClientOpener = open_client or (lambda: _open_from_settings(settings, models, bound, observability.tracing))
    # Each route's rollout (api.rollouts): its settings', overridden by the rollout file's, which
    # is read here once so a bad file stops the app at build time, then watched by each worker.
    route_names = [e.configured.route.name for e in endpoints]
    from_settings = {
        name: entry.rollout for name, entry in settings.models.items() if entry.rollout is not None
    }
    rollout_file = settings.rollouts.file
    file_seen = file_signature(rollout_file) if rollout_file is not None else None
    try:
        from_file = read_rollout_file(rollout_file, route_names) if rollout_file and file_seen else {}
    except RolloutFileError as exc:
        raise RouteConfigError(f"ROLLOUTS__FILE: {exc}") from None

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with opener() as client:
            app.state.serving_client = client
            try:
                await require_models(
                    client,
                    {e.configured.route.name: e.configured.signature for e in endpoints},
                    Deadline.after(settings.serving_timeout_s),
                    served_models(settings.serving_model_config_file),
                )
            except ModelsNotServed as exc:
                start_failure.record(str(exc))  # the last line printed (api.ops.start_failure)
                raise
            # CPU-bound preprocessing (image decoding) runs in threads, at most one per
            # usable CPU at a time.
            cpu_limiter = anyio.CapacityLimiter(available_cpus())
            in_flight.claim()
            try:
                async with observability.running(app):
                    mirror = ShadowMirror(
                        observability.metrics,
                        app.state.events,
                        max_queue=settings.rollouts.shadow_max_queue,
                        concurrency=settings.rollouts.shadow_concurrency,
                    )
                    rollouts: dict[str, RouteRollout] = {}
                    start_rollouts = rollouts_in_force(route_names, from_settings, from_file)
                    for endpoint in endpoints:
                        signature = endpoint.configured.signature
                        name = endpoint.configured.route.name
                        served = partial(_served_model, client, settings, signature.signature_name)
                        rollouts[name] = RouteRollout(name, signature, served, start_rollouts[name], mirror)
                        endpoint.bind(
                            rollouts[name],
                            app.state.events,
                            cpu_limiter,
                            tracing=observability.tracing,
                            capture=app.state.payload_capture,
                        )
                    watcher = (
                        RolloutWatcher(
                            rollout_file,
                            rollouts,
                            from_settings,
                            observability.metrics,
                            interval_s=settings.rollouts.poll_interval_s,
                            seen=file_seen,
                        )
                        if rollout_file is not None
                        else None
                    )
                    serving_oip = (
                        oip.running(
                            app,
                            client,
                            in_flight=in_flight,
                            metrics=observability.metrics,
                            access_log=observability.access_log,
                            tracing=observability.tracing,
                            front_door=front_door,
                        )
                        if oip.enabled
                        else nullcontext()
                    )
                    mirror.start()
                    if watcher is not None:
                        await watcher.check()  # the file may have changed since the app was built
                        watcher.start()
                    try:
                        async with serving_oip:
                            yield
                    finally:
                        if watcher is not None:
                            await watcher.aclose()
                        await mirror.aclose()
            finally:
                in_flight.release()

    # With an operational port (api.operational), /metrics, /docs and /openapi.json are
    # served there, off the request path; the schema is still built from this app.
    public_ops = not settings.api_ops_bind
    app = FastAPI(
        title="Model serving API",
        version="0.1.0",
        summary="Validates raw requests, extracts features, awaits the serving tier.",
        lifespan=lifespan,
        docs_url="/docs" if public_ops else None,
        redoc_url="/redoc" if public_ops else None,
        openapi_url="/openapi.json" if public_ops else None,
    )
    app.state.settings = settings
    app.state.model_endpoints = endpoints
    install_error_handlers(app)
    observability = install_observability(app, settings)
    # Made here, in gunicorn's master under preload, so every worker inherits the same shared
    # memory; each worker takes its slot in the lifespan.
    in_flight = InFlightBoard(settings.max_in_flight_requests)
    # Made here too (in the master under preload): the rate-limit buckets are shared memory. The
    # same one checks the OIP front's gRPC calls.
    front_door = FrontDoor.from_settings(settings.auth, settings.rate_limits)
    app.add_middleware(
        RequestMiddleware,
        in_flight=in_flight,
        limits=Limits(
            max_in_flight=settings.max_in_flight_requests,
            request_timeout_s=settings.request_timeout_s,
            max_body_bytes=settings.max_body_bytes,
            path_body_limits={e.configured.route.path: e.configured.max_body_bytes for e in endpoints},
            prefix_body_limits=((oip.prefix + "/", oip.max_body_bytes),) if oip.enabled else (),
            exempt_paths=EXEMPT_PATHS | oip.probe_paths if oip.enabled else EXEMPT_PATHS,
            path_limit_settings={
                e.configured.route.path: Settings.model_setting_variable(e.configured.route.name, "max_body_bytes")
                for e in endpoints
            },
        ),
        metrics=observability.metrics,
        loop_monitor=observability.loop_monitor,
        access_log=observability.access_log,
        tracing=observability.tracing,
        front_door=front_door,
    )
    app.include_router(health.router)
    if public_ops:
        app.include_router(metrics.router)
    for endpoint in endpoints:
        app.include_router(endpoint.router())
    if oip.enabled:
        app.include_router(oip.router())
    return app
