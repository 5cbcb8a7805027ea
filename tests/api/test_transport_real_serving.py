"""The API's transports against the real serving tier (`python -m serving`), not a fake.

One serving process, several API processes in front of it:
- REST and gRPC give the same scores for the same transactions (when serving has its
  gRPC front end; until then the gRPC half is skipped, saying so);
- serving's own answers to a misconfiguration (a signature it does not have) come out
  as 503 `serving_misconfigured`, over each protocol;
- coalescing on (the default) gives the same scores as coalescing off.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from api.serving_client import Deadline, ServingError
from api.serving_client._grpc import GrpcTransport
from tests.api.stack import Api, run_load, start_api_process, transactions
from tests.support import Serving
from tools.processes import StartError

SCORE = "/v1/fraud/score"


@pytest.fixture(scope="module")
def serving(example_serving: Serving) -> Serving:
    return example_serving


@pytest.fixture
def apis() -> Iterator[list[Api]]:
    started: list[Api] = []
    yield started
    for api in started:
        api.proc.stop()


def grpc_front_end_or_skip(serving: Serving) -> None:
    """Skip unless serving answers model status over gRPC (its REST side is up by now)."""

    async def probe() -> bool:
        transport = GrpcTransport(serving.grpc_target, call_timeout_s=5)
        try:
            await transport.model_status("fraud", Deadline.after(5))
            return True
        except ServingError:
            return False
        finally:
            await transport.aclose()

    if not asyncio.run(probe()):
        pytest.skip("python -m serving does not answer gRPC on --port yet")


def scores(api: Api, bodies: list[dict]) -> dict[str, float]:
    run = run_load(api.url + SCORE, bodies, concurrency=4, max_seconds=120)
    assert run.statuses() == {200: len(bodies)}, [o.body for o in run.outcomes if o.status != 200][:3]
    return {o.body["transaction_id"]: o.body["fraud_score"] for o in run.outcomes}


def test_rest_and_coalesced_rest_agree(serving: Serving, tmp_path: Path, apis: list[Api]) -> None:
    bodies = transactions(120, seed=99)
    # Coalescing is the default: the plain API switches it off, the coalesced one runs as shipped.
    plain = start_api_process(tmp_path, "rest", serving.rest_url, COALESCING_ENABLED="false")
    apis.append(plain)
    coalesced = start_api_process(tmp_path, "rest-coalesced", serving.rest_url)
    apis.append(coalesced)
    expected = scores(plain, bodies)
    got = scores(coalesced, bodies)
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, abs=1e-6)


def test_rest_and_grpc_agree(serving: Serving, tmp_path: Path, apis: list[Api]) -> None:
    grpc_front_end_or_skip(serving)
    bodies = transactions(120, seed=98)
    rest = start_api_process(tmp_path, "rest", serving.rest_url)
    apis.append(rest)
    grpc = start_api_process(
        tmp_path, "grpc", serving.rest_url, SERVING_PROTOCOL="grpc", SERVING_GRPC_TARGETS=serving.grpc_target
    )
    apis.append(grpc)
    expected = scores(rest, bodies)
    got = scores(grpc, bodies)
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, abs=1e-6)


@pytest.mark.parametrize("protocol", ["rest", "grpc"])
def test_a_signature_serving_lacks_stops_the_api_at_start_up(serving: Serving, tmp_path: Path, protocol: str) -> None:
    """The model is there, its signature is not: the API refuses to start, naming what the model
    has (read over this transport from the real server) and the fix, as for a missing model. A
    version published later without it is a 503 `serving_misconfigured` per request
    (tests/api/test_model_routes.py)."""
    if protocol == "grpc":
        grpc_front_end_or_skip(serving)
    with pytest.raises(StartError) as refused:
        start_api_process(
            tmp_path,
            protocol,
            serving.rest_url,
            SERVING_PROTOCOL=protocol,
            SERVING_GRPC_TARGETS=serving.grpc_target,
            ready_path="/healthz",
            MODELS__FRAUD__SIGNATURE_NAME="no_such_signature",
        )
    message = str(refused.value)
    assert "route 'fraud' does not fit model 'fraud' version 1, signature 'no_such_signature': " in message
    assert "version 1 has no signature 'no_such_signature' (it has: __saved_model_init_op, serving_default)" in message
    assert "Fix: " in message
