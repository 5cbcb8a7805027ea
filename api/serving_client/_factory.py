"""Builds the worker's serving client from settings (the client's composition root).

    async with open_serving_client(settings) as client:   # in the app's lifespan
        ...

Called in the lifespan, i.e. in each worker after gunicorn's fork and inside the
running event loop: `grpc.aio` channels bind to the loop that creates them, and
neither sockets nor channels may be shared across a fork. Under `--preload` the master
only imports this code; nothing is connected at import time.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from api.serving_client._http1 import Http1Client
from api.serving_client._replicas import ReplicatedClient
from api.serving_client._types import ServingClient

if TYPE_CHECKING:
    from api.settings import Settings


def http_client(settings: Settings) -> Http1Client:
    """The worker's one `Http1Client` towards serving's REST replicas.

    It keeps one connection pool per replica (origin). Each holds at most
    `serving_pool_size` connections (the in-flight limit unless set: every request in
    flight may hold one), all kept alive, and drops an idle one after
    `serving_keepalive_expiry_s`, below serving's own idle timeout (uvicorn's default
    is 5 s), so a request rarely picks a connection serving is closing.
    """
    return Http1Client(
        max_connections=settings.serving_pool_size,
        keepalive_expiry_s=settings.serving_keepalive_expiry_s,
    )


@asynccontextmanager
async def open_serving_client(settings: Settings) -> AsyncIterator[ServingClient]:
    """The worker's serving client per `SERVING_PROTOCOL`, closed on exit.

    Yields:
        a `ReplicatedClient` over one transport per replica (`serving_rest_targets` or
        `serving_grpc_targets`), wrapped in `api.coalescing.CoalescingClient` when
        `COALESCING_ENABLED`.
    """
    from api.coalescing import CoalescingClient  # coalescing wraps the client, not vice versa

    http: Http1Client | None = None
    replicas: list[ServingClient]
    if settings.serving_protocol == "grpc":
        from api.serving_client._grpc import GrpcTransport  # grpc only loaded when used

        replicas = [
            GrpcTransport(target, call_timeout_s=settings.serving_timeout_s)
            for target in settings.serving_grpc_targets
        ]
    else:
        from api.serving_client._rest import RestTransport

        http = http_client(settings)
        replicas = [
            RestTransport(
                http,
                url,
                call_timeout_s=settings.serving_timeout_s,
                connect_timeout_s=settings.serving_connect_timeout_s,
            )
            for url in settings.serving_rest_targets
        ]
    client: ServingClient = ReplicatedClient(
        replicas, max_attempts=settings.serving_max_attempts, eject_s=settings.serving_eject_s
    )
    if settings.coalescing_enabled:
        client = CoalescingClient(
            client,
            window_s=settings.coalescing_window_ms / 1000.0,
            max_batch_rows=settings.coalescing_max_batch_rows,
            eager_batches=settings.coalescing_eager_batches,
        )
    try:
        yield client
    finally:
        try:
            await client.aclose()
        finally:
            if http is not None:
                await http.aclose()
