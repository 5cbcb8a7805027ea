"""Deadline-aware shedding (`api.request.admission.shedding`, `api.inference.served_model.ServedModel`).

Unit tests of the latency estimate and of the refusal, then the measurement the feature
exists for, with real processes on loopback: a model of finite capacity whose latency has
doubled (fake serving, 4 predicts at a time, 80 ms each instead of 40: 50 a second), an
open-loop Poisson load of 60 requests a second for 6 s, half of them with a 60 ms budget
(enough for the model at its normal 40 ms, not at 80) and half with 400 ms; once with
shedding off, once on. Without it the 60 ms requests still take the model's slots and time
out, the queue grows, and the 400 ms ones time out too; with it they are refused at once.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from api.inference.served_model import ServedModel
from api.request.admission.shedding import LatencyEstimate
from api.serving_client import (
    Deadline,
    DeadlineExceeded,
    ModelStatus,
    PredictRequest,
    PredictResponse,
    Tensor,
    VersionStatus,
)
from tests.api.stack import launch_fake, start_api_process, transactions, wait_ready
from tests.chaos.load import LoadResult, OpenLoopLoad

OUTPUT = "fraud_score"


def test_the_estimate_is_the_median_of_recent_calls_and_forgets() -> None:
    estimate = LatencyEstimate(window_s=5.0, min_samples=3)
    estimate.record(0.010, now=100.0)
    estimate.record(0.030, now=100.0)
    assert estimate.median(now=100.0) is None  # too few to go by
    estimate.record(0.020, now=101.0)
    assert estimate.median(now=101.2) == pytest.approx(0.020)
    # Five seconds on, the first two are forgotten: too few again, nothing is refused.
    assert estimate.median(now=105.5) is None


class CountingClient:
    """A serving client that answers every predict at once and counts them."""

    def __init__(self) -> None:
        self.predicts = 0

    async def predict(self, request: PredictRequest, deadline: Deadline) -> PredictResponse:
        self.predicts += 1
        return PredictResponse({OUTPUT: Tensor((1, 1), [0.5])}, model_version=1)

    async def model_status(self, model_name: str, deadline: Deadline) -> ModelStatus:
        return ModelStatus((VersionStatus(1, "AVAILABLE"),))

    async def aclose(self) -> None:
        pass


@pytest.mark.parametrize("shedding", [True, False])
@pytest.mark.anyio
async def test_a_request_with_less_left_than_the_model_takes_is_refused_without_calling(shedding: bool) -> None:
    client = CountingClient()
    model = ServedModel(client, model_name="fraud", version_ttl_s=60, status_timeout_s=1, shedding=shedding)
    for _ in range(40):
        model.latency.record(0.1)
    inputs: Mapping[str, Tensor] = {"features": Tensor((1, 1), [0.0])}
    outputs: Sequence[str] = (OUTPUT,)
    await model.predict(inputs, Deadline.after(0.2), outputs=outputs)
    assert client.predicts == 1
    if shedding:
        with pytest.raises(DeadlineExceeded, match="less than the 100 ms model 'fraud' takes now"):
            await model.predict(inputs, Deadline.after(0.05), outputs=outputs)
        assert client.predicts == 1
    else:
        await model.predict(inputs, Deadline.after(0.05), outputs=outputs)
        assert client.predicts == 2


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def run_overload(tmp: Path, shedding: bool) -> LoadResult:
    fake = launch_fake(tmp, f"model-{shedding}", None, 0, "--service-ms=80", "--slots=4")
    api = None
    try:
        wait_ready(fake)
        # Coalescing off: the fake's cost is per call, whatever its rows, so batched calls
        # would lift the capacity limit this overload is about.
        api = start_api_process(
            tmp, f"api-{shedding}", fake.url, DEADLINE_SHEDDING=str(shedding).lower(), MAX_IN_FLIGHT_REQUESTS="512",
            COALESCING_ENABLED="false",
        )
        load = OpenLoopLoad(
            api.url + "/v1/fraud/score",
            transactions(256, seed=3),
            rate=60,
            seconds=6,
            budget_s=2.0,
            budgets_s=(0.06, 0.4),
            connections=256,
            keepalive=256,
            poisson_seed=11,
        )
        with load:
            pass
        return load.result
    finally:
        if api is not None:
            api.proc.stop()
        fake.proc.stop()


def test_under_an_overload_that_doubles_the_models_latency_shedding_answers_more_in_time(tmp_path: Path) -> None:
    without = run_overload(tmp_path, shedding=False)
    with_shedding = run_overload(tmp_path, shedding=True)
    for name, result in (("without", without), ("with", with_shedding)):
        median = statistics.median(result.latencies_200_s) * 1000 if result.latencies_200_s else float("nan")
        print(f"\nshedding {name}: {result.sent} sent, {dict(result.outcomes)}, median 200 latency {median:.0f} ms")
    assert with_shedding.within_budget > without.within_budget * 1.5
    assert with_shedding.lost == without.lost == 0
