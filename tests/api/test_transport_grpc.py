"""The gRPC transport end to end: the API (SERVING_PROTOCOL=grpc) against a serving
process whose gRPC side is built from the OFFICIAL TF Serving stubs
(`tests.api.fake_serving`), so our protos meet theirs on the wire.

Replica failover and recovery after a restart are exercised over gRPC too: a killed
replica's calls fail with UNAVAILABLE and move to another, a hung one's run out of their
attempt timeout and move to another, and the channel reconnects to a restarted one within
its (shortened) reconnect backoff.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from api.serving_client import (
    Deadline,
    ModelSpec,
    PredictRequest,
    ServingNotFound,
    ServingTimeout,
    ServingUnavailable,
    Tensor,
)
from api.serving_client._grpc import GrpcTransport
from examples.fraud.features import extract_features
from examples.fraud.schemas import Transaction
from tests.api.fake_serving import fake_score
from tests.api.stack import (
    FakeServing,
    launch_fake,
    run_load,
    run_load_with_a_replica_hung,
    start_api_process,
    start_fake,
    transactions,
    wait_ready,
)
from tests.support import free_port, http_ok, wait_until

if importlib.util.find_spec("tensorflow_serving") is None:  # the official stubs, for the fake
    pytest.skip("tensorflow-serving-api is not installed", allow_module_level=True)
SCORE = "/v1/fraud/score"


def float32_expected(body: dict) -> float:
    """The fake's score of the float32 features the gRPC transport sends."""
    from array import array

    row = array("f", extract_features(Transaction.model_validate(body))).tolist()
    return array("f", [fake_score(row)])[0]


@pytest.fixture
def procs() -> Iterator[list]:
    started: list = []
    yield started
    for thing in reversed(started):
        thing.proc.stop()


@pytest.fixture(scope="module")
def grpc_replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[FakeServing]]:
    """Two fake serving replicas with gRPC (official stubs), started side by side.

    Shared by the module (each loads TensorFlow); the failover test, which kills them,
    runs last.
    """
    tmp = tmp_path_factory.mktemp("grpc-replicas")
    replicas = [launch_fake(tmp, f"grpc-{i}", grpc_port=free_port()) for i in range(2)]
    try:
        wait_ready(*replicas)
        yield replicas
    finally:
        for replica in replicas:
            replica.proc.stop()


def test_grpc_transport_against_official_servicers(grpc_replicas: list[FakeServing]) -> None:
    """The transport itself, in this process: status, predict, NOT_FOUND."""
    target = f"127.0.0.1:{grpc_replicas[0].grpc_port}"

    async def main() -> None:
        transport = GrpcTransport(target, call_timeout_s=5)
        try:
            status = await transport.model_status("fraud", Deadline.after(5))
            assert status.latest_available() == 1
            request = PredictRequest(
                ModelSpec("fraud", "serving_default", 1), {"features": Tensor.from_rows([[0.5, 0.25], [0.0, 0.0]])}
            )
            response = await transport.predict(request, Deadline.after(5))
            assert response.model_version == 1
            assert response.outputs["fraud_score"].shape == (2, 1)
            assert response.outputs["fraud_score"].values == pytest.approx([fake_score([0.75]), 0.5])
            with pytest.raises(ServingNotFound, match="no_such_model") as caught:
                await transport.model_status("no_such_model", Deadline.after(5))
            assert caught.value.target == target and not caught.value.replica_down
        finally:
            await transport.aclose()

    asyncio.run(main())


def test_grpc_deadline_and_unreachable_read_as_over_rest(grpc_replicas: list[FakeServing]) -> None:
    """Our own deadline and a refused connection get REST's wording (grpc's details follow)."""

    replica = grpc_replicas[0]
    request = PredictRequest(ModelSpec("fraud"), {"features": Tensor.from_rows([[0.5, 0.25]])})

    async def main() -> None:
        transport = GrpcTransport(f"127.0.0.1:{replica.grpc_port}", call_timeout_s=5)
        replica.hold()
        try:
            with pytest.raises(ServingTimeout, match="no answer within the request deadline"):
                await transport.predict(request, Deadline.after(0.2))
        finally:
            replica.release()
            await transport.aclose()
        dead = GrpcTransport(f"127.0.0.1:{free_port()}", call_timeout_s=5)
        try:
            with pytest.raises(ServingUnavailable, match="connection refused or unreachable") as caught:
                await dead.predict(request, Deadline.after(3))
            assert caught.value.replica_down
        finally:
            await dead.aclose()

    asyncio.run(main())


def test_gunicorn_preload_workers_each_open_their_own_channels(
    tmp_path: Path, procs: list, grpc_replicas: list[FakeServing]
) -> None:
    """gunicorn.conf.py preloads the app in the master; each forked worker must create
    its gRPC channels in its own lifespan and loop (a channel made before the fork hangs
    or fails in the children)."""
    from tests.support import start_gunicorn

    port = free_port()
    proc = start_gunicorn(
        tmp_path / "gunicorn.log",
        API_BIND=f"127.0.0.1:{port}",
        WEB_CONCURRENCY="2",
        SERVING_PROTOCOL="grpc",
        SERVING_GRPC_TARGETS=",".join(f"127.0.0.1:{r.grpc_port}" for r in grpc_replicas),
        EVENTS_JSONL_PATH=str(tmp_path / "events.jsonl"),
        ACCESS_LOG="false",
    )
    procs.append(type("Started", (), {"proc": proc})())
    url = f"http://127.0.0.1:{port}"
    proc.wait_ready(lambda: http_ok(url + "/readyz"), 60, "/readyz")
    bodies = transactions(200, seed=5)
    run = run_load(url + SCORE, bodies, concurrency=8, max_seconds=60)
    assert run.statuses() == {200: len(bodies)}, proc.log()
    assert proc.stop() == 0, proc.log()
    assert proc.log().count("Booting worker") >= 2


def test_a_hung_grpc_replica_is_failed_over_within_the_budget(
    tmp_path: Path, procs: list, grpc_replicas: list[FakeServing]
) -> None:
    """SIGSTOP: the replica's connection stays up, its calls are never answered."""
    budget_s = 2.0
    api = start_api_process(
        tmp_path,
        "api",
        grpc_replicas[0].url,
        SERVING_PROTOCOL="grpc",
        SERVING_GRPC_TARGETS=",".join(f"127.0.0.1:{r.grpc_port}" for r in grpc_replicas),
        REQUEST_TIMEOUT_S=str(budget_s),
        SERVING_ATTEMPT_TIMEOUT_S="0.3",
    )
    procs.append(api)
    bodies = transactions(200, seed=17)
    run = run_load_with_a_replica_hung(api.url + SCORE, grpc_replicas[1], bodies, after=30, concurrency=8)
    assert run.statuses() == {200: len(bodies)}, [o.body for o in run.outcomes if o.status != 200][:3]
    assert max(o.elapsed_s for o in run.outcomes) < budget_s


def test_scores_over_grpc_with_failover_and_recovery(
    tmp_path: Path, procs: list, grpc_replicas: list[FakeServing]
) -> None:
    replicas = grpc_replicas
    api = start_api_process(
        tmp_path,
        "api",
        replicas[0].url,  # unused with gRPC; the readiness probe goes over gRPC too
        SERVING_PROTOCOL="grpc",
        SERVING_GRPC_TARGETS=",".join(f"127.0.0.1:{r.grpc_port}" for r in replicas),
        REQUEST_TIMEOUT_S="2",
    )
    procs.append(api)
    ready = httpx.get(api.url + "/readyz", timeout=10).json()
    assert ready["status"] == "ready"
    assert ready["models"]["fraud"] == {
        "ready": True, "model": "fraud", "signature": "serving_default", "version": 1, "problems": [],
    }  # fmt: skip

    # Both replicas answer; scores are the fake's function of the float32 features.
    bodies = transactions(200, seed=21)
    run = run_load(api.url + SCORE, bodies, concurrency=8, max_seconds=60)
    assert run.statuses() == {200: len(bodies)}
    for outcome in run.outcomes:
        assert outcome.body["fraud_score"] == pytest.approx(float32_expected(bodies[outcome.index]), rel=1e-6)
        assert outcome.headers["x-model-version"] == "1"
    assert all(sum(r.stats()["batches"]) > 20 for r in replicas)

    # One replica killed under load: no request fails. (Runs last: it kills the replicas.)
    def kill_first(done: int) -> None:
        if done == 50 and replicas[0].proc.alive():
            replicas[0].proc.popen.kill()

    run = run_load(api.url + SCORE, bodies, concurrency=8, max_seconds=60, on_done=kill_first)
    assert run.statuses() == {200: len(bodies)}, [o.body for o in run.outcomes if o.status != 200][:3]

    # The last one killed too: 503 in the API's error shape, then recovery once it is back.
    replicas[1].proc.popen.kill()
    down = httpx.post(api.url + SCORE, json=bodies[0], timeout=10)
    assert down.status_code == 503 and down.json()["code"] == "serving_unavailable"
    procs.append(start_fake(tmp_path, "grpc-again", grpc_port=replicas[1].grpc_port))
    wait_until(lambda: httpx.get(api.url + "/readyz", timeout=5).status_code == 200, 30, "readyz over gRPC")
    again = httpx.post(api.url + SCORE, json=bodies[0], timeout=10)
    assert again.status_code == 200 and again.json()["fraud_score"] == pytest.approx(float32_expected(bodies[0]))
