"""Replica discovery: serving's host names resolved to every address, and re-resolved.

A target such as `http://serving:8501` or `serving:8500` names a tier, not a process:
under `docker compose --scale serving=3` the name resolves to three container
addresses, and a Kubernetes headless Service resolves to one address per ready pod.
`ReplicaSet` turns the configured targets into one transport per address and keeps it
current:

- Every `resolve_interval_s` each host name is looked up again through the system
  resolver (`getaddrinfo`: /etc/hosts, then the DNS servers of /etc/resolv.conf, with
  their search domains, as any other client in the container). IP literals are not
  re-resolved. A lookup that fails (NXDOMAIN, no answer) keeps the addresses that name
  had: a DNS hiccup never empties the tier.
- A new address is probed first, by the `probe` callable (the factory passes one asking
  for the model status of the model `/readyz` checks), and is admitted once a probe
  passes. A container's DNS record appears when it starts, before its models are loaded;
  a Kubernetes headless Service lists only ready pods, so there the probe passes at once.
  Until some address has been admitted, every resolved address is used: calls then
  succeed or fail as they would without discovery.
- An address that leaves DNS stops getting new calls at once; its calls in flight finish
  (at most `drain_timeout_s`), then its transport is retired (`retire`: the channel or
  the connection pool is closed). A replica that stops before its record goes away fails
  to connect, and `ReplicatedClient` retries the call on another replica.

`DiscoveringClient` is the `ServingClient` over a `ReplicaSet`: each call goes through a
`ReplicatedClient` over the admitted members of the moment (round-robin, retries of
UNAVAILABLE on another replica, ejection of replicas that refuse connections), rebuilt
when the membership changes.

Why not gRPC's own `dns:///` resolver with the `round_robin` policy for the gRPC
transport: gRPC re-resolves a name only when a connection of the channel fails or closes
(and at most once per `grpc.dns_min_time_between_resolutions_ms`, 30 s by default), never
on a timer. A replica added while the existing connections stay healthy is not seen
until one of them breaks (grpc/grpc issue 12295, where gRPC's maintainers decline a
timer); the usual remedy is a server-side maximum connection age, which
tensorflow_model_server does not set. One channel per resolved address, managed here,
meets "a new replica gets calls within seconds" for REST and gRPC alike, with one
drain/retire path for both.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from api.serving_client._deadline import Deadline
from api.serving_client._types import ModelMetadata, ModelStatus, PredictRequest, PredictResponse, ServingClient

_log = logging.getLogger(__name__)

Resolver = Callable[[str, int], Awaitable[list[str]]]


def rest_target(url: str) -> tuple[str, int]:
    """(host, port) of a REST base URL such as "http://serving:8501" (port 80 if none)."""
    parts = urlsplit(url)
    if not parts.hostname:
        raise ValueError(f"no host in serving URL {url!r}")
    return parts.hostname, parts.port or 80


def grpc_target(target: str) -> tuple[str, int] | None:
    """(host, port) of a gRPC target "host:port" or "[v6]:port"; None for other forms.

    gRPC's URI forms ("dns:///...", "unix:...", "ipv4:...") are left to gRPC itself.
    """
    if "/" in target or target.startswith(("unix:", "ipv4:", "ipv6:", "dns:", "unix-abstract:", "vsock:")):
        return None
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit() or not host:
        return None
    return host.removeprefix("[").removesuffix("]"), int(port)


@dataclass(frozen=True, slots=True)
class Address:
    """One replica's socket address (`host` is an IP literal after resolution)."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def is_ip_literal(host: str) -> bool:
    """True for "10.0.0.3", "::1" (a name that needs no lookup)."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


async def system_resolve(host: str, port: int) -> list[str]:
    """Every TCP address of `host` from the system resolver, in its order, without repeats.

    Raises:
        OSError (socket.gaierror): the name does not resolve.
    """
    infos = await asyncio.get_running_loop().getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )
    seen: dict[str, None] = {}
    for _family, _type, _proto, _canonname, sockaddr in infos:
        seen.setdefault(str(sockaddr[0]), None)
    return list(seen)


class _Member:
    """A replica's transport that counts its calls in flight, so it can be drained."""

    __slots__ = ("address", "in_flight", "transport", "_idle")

    def __init__(self, address: Address, transport: ServingClient) -> None:
        self.address = address
        self.transport = transport
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def __repr__(self) -> str:
        return f"{self.transport!r}"

    async def predict(self, request: PredictRequest, deadline: Deadline) -> PredictResponse:
        self._enter()
        try:
            return await self.transport.predict(request, deadline)
        finally:
            self._leave()

    async def model_status(self, model_name: str, deadline: Deadline) -> ModelStatus:
        self._enter()
        try:
            return await self.transport.model_status(model_name, deadline)
        finally:
            self._leave()

    async def model_metadata(
        self, model_name: str, version: int | str | None, deadline: Deadline, *, label: str | None = None
    ) -> ModelMetadata:
        self._enter()
        try:
            return await self.transport.model_metadata(model_name, version, deadline, label=label)
        finally:
            self._leave()

    async def aclose(self) -> None:
        """Closing is the `ReplicaSet`'s job (retire), never a snapshot's."""

    async def drained(self, timeout_s: float) -> bool:
        """Wait until no call is in flight (at most `timeout_s`); False if some still were."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True

    def _enter(self) -> None:
        self.in_flight += 1
        self._idle.clear()

    def _leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()


State = Literal["probing", "admitted"]


class ReplicaSet:
    """The replicas behind a list of targets, kept current by re-resolving (see module doc).

    Args:
        targets: (host, port) pairs, e.g. [("serving", 8501)]; hosts may be names or IP
            literals.
        make_replica: builds the transport for one resolved address (not yet connected).
        retire: closes a transport that left (default: its `aclose`).
        probe: True when a new replica may get calls; None admits every address at once.
        resolve_interval_s: seconds between lookups; 0 resolves once.
        drain_timeout_s: longest a departing replica's calls in flight are waited for.
        resolver: (host, port) -> IP literals; `system_resolve` unless a test passes one.
    """

    def __init__(
        self,
        targets: Sequence[tuple[str, int]],
        make_replica: Callable[[Address], ServingClient],
        *,
        retire: Callable[[ServingClient], Awaitable[None]] | None = None,
        probe: Callable[[ServingClient], Awaitable[bool]] | None = None,
        resolve_interval_s: float = 2.0,
        drain_timeout_s: float = 5.0,
        resolver: Resolver = system_resolve,
    ) -> None:
        if not targets:
            raise ValueError("at least one serving target is needed")
        self._targets = tuple(dict.fromkeys(targets))
        self._make = make_replica
        self._retire_fn = retire
        self._probe = probe
        self._interval_s = resolve_interval_s
        self._drain_timeout_s = drain_timeout_s
        self._resolver = resolver
        # Last good lookup per target: kept when a lookup fails.
        self._resolved: dict[tuple[str, int], list[Address]] = {}
        self._known: dict[Address, _Member] = {}
        self._state: dict[Address, State] = {}
        self._members: tuple[_Member, ...] = ()
        self.generation = 0  # bumped whenever `members` changes
        self._task: asyncio.Task[None] | None = None
        self._retiring: set[asyncio.Task[None]] = set()
        self._lock = asyncio.Lock()  # one round at a time
        self._closed = False

    @property
    def members(self) -> tuple[ServingClient, ...]:
        """The replicas calls go to now: the admitted ones, or every known one if none is."""
        return self._members

    @property
    def addresses(self) -> dict[str, str]:
        """Each known address -> "admitted" or "probing" (for logs and tests)."""
        return {str(a): s for a, s in self._state.items()}

    async def start(self) -> None:
        """Resolve once (so calls have somewhere to go) and start the re-resolving task."""
        await self.refresh()
        dynamic = not all(is_ip_literal(host) for host, _ in self._targets)
        if self._interval_s > 0 and (dynamic or self._probe is not None):
            self._task = asyncio.create_task(self._run(), name="serving-replica-discovery")

    async def refresh(self) -> None:
        """One round: look every target up, drain the departed, admit probed newcomers."""
        async with self._lock:
            await self._refresh()

    async def _refresh(self) -> None:
        for target in self._targets:
            host, port = target
            if is_ip_literal(host):
                self._resolved[target] = [Address(host, port)]
                continue
            try:
                hosts = await self._resolver(host, port)
            except OSError as exc:
                if target not in self._resolved:
                    _log.warning("serving target %s:%d does not resolve yet: %s", host, port, exc)
                continue  # keep what it had
            if hosts:
                self._resolved[target] = [Address(h, port) for h in hosts]
        current = list(dict.fromkeys(a for addrs in self._resolved.values() for a in addrs))
        for address in current:
            if address not in self._known:
                self._known[address] = _Member(address, self._make(address))
                self._state[address] = "probing" if self._probe is not None else "admitted"
                _log.info("serving replica %s appeared (%s)", address, self._state[address])
        for address in [a for a in self._known if a not in current]:
            member = self._known.pop(address)
            state = self._state.pop(address)
            _log.info("serving replica %s left DNS (%s): draining it", address, state)
            task = asyncio.create_task(self._retire(member))
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)
        self._publish(current)  # the departed get no new calls from here on
        probing = [a for a in current if self._state[a] == "probing"]
        if probing:
            passed = await asyncio.gather(*(self._probe_one(self._known[a]) for a in probing))
            for address, ok in zip(probing, passed, strict=True):
                if ok and address in self._state:
                    self._state[address] = "admitted"
                    _log.info("serving replica %s admitted", address)
        self._publish(current)

    async def aclose(self) -> None:
        """Stop re-resolving and retire every replica (calls still in flight are cancelled)."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for task in list(self._retiring):
            task.cancel()
        members = list(self._known.values())
        self._known.clear()
        self._state.clear()
        self._members = ()
        for member in members:
            await self._close(member)

    # -- internals

    def _publish(self, current: list[Address]) -> None:
        admitted = [self._known[a] for a in current if self._state.get(a) == "admitted"]
        members = tuple(admitted or [self._known[a] for a in current if a in self._known])
        if not members:
            # Nothing ever resolved: one transport per configured target as written, so a
            # call fails the way it would without discovery ("name not resolved").
            members = tuple(self._unresolved())
        if tuple(m.address for m in members) != tuple(m.address for m in self._members):
            self._members = members
            self.generation += 1

    def _unresolved(self) -> list[_Member]:
        fallback = []
        for host, port in self._targets:
            address = Address(host, port)
            if address not in self._known:
                self._known[address] = _Member(address, self._make(address))
                self._state[address] = "probing"
            fallback.append(self._known[address])
        return fallback

    async def _probe_one(self, member: _Member) -> bool:
        assert self._probe is not None
        try:
            return await self._probe(member.transport)
        except Exception as exc:  # a probe that fails for any reason just does not admit
            _log.debug("probe of serving replica %s failed: %r", member.address, exc)
            return False

    async def _retire(self, member: _Member) -> None:
        if not await member.drained(self._drain_timeout_s):
            _log.warning(
                "serving replica %s still had %d calls in flight after %.1f s; closing it",
                member.address, member.in_flight, self._drain_timeout_s,
            )  # fmt: skip
        await self._close(member)

    async def _close(self, member: _Member) -> None:
        try:
            if self._retire_fn is not None:
                await self._retire_fn(member.transport)
            else:
                await member.transport.aclose()
        except Exception:
            _log.exception("closing serving replica %s failed", member.address)

    async def _run(self) -> None:
        while not self._closed:
            await asyncio.sleep(self._interval_s)
            try:
                await self.refresh()
            except Exception:
                _log.exception("serving replica discovery round failed; retrying")


class DiscoveringClient:
    """A `ServingClient` over the admitted members of a `ReplicaSet` (see module doc).

    Args:
        replica_set: started by the caller; closed by `aclose`.
        over: builds the client for one membership snapshot, e.g.
            `lambda members: ReplicatedClient(members, max_attempts=3)`.
    """

    def __init__(
        self, replica_set: ReplicaSet, over: Callable[[Sequence[ServingClient]], ServingClient]
    ) -> None:
        self.replica_set = replica_set
        self._over = over
        self._generation = -1
        self._client: ServingClient | None = None

    def __repr__(self) -> str:
        return f"DiscoveringClient({self.replica_set.addresses!r})"

    def _current(self) -> ServingClient:
        replicas = self.replica_set
        if self._client is None or self._generation != replicas.generation:
            self._client = self._over(replicas.members)
            self._generation = replicas.generation
        return self._client

    async def predict(self, request: PredictRequest, deadline: Deadline) -> PredictResponse:
        """Predict on one of the current replicas (`ReplicatedClient` semantics)."""
        return await self._current().predict(request, deadline)

    async def model_status(self, model_name: str, deadline: Deadline) -> ModelStatus:
        """Model status from one of the current replicas."""
        return await self._current().model_status(model_name, deadline)

    async def model_metadata(
        self, model_name: str, version: int | str | None, deadline: Deadline, *, label: str | None = None
    ) -> ModelMetadata:
        """Model metadata from one of the current replicas."""
        return await self._current().model_metadata(model_name, version, deadline, label=label)

    async def aclose(self) -> None:
        """Stop discovery and close every replica's transport."""
        await self.replica_set.aclose()


async def model_available(model_name: str, timeout_s: float, replica: ServingClient) -> bool:
    """The admission probe: True when `replica` reports a version of `model_name` AVAILABLE.

    The same condition as the API's `/readyz`, asked of one replica (TF Serving's
    GetModelStatus / `GET /v1/models/<name>`). Errors propagate (the caller counts them
    as a failed probe).
    """
    status = await replica.model_status(model_name, Deadline.after(timeout_s))
    return status.latest_available() is not None
