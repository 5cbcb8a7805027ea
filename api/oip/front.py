"""The OIP front as the app composes it: its routes at build time, its worker state in the lifespan.

    front = OipFront(settings, route_models=[...])       # in create_app
    if front.enabled:
        app.include_router(front.router())
    async with front.running(app, client, in_flight=..., metrics=..., access_log=...):
        ...                                                # in the lifespan, per worker

With `OIP__MODELS=none` (the default) the front adds nothing: no routes, no port.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Final

from fastapi import APIRouter, FastAPI

from api.config.settings import Settings
from api.observability.logging_config import AccessLog
from api.observability.metrics import ApiMetrics
from api.oip.catalog import Catalog
from api.oip.hooks import RpcHook
from api.oip.inference import Inference
from api.oip.rest import PREFIX, PROBE_PATHS, oip_router
from api.oip.service import OipService
from api.request.admission.in_flight import InFlightBoard
from api.serving_client import ServingClient

#: The server version OIP server metadata reports: the API's.
SERVER_VERSION: Final = "0.1.0"


class OipFront:
    """The OIP front of one app.

    Args:
        settings: the API's settings (`settings.oip` is the front's own).
        route_models: the models of the enabled model routes: what server readiness waits
            for with `OIP__MODELS=all`.
        hooks: gRPC call hooks, in order (`api.oip.grpc_server.RpcHook`): authentication, rate
            limits, tracing.
    """

    prefix: Final = PREFIX
    probe_paths: Final = PROBE_PATHS

    def __init__(self, settings: Settings, *, route_models: Sequence[str] = (), hooks: Sequence[RpcHook] = ()) -> None:
        self._settings = settings
        self.exposure = settings.oip.exposure
        self._ready_models = tuple(self.exposure.names) if not self.exposure.every else tuple(route_models)
        self._hooks = tuple(hooks)

    @property
    def enabled(self) -> bool:
        """True unless `OIP__MODELS=none`."""
        return self.exposure.enabled

    @property
    def max_body_bytes(self) -> int:
        """The largest request on the front's paths (`OIP__MAX_BODY_BYTES`)."""
        return self._settings.oip.max_body_bytes

    def router(self) -> APIRouter:
        """The REST endpoints (`api.oip.rest`)."""
        return oip_router()

    @asynccontextmanager
    async def running(
        self,
        app: FastAPI,
        client: ServingClient,
        *,
        in_flight: InFlightBoard,
        metrics: ApiMetrics,
        access_log: AccessLog,
    ) -> AsyncIterator[None]:
        """This worker's OIP service on `client` (as `app.state.oip_service`), and its gRPC
        server while the block runs (unless `OIP__GRPC_PORT=0`)."""
        settings = self._settings
        catalog = Catalog(
            client, self.exposure, ttl_s=settings.model_version_ttl_s, max_entries=settings.oip.max_models
        )
        service = OipService(
            Inference(catalog, shedding=settings.deadline_shedding, max_models=settings.oip.max_models),
            server_name=settings.oip.server_name,
            server_version=SERVER_VERSION,
            ready_models=self._ready_models,
        )
        app.state.oip_service = service
        if not settings.oip.grpc_port:
            yield
            return
        # Imported here: a worker without the gRPC front never loads grpc's server (as the
        # serving client loads grpc only for SERVING_PROTOCOL=grpc).
        from api.oip.grpc_server import serve_grpc

        async with serve_grpc(
            service,
            settings.oip,
            request_timeout_s=settings.request_timeout_s,
            in_flight=in_flight,
            metrics=metrics,
            access_log=access_log,
            hooks=self._hooks,
        ):
            yield
