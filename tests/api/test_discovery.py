"""ReplicaSet's bookkeeping with a scripted resolver (the DNS path itself: test_discovery_dns.py)."""

from __future__ import annotations

import asyncio

import pytest

from api.serving_client import Deadline
from api.serving_client._discovery import Address, ReplicaSet, grpc_target, rest_target
from api.serving_client._types import ModelSpec, ModelStatus, PredictRequest, PredictResponse, Tensor


class Replica:
    """A transport that answers after `delay_s` and records being closed."""

    def __init__(self, address: Address) -> None:
        self.address = address
        self.closed = False
        self.ready = True
        self.delay_s = 0.0

    async def predict(self, request: PredictRequest, deadline: Deadline) -> PredictResponse:
        await asyncio.sleep(self.delay_s)
        return PredictResponse({"": Tensor.from_rows([[1.0]])})

    async def model_status(self, model_name: str, deadline: Deadline) -> ModelStatus:
        return ModelStatus()

    async def aclose(self) -> None:
        self.closed = True


class Names:
    """A resolver answering from a dict; a missing name raises like getaddrinfo does."""

    def __init__(self, answers: dict[str, list[str]]) -> None:
        self.answers = answers

    async def __call__(self, host: str, port: int) -> list[str]:
        if host not in self.answers:
            raise OSError(-2, "Name or service not known")
        return list(self.answers[host])


def make_set(
    names: Names, probe: bool = False, not_ready: frozenset[str] = frozenset()
) -> tuple[ReplicaSet, dict[Address, Replica]]:
    made: dict[Address, Replica] = {}

    def make(address: Address) -> Replica:
        made[address] = Replica(address)
        made[address].ready = address.host not in not_ready
        return made[address]

    async def ready(replica: Replica) -> bool:
        return replica.ready

    replicas = ReplicaSet(
        [("serving", 8501)], make, probe=ready if probe else None, resolve_interval_s=0, drain_timeout_s=2.0,
        resolver=names,
    )  # fmt: skip
    return replicas, made


def hosts(replicas: ReplicaSet) -> list[str]:
    return [m.address.host for m in replicas.members]  # type: ignore[attr-defined]


pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


REQUEST = PredictRequest(ModelSpec("fraud"), {"x": Tensor.from_rows([[1.0]])})


def test_target_parsing() -> None:
    assert rest_target("http://serving:8501") == ("serving", 8501)
    assert rest_target("http://[::1]:8501") == ("::1", 8501)
    assert grpc_target("serving:8500") == ("serving", 8500)
    assert grpc_target("[::1]:8500") == ("::1", 8500)
    assert grpc_target("unix:/run/serving.sock") is None and grpc_target("dns:///serving:8500") is None
    assert str(Address("::1", 8500)) == "[::1]:8500"


async def test_a_failed_lookup_keeps_the_addresses_a_name_had() -> None:
    names = Names({"serving": ["10.0.0.1", "10.0.0.2"]})
    replicas, _ = make_set(names)
    await replicas.start()
    assert hosts(replicas) == ["10.0.0.1", "10.0.0.2"]
    del names.answers["serving"]
    await replicas.refresh()
    assert hosts(replicas) == ["10.0.0.1", "10.0.0.2"]
    await replicas.aclose()


async def test_a_name_that_never_resolved_is_called_as_written() -> None:
    replicas, made = make_set(Names({}))
    await replicas.start()
    assert hosts(replicas) == ["serving"]  # so a call fails as "name not resolved"
    await replicas.aclose()
    assert made[Address("serving", 8501)].closed


async def test_newcomers_get_calls_once_their_probe_passes() -> None:
    names = Names({"serving": ["10.0.0.1"]})
    replicas, made = make_set(names, probe=True, not_ready=frozenset({"10.0.0.2"}))
    await replicas.start()
    assert hosts(replicas) == ["10.0.0.1"]
    # A new replica whose models are still loading gets no calls.
    names.answers["serving"] = ["10.0.0.1", "10.0.0.2"]
    await replicas.refresh()
    assert hosts(replicas) == ["10.0.0.1"]
    assert replicas.addresses == {"10.0.0.1:8501": "admitted", "10.0.0.2:8501": "probing"}
    made[Address("10.0.0.2", 8501)].ready = True
    await replicas.refresh()
    assert hosts(replicas) == ["10.0.0.1", "10.0.0.2"]
    await replicas.aclose()


async def test_until_one_is_admitted_every_resolved_replica_is_used() -> None:
    names = Names({"serving": ["10.0.0.1", "10.0.0.2"]})
    replicas, _ = make_set(names, probe=True, not_ready=frozenset({"10.0.0.1", "10.0.0.2"}))
    await replicas.start()
    assert hosts(replicas) == ["10.0.0.1", "10.0.0.2"]  # calls fail or succeed as without discovery
    await replicas.aclose()


async def test_a_departed_replica_finishes_its_calls_before_it_is_closed() -> None:
    names = Names({"serving": ["10.0.0.1", "10.0.0.2"]})
    replicas, made = make_set(names)
    await replicas.start()
    leaving = made[Address("10.0.0.1", 8501)]
    leaving.delay_s = 0.3
    member = replicas.members[0]
    call = asyncio.create_task(member.predict(REQUEST, Deadline.after(5)))
    await asyncio.sleep(0.05)
    names.answers["serving"] = ["10.0.0.2"]
    await replicas.refresh()
    assert hosts(replicas) == ["10.0.0.2"]  # no new calls for it
    assert not leaving.closed  # its call is still running
    assert (await call).outputs
    await asyncio.sleep(0.05)
    assert leaving.closed
    await replicas.aclose()
