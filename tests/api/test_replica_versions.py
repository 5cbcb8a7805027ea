"""Versions per replica (`api.serving_client._versions`, `_replicas`): a call for a version goes
only to the replicas that have it AVAILABLE, pinned to it, with scripted in-process replicas.

Over real processes (REST and gRPC, two replicas, one still loading): tests/test_rollouts.py.
"""

from __future__ import annotations

import pytest

from api.serving_client import Deadline, ServingNotFound, ServingRejected, ServingUnavailable
from api.serving_client._replicas import ReplicatedClient
from api.serving_client._types import (
    ModelMetadata,
    ModelSpec,
    ModelStatus,
    PredictRequest,
    PredictResponse,
    Tensor,
    VersionStatus,
)
from api.serving_client._versions import ReplicaServables, VersionTracker

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Replica:
    """One replica of model `m`: version -> state, labels, and every call it was sent.

    Like TF Serving: a predict or metadata call for a version that is not AVAILABLE is NOT_FOUND
    ("Servable not found for request: Specific(m, v)"); a label resolves to its version only while
    that version is AVAILABLE; an unknown label is INVALID_ARGUMENT. Its REST-like answers do not
    name the version (`names_version=False`), as TF Serving's REST predict does not.
    """

    def __init__(self, name: str, versions: dict[int, str], labels: dict[str, int] | None = None) -> None:
        self.name = name
        self.versions = versions
        self.labels = labels or {}
        self.predicts: list[ModelSpec] = []
        self.status_reads = 0
        self.down = False

    def _resolve(self, version: int | None, label: str | None) -> int:
        if self.down:
            raise ServingUnavailable("connection refused", replica_down=True)
        if label is not None:
            if label not in self.labels:
                raise ServingRejected(f"Unrecognized servable version label: {label}")
            version = self.labels[label]
        available = [v for v, s in self.versions.items() if s == "AVAILABLE"]
        if version is None:
            if not available:
                raise ServingNotFound("Servable not found for request: Latest(m)")
            return max(available)
        if version not in available:
            raise ServingNotFound(f"Servable not found for request: Specific(m, {version})")
        return version

    async def predict(self, request: PredictRequest, deadline: Deadline) -> PredictResponse:
        spec = request.model_spec
        self.predicts.append(spec)
        version = self._resolve(spec.version, spec.version_label)
        return PredictResponse({"who": Tensor((1,), [f"{self.name}:{version}".encode()])})

    async def model_status(self, model_name: str, deadline: Deadline) -> ModelStatus:
        self.status_reads += 1
        if self.down:
            raise ServingUnavailable("connection refused", replica_down=True)
        return ModelStatus(tuple(VersionStatus(v, s) for v, s in sorted(self.versions.items())))

    async def model_metadata(
        self, model_name: str, version: int | None, deadline: Deadline, *, label: str | None = None
    ) -> ModelMetadata:
        return ModelMetadata(self._resolve(version, label), {})

    async def aclose(self) -> None:
        pass


async def client_over(*replicas: Replica) -> tuple[ReplicatedClient, VersionTracker]:
    tracker = VersionTracker(lambda: replicas, models=["m"], interval_s=60)
    await tracker.start()
    return ReplicatedClient(replicas, max_attempts=3, versions=tracker), tracker


def request(version: int | None = None, label: str | None = None) -> PredictRequest:
    return PredictRequest(ModelSpec("m", version=version, version_label=label), {"x": Tensor.from_rows([[1.0]])})


async def who(client: ReplicatedClient, version: int | None = None, label: str | None = None) -> tuple[str, int]:
    response = await client.predict(request(version, label), Deadline.after(5))
    assert response.model_version is not None
    return response.outputs["who"].values[0].decode(), response.model_version  # type: ignore[union-attr]


def test_a_replica_pins_versions_it_has_only() -> None:
    view = ReplicaServables({"m": frozenset({1, 2})}, {("m", "stable"): 1, ("m", "gone"): 5}, {"m"})
    assert view.pin(ModelSpec("m")) == 2
    assert view.pin(ModelSpec("m", version=1)) == 1
    assert view.pin(ModelSpec("m", version=3)) is None
    assert view.pin(ModelSpec("m", version_label="stable")) == 1
    assert view.pin(ModelSpec("m", version_label="gone")) is None  # its version is not AVAILABLE
    assert view.pin(ModelSpec("other")) is None


async def test_a_replica_still_loading_a_version_is_never_sent_it() -> None:
    ready = Replica("a", {1: "AVAILABLE", 2: "AVAILABLE"})
    loading = Replica("b", {1: "AVAILABLE", 2: "LOADING"})
    client, tracker = await client_over(ready, loading)
    assert {await who(client, 2) for _ in range(10)} == {("a:2", 2)}
    assert all(spec.version == 2 for spec in ready.predicts)
    assert loading.predicts == []
    # Version 1 is on both; "latest" is each replica's own latest, pinned and named.
    assert {await who(client, 1) for _ in range(10)} == {("a:1", 1), ("b:1", 1)}
    assert {await who(client) for _ in range(10)} == {("a:2", 2), ("b:1", 1)}
    assert {spec.version for spec in loading.predicts} == {1}  # pinned, never "latest"
    await tracker.aclose()


async def test_a_replica_that_lost_a_version_is_retried_elsewhere_and_forgotten() -> None:
    a = Replica("a", {1: "AVAILABLE"})
    b = Replica("b", {1: "AVAILABLE"})
    client, tracker = await client_over(a, b)
    b.versions[1] = "END"  # unloaded since it was read
    assert {await who(client, 1) for _ in range(6)} == {("a:1", 1)}
    assert len(b.predicts) == 1  # one NOT_FOUND, then it is no longer chosen
    await tracker.aclose()


async def test_no_replica_with_the_version_is_not_found_at_once() -> None:
    a = Replica("a", {1: "AVAILABLE", 2: "LOADING"})
    client, tracker = await client_over(a)
    expected = r"no serving replica has m version 2 AVAILABLE \(replica 1: AVAILABLE: 1\)"
    with pytest.raises(ServingNotFound, match=expected):
        await client.predict(request(2), Deadline.after(5))
    assert a.predicts == []
    await tracker.aclose()


async def test_labels_resolve_per_replica_through_metadata_by_label() -> None:
    a = Replica("a", {1: "AVAILABLE", 2: "AVAILABLE"}, {"stable": 1, "canary": 2})
    b = Replica("b", {1: "AVAILABLE", 2: "LOADING"}, {"stable": 1, "canary": 2})
    client, tracker = await client_over(a, b)
    assert {await who(client, label="stable") for _ in range(10)} == {("a:1", 1), ("b:1", 1)}
    assert {await who(client, label="canary") for _ in range(10)} == {("a:2", 2)}
    # Sent pinned to the version the label names there, so the answer names it over REST too.
    assert {(s.version, s.version_label) for s in a.predicts + b.predicts} == {(1, None), (2, None)}
    with pytest.raises(ServingNotFound, match="label 'nope' names no AVAILABLE version"):
        await client.predict(request(label="nope"), Deadline.after(5))
    metadata = await client.model_metadata("m", None, Deadline.after(5), label="canary")
    assert metadata.version == 2
    await tracker.aclose()


async def test_versions_are_read_again_and_new_ones_get_calls() -> None:
    a = Replica("a", {1: "AVAILABLE", 2: "LOADING"})
    client, tracker = await client_over(a)
    a.versions[2] = "AVAILABLE"
    await tracker._read_all()  # what the background task does every interval
    assert await who(client, 2) == ("a:2", 2)
    await tracker.aclose()


async def test_a_tier_that_cannot_be_read_is_unavailable_not_missing() -> None:
    a = Replica("a", {1: "AVAILABLE"})
    a.down = True
    client, tracker = await client_over(a)
    with pytest.raises(ServingUnavailable, match="connection refused"):
        await client.predict(request(1), Deadline.after(5))
    a.down = False
    await tracker._read_all()
    assert await who(client, 1) == ("a:1", 1)
    await tracker.aclose()
