"""Builds a worker's serving client from a `ClientConfig` (the client's composition root).

    async with open_serving_client(config, metadata=outgoing_headers) as client:  # in a lifespan
        ...

Called in the lifespan, i.e. in each worker after gunicorn's fork and inside the
running event loop: `grpc.aio` channels bind to the loop that creates them, and
neither sockets nor channels may be shared across a fork. Under `--preload` the master
only imports this code; nothing is connected at import time.

The config is plain data, so this package needs nothing from the app: the API maps its
settings onto it (`api.config.settings.Settings.serving_client_config`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Literal

from api.serving_client._coalescing import CoalescingClient
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
from api.serving_client._tracing import ClientTracer
from api.serving_client._types import MetadataProvider, ServingClient, no_metadata
from api.serving_client._versions import VersionTracker


@dataclass(frozen=True, slots=True)
class CoalescingConfig:
    """Client-side batching of concurrent predicts (`CoalescingClient`).

    Attributes:
        window_s: the longest a batch waits for the batches in flight before it, seconds.
        max_batch_rows: rows at which a batch leaves at once.
        eager_batches: a batch leaves without waiting while fewer than this many batches
            of its model per replica are in flight (0: every batch waits its window).
    """

    window_s: float = 0.020
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
        max_attempts: attempts per call across replicas (UNAVAILABLE and attempt timeouts are
            retried).
        eject_s: a replica that refused a connection or ran past its attempt timeout is
            skipped this long, seconds.
        attempt_timeout_s: the longest one attempt takes when another replica could still
            be tried, seconds (`ReplicatedClient`); None: no limit but the deadline.
        resolve_interval_s: how often replica host names are resolved again, seconds
            (`_discovery`).
        probe_model_names: a newly resolved replica gets calls once each of these models
            has a version AVAILABLE there (none: at once); they are also the models whose
            versions per replica are read from the start (`_versions`).
        versions_interval_s: how often each replica's AVAILABLE versions and labels are read
            again, seconds (`_versions.VersionTracker`); calls go only to replicas that have the
            version they ask for.
        coalescing: merge concurrent predicts per model (`CoalescingClient`); None: off.
        rest_socket_path: serving's REST API on a Unix-domain socket of this host (REST
            only): calls go there, one replica, instead of to `rest_targets`.
        max_response_bytes: a Predict answer at most, bytes (REST: its body; gRPC: the
            channel's max receive message size, at least `OTHER_RESPONSE_BYTES`); over it
            the call fails at once, 502 `serving_bad_response`. None: no bound (gRPC's
            `MAX_MESSAGE_BYTES`).
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
    attempt_timeout_s: float | None = 0.5
    resolve_interval_s: float = 2.0
    probe_model_names: Sequence[str] = ()
    versions_interval_s: float = 5.0
    coalescing: CoalescingConfig | None = None
    rest_socket_path: str | None = None
    max_response_bytes: int | None = None


@asynccontextmanager
async def open_serving_client(
    config: ClientConfig, *, metadata: MetadataProvider = no_metadata, tracer: ClientTracer | None = None
) -> AsyncIterator[ServingClient]:
    """The worker's serving client for `config`, closed on exit.

    Args:
        config: protocol, replicas, timeouts, retries, coalescing.
        metadata: called on every call; its items travel as REST headers or gRPC
            metadata (the API sends the request id this way, and the trace context).
        tracer: opens a span per coalesced call and per attempt (`ClientTracer`); None: no spans.

    Yields:
        a `DiscoveringClient`: the targets (`config.rest_targets` or
        `config.grpc_targets`) resolved to one transport per replica address and
        re-resolved every `config.resolve_interval_s` (`_discovery`), each call going
        through a `ReplicatedClient` over the replicas of the moment, to the ones that have
        the version it asks for (`_versions`, read every `config.versions_interval_s`); wrapped in a
        `CoalescingClient` when `config.coalescing` is set. gRPC targets in gRPC's URI
        forms ("unix:...", "dns:///...") get one transport each, as given, and so does
        `config.rest_socket_path`.
    """
    http: Http1Client | None = None
    make_replica: Callable[[Address | str], ServingClient]
    retire: Callable[[ServingClient], Awaitable[None]] | None = None
    if config.protocol == "grpc":
        # Imported here so a REST-only worker never loads grpc (about 19 MB of RSS, measured).
        from api.serving_client._grpc import GrpcTransport

        parsed = [grpc_target(target) for target in config.grpc_targets]
        # A target in one of gRPC's URI forms: every target as given, no discovery.
        static = list(config.grpc_targets) if any(hp is None for hp in parsed) else []
        targets = [hp for hp in parsed if hp is not None]

        def make_replica(address: Address | str) -> ServingClient:
            return GrpcTransport(
                str(address),
                call_timeout_s=config.call_timeout_s,
                metadata=metadata,
                max_receive_bytes=config.max_response_bytes,
            )

    else:
        from api.serving_client._rest import RestTransport

        # One HTTP/1.1 client per worker, one keep-alive pool per replica in it.
        http = pools = Http1Client(
            max_connections=config.max_connections, keepalive_expiry_s=config.keepalive_expiry_s
        )
        if config.rest_socket_path:  # one replica on this host: nothing to resolve
            static = [f"unix:{config.rest_socket_path}"]
            targets = []
        else:
            static = []
            targets = [rest_target(url) for url in config.rest_targets]

        def make_replica(address: Address | str) -> ServingClient:
            origin = address if isinstance(address, str) else f"http://{address}"
            return RestTransport(
                pools,
                origin,
                call_timeout_s=config.call_timeout_s,
                connect_timeout_s=config.connect_timeout_s,
                metadata=metadata,
                max_response_bytes=config.max_response_bytes,
            )

        async def retire(replica: ServingClient) -> None:
            if isinstance(replica, RestTransport):  # always: make_replica's; its pool goes with it
                await pools.close_pool(replica.target)

    current: Callable[[], Sequence[ServingClient]]
    versions = VersionTracker(
        lambda: current(),
        models=config.probe_model_names,
        interval_s=config.versions_interval_s,
        timeout_s=min(1.0, config.call_timeout_s),
    )

    def replicated(replicas: Sequence[ServingClient]) -> ServingClient:
        return ReplicatedClient(
            replicas,
            max_attempts=config.max_attempts,
            eject_s=config.eject_s,
            attempt_timeout_s=config.attempt_timeout_s,
            versions=versions,
            tracer=tracer,
        )

    async def probe(replica: ServingClient) -> bool:
        timeout_s = min(1.0, config.call_timeout_s)
        for name in config.probe_model_names:
            if not await model_available(name, timeout_s, replica):
                return False
        return True

    client: ServingClient
    replicas: Callable[[], int]
    if static:
        fixed = [make_replica(target) for target in static]
        client = replicated(fixed)
        replicas = partial(len, static)

        def current() -> Sequence[ServingClient]:
            return fixed

    else:
        replica_set = ReplicaSet(
            targets,
            make_replica,
            retire=retire,
            probe=probe,
            resolve_interval_s=config.resolve_interval_s,
            drain_timeout_s=config.call_timeout_s,
        )
        await replica_set.start()
        client = DiscoveringClient(replica_set, replicated)

        def replicas() -> int:
            return len(replica_set.members)

        def current() -> Sequence[ServingClient]:
            return replica_set.members

    if config.coalescing is not None:
        client = CoalescingClient(
            client,
            window_s=config.coalescing.window_s,
            max_batch_rows=config.coalescing.max_batch_rows,
            eager_batches=config.coalescing.eager_batches,
            replicas=replicas,
            tracer=tracer,
        )
    try:
        await versions.start()
        yield client
    finally:
        try:
            await versions.aclose()
            await client.aclose()
        finally:
            if http is not None:
                await http.aclose()
