"""Builds a worker's serving client from a `ClientConfig` (the client's composition root).

    async with open_serving_client(config, metadata=outgoing_headers) as client:  # in a lifespan
        ...

Called in the lifespan, i.e. in each worker after gunicorn's fork and inside the
running event loop: `grpc.aio` channels bind to the loop that creates them, and
neither sockets nor channels may be shared across a fork. Under `--preload` the master
only imports this code; nothing is connected at import time.

The config is plain data, so this package needs nothing from the app: the API maps its
settings onto it (`api.settings.Settings.serving_client_config`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Literal

from api.serving_client._coalescing import CoalescingClient
from api.serving_client._http1 import Http1Client
from api.serving_client._replicas import ReplicatedClient
from api.serving_client._types import MetadataProvider, ServingClient, no_metadata


@dataclass(frozen=True, slots=True)
class CoalescingConfig:
    """Client-side batching of concurrent predicts (`CoalescingClient`).

    Attributes:
        window_s: the longest a batch waits for more requests after its first, seconds.
        max_batch_rows: rows at which a batch leaves at once.
        eager_batches: a batch leaves without waiting while fewer than this many batches
            of its model are in flight (0: every batch waits its window).
    """

    window_s: float = 0.002
    max_batch_rows: int = 64
    eager_batches: int = 1


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """How one worker reaches the serving tier.

    Attributes:
        protocol: "rest" (TF Serving's REST API, port 8501) or "grpc" (its gRPC API, 8500).
        rest_targets: REST base URLs of the replicas, e.g. ("http://serving:8501",).
        grpc_targets: gRPC "host:port" of the replicas.
        call_timeout_s: upper bound of one call to one replica, seconds.
        connect_timeout_s: TCP connect timeout (REST), seconds.
        max_connections: REST connections per replica at most (one per request in flight).
        keepalive_expiry_s: idle REST connections are closed after this, seconds; below
            serving's own idle timeout (uvicorn's default: 5 s).
        max_attempts: attempts per call across replicas (UNAVAILABLE only is retried).
        eject_s: a replica that refused a connection is skipped this long, seconds.
        coalescing: merge concurrent predicts per model; None: off.
    """

    protocol: Literal["rest", "grpc"] = "rest"
    rest_targets: Sequence[str] = ("http://127.0.0.1:8501",)
    grpc_targets: Sequence[str] = ("127.0.0.1:8500",)
    call_timeout_s: float = 2.0
    connect_timeout_s: float = 0.5
    max_connections: int = 64
    keepalive_expiry_s: float = 4.0
    max_attempts: int = 3
    eject_s: float = 1.0
    coalescing: CoalescingConfig | None = None


@asynccontextmanager
async def open_serving_client(
    config: ClientConfig, *, metadata: MetadataProvider = no_metadata
) -> AsyncIterator[ServingClient]:
    """The worker's serving client for `config`, closed on exit.

    Args:
        config: protocol, replicas, timeouts, retries, coalescing.
        metadata: called on every call; its items travel as REST headers or gRPC
            metadata (the API sends the request id this way).

    Yields:
        a `ReplicatedClient` over one transport per replica, wrapped in a
        `CoalescingClient` when `config.coalescing` is set.
    """
    http: Http1Client | None = None
    replicas: list[ServingClient]
    if config.protocol == "grpc":
        # Imported here so a REST-only worker never loads grpc (about 19 MB of RSS, measured).
        from api.serving_client._grpc import GrpcTransport

        replicas = [
            GrpcTransport(target, call_timeout_s=config.call_timeout_s, metadata=metadata)
            for target in config.grpc_targets
        ]
    else:
        from api.serving_client._rest import RestTransport

        # One HTTP/1.1 client per worker, one keep-alive pool per replica in it.
        http = Http1Client(max_connections=config.max_connections, keepalive_expiry_s=config.keepalive_expiry_s)
        replicas = [
            RestTransport(
                http,
                url,
                call_timeout_s=config.call_timeout_s,
                connect_timeout_s=config.connect_timeout_s,
                metadata=metadata,
            )
            for url in config.rest_targets
        ]
    client: ServingClient = ReplicatedClient(replicas, max_attempts=config.max_attempts, eject_s=config.eject_s)
    if config.coalescing is not None:
        client = CoalescingClient(
            client,
            window_s=config.coalescing.window_s,
            max_batch_rows=config.coalescing.max_batch_rows,
            eager_batches=config.coalescing.eager_batches,
        )
    try:
        yield client
    finally:
        try:
            await client.aclose()
        finally:
            if http is not None:
                await http.aclose()
