"""Builds the worker's serving client from settings (the client's composition root).

    async with open_serving_client(settings) as client:   # in the app's lifespan
        ...

Called in the lifespan, i.e. in each worker after gunicorn's fork and inside the
running event loop: `grpc.aio` channels bind to the loop that creates them, and
neither sockets nor channels may be shared across a fork. Under `--preload` the master
only imports this code; nothing is connected at import time.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from api.serving_client._discovery import (
    Address,
    DiscoveringClient,
    ReplicaSet,
    grpc_target,
    model_available,
    rest_target,
)
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
        a `DiscoveringClient`: the targets (`serving_rest_targets` or
        `serving_grpc_targets`) resolved to one transport per replica address and
        re-resolved every `serving_resolve_interval_s` (`_discovery`), each call going
        through a `ReplicatedClient` over the replicas of the moment; wrapped in
        `api.coalescing.CoalescingClient` when `COALESCING_ENABLED`. gRPC targets in
        gRPC's URI forms ("unix:...", "dns:///...") get one transport each, as given.
    """
    from api.coalescing import CoalescingClient  # coalescing wraps the client, not vice versa

    http: Http1Client | None = None
    make_replica: Callable[[Address], ServingClient]
    retire: Callable[[ServingClient], Awaitable[None]] | None = None
    if settings.serving_protocol == "grpc":
        from api.serving_client._grpc import GrpcTransport  # grpc only loaded when used

        parsed = [grpc_target(target) for target in settings.serving_grpc_targets]
        static = [target for target, hp in zip(settings.serving_grpc_targets, parsed, strict=True) if hp is None]
        targets = [hp for hp in parsed if hp is not None]

        def make_replica(address: Address | str) -> ServingClient:
            return GrpcTransport(str(address), call_timeout_s=settings.serving_timeout_s)

    else:
        from api.serving_client._rest import RestTransport

        http = http_client(settings)
        pools = http
        static = []
        targets = [rest_target(url) for url in settings.serving_rest_targets]

        def make_replica(address: Address | str) -> ServingClient:
            return RestTransport(
                pools,
                f"http://{address}",
                call_timeout_s=settings.serving_timeout_s,
                connect_timeout_s=settings.serving_connect_timeout_s,
            )

        async def retire(replica: ServingClient) -> None:
            await pools.close_pool(replica.target)  # type: ignore[attr-defined]

    def replicated(replicas: Sequence[ServingClient]) -> ServingClient:
        return ReplicatedClient(replicas, max_attempts=settings.serving_max_attempts, eject_s=settings.serving_eject_s)

    client: ServingClient
    if static:
        client = replicated([make_replica(target) for target in settings.serving_grpc_targets])
    else:
        replica_set = ReplicaSet(
            targets,
            make_replica,
            retire=retire,
            probe=functools.partial(
                model_available, settings.fraud_model_name, min(1.0, settings.serving_timeout_s)
            ),
            resolve_interval_s=settings.serving_resolve_interval_s,
            drain_timeout_s=settings.serving_timeout_s,
        )
        await replica_set.start()
        client = DiscoveringClient(replica_set, replicated)
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
