"""Unit tests for serving.metrics: TF Serving's metric names, exposition and monitoring config."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from serving_testlib import REPO_ROOT

from serving.apis import ModelSpec, PredictRequest, PredictResponse
from serving.errors import Code, ServingError
from serving.manager import ServableHandle
from serving.metrics import (
    PROMETHEUS_PATH,
    MonitoredPredictor,
    MonitoredSession,
    ServingMetrics,
    exponential_buckets,
    instrument_loader,
    prometheus_path,
)


def _samples(metrics: ServingMetrics) -> dict[str, str]:
    """``name{labels}`` -> value, from the rendered page."""
    lines = metrics.render().decode().splitlines()
    return dict(line.rsplit(" ", 1) for line in lines if not line.startswith("#"))


def test_buckets_are_tf_monitoring_exponential_buckets() -> None:
    assert exponential_buckets(10, 1.8, 33)[:5] == (10.0, 18.0, 32.4, 58.32, 104.976)
    assert len(exponential_buckets(10, 1.8, 33)) == 33
    assert exponential_buckets(1, 2, 14) == tuple(float(2**i) for i in range(14))


def test_page_is_written_like_tf_servings_prometheus_exporter() -> None:
    metrics = ServingMetrics()
    metrics.record_request("m", "predict", "REST", Code.OK, 0.0015)
    metrics.record_request("m", "predict", "REST", Code.OK, 0.0015)
    metrics.record_request('we"ird\\', "Predict", "GRPC", Code.NOT_FOUND, 0.0001)
    page = metrics.render().decode()
    assert page.endswith("\n")
    assert "# HELP" not in page and "_total" not in page and "_created" not in page
    # A counter: its own name (prometheus-client would write request_count_total), integer value.
    assert "# TYPE :tensorflow:serving:request_count counter\n" in page
    assert ':tensorflow:serving:request_count{model_name="m",status="OK"} 2\n' in page
    assert (
        ':tensorflow:serving:request_count{model_name="we\\"ird\\\\",status="NOT_FOUND"} 1\n'
        in page
    )
    # A histogram in microseconds, labels in TF Serving's order, le last and printed like TF.
    samples = _samples(metrics)
    prefix = ':tensorflow:serving:request_latency_bucket{model_name="m",API="predict",'
    assert samples[prefix + 'entrypoint="REST",status="OK",le="1102"}'] == "0"
    assert samples[prefix + 'entrypoint="REST",status="OK",le="1983.59"}'] == "2"
    assert samples[prefix + 'entrypoint="REST",status="OK",le="+Inf"}'] == "2"
    total = ':tensorflow:serving:request_latency_sum{model_name="m",API="predict",'
    assert float(samples[total + 'entrypoint="REST",status="OK"}']) == pytest.approx(3000)


def test_every_metric_has_a_type_line_before_any_sample() -> None:
    page = ServingMetrics().render().decode()
    assert re.findall(r"^# TYPE (\S+) (\S+)$", page, re.MULTILINE) == [
        (":tensorflow:serving:request_count", "counter"),
        (":tensorflow:serving:request_latency", "histogram"),
        (":tensorflow:serving:runtime_latency", "histogram"),
        (":tensorflow:serving:batching_session:queuing_latency", "histogram"),
        (":tensorflow:serving:batching_session:input_batch_size", "histogram"),
        (":tensorflow:serving:batching_session:processed_batch_size", "histogram"),
        (":tensorflow:serving:batching_session:padding_size", "histogram"),
        (":tensorflow:cc:saved_model:load_attempt_count", "counter"),
        (":tensorflow:cc:saved_model:load_latency", "counter"),
    ]


def test_batching_and_load_metrics() -> None:
    metrics = ServingMetrics()
    metrics.record_input_batch_size(3)
    metrics.record_batch(8, 5)
    metrics.record_queuing("batch_threads", 0.0002)
    metrics.record_load("/models/m/1", True, 0.25)
    metrics.record_load("/models/m/2", False, 0.01)
    samples = _samples(metrics)
    prefix = ":tensorflow:serving:batching_session:"
    assert samples[prefix + 'input_batch_size_bucket{le="4"}'] == "1"
    assert samples[prefix + 'processed_batch_size_bucket{le="4"}'] == "0"
    assert samples[prefix + 'processed_batch_size_bucket{le="8"}'] == "1"
    assert samples[prefix + 'padding_size_sum{execution_batch_size="8"}'] == "5"
    assert samples[prefix + 'queuing_latency_count{thread_pool_name="batch_threads"}'] == "1"
    load = ":tensorflow:cc:saved_model:"
    assert samples[load + 'load_attempt_count{model_path="/models/m/1",status="success"}'] == "1"
    assert samples[load + 'load_attempt_count{model_path="/models/m/2",status="fail"}'] == "1"
    assert samples[load + 'load_latency{model_path="/models/m/1"}'] == "250000"
    assert load + 'load_latency{model_path="/models/m/2"}' not in samples


class _Predictor:
    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error

    async def predict(
        self, request: PredictRequest, *, timeout_ms: int | None = None
    ) -> PredictResponse:
        if self.error is not None:
            raise self.error
        return PredictResponse(request.model_spec, {"y": np.zeros(1)})

    def input_dtypes(self, spec: ModelSpec) -> dict[str, str]:
        return {"x": "DT_FLOAT"}


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (None, "OK"),
        (ServingError(Code.NOT_FOUND, "Servable not found for request: Latest(m)"), "NOT_FOUND"),
        (asyncio.CancelledError(), "CANCELLED"),
        (RuntimeError("bug"), "UNKNOWN"),
    ],
)
def test_monitored_predictor_counts_every_outcome(
    error: BaseException | None, status: str
) -> None:
    metrics = ServingMetrics()
    predictor = MonitoredPredictor(_Predictor(error), metrics, entrypoint="GRPC", api="Predict")
    request = PredictRequest(ModelSpec("m"), {"x": np.zeros(1)})

    async def call() -> None:
        await predictor.predict(request, timeout_ms=5)

    if error is None:
        asyncio.run(call())
    else:
        with pytest.raises(type(error)):
            asyncio.run(call())
    samples = _samples(metrics)
    assert samples[f':tensorflow:serving:request_count{{model_name="m",status="{status}"}}'] == "1"
    latency = ':tensorflow:serving:request_latency_count{model_name="m",API="Predict",'
    assert samples[latency + f'entrypoint="GRPC",status="{status}"}}'] == "1"
    assert predictor.input_dtypes(ModelSpec("m")) == {"x": "DT_FLOAT"}


def test_monitored_session_records_runtime_latency() -> None:
    class Session:
        async def run_tensors(
            self, handle: object, feeds: object, fetches: object, timeout_ms: object
        ) -> list[np.ndarray]:
            return [np.ones(1)]

    metrics = ServingMetrics()
    session = MonitoredSession(Session(), metrics, api="Classify")
    handle = ServableHandle("m", 3, object())
    assert asyncio.run(session.run_tensors(handle, {}, (), None))[0].tolist() == [1.0]
    key = ':tensorflow:serving:runtime_latency_count{model_name="m",API="Classify",runtime="TF1"}'
    assert _samples(metrics)[key] == "1"


def test_instrumented_loader_records_success_and_failure() -> None:
    metrics = ServingMetrics()

    def loader(path: str) -> str:
        if path.endswith("bad"):
            raise ServingError(Code.NOT_FOUND, "no SavedModel")
        return f"servable at {path}"

    load = instrument_loader(loader, metrics)
    assert load("/m/1") == "servable at /m/1"
    with pytest.raises(ServingError):
        load("/m/bad")
    samples = _samples(metrics)
    prefix = ":tensorflow:cc:saved_model:load_attempt_count"
    assert samples[prefix + '{model_path="/m/1",status="success"}'] == "1"
    assert samples[prefix + '{model_path="/m/bad",status="fail"}'] == "1"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('prometheus_config { enable: true path: "/metrics" }', "/metrics"),
        ("prometheus_config { enable: true }", PROMETHEUS_PATH),
        ('prometheus_config { enable: false path: "/metrics" }', None),
        ("", None),
    ],
)
def test_monitoring_config_file(tmp_path: Path, text: str, expected: str | None) -> None:
    path = tmp_path / "monitoring.config"
    path.write_text(text)
    assert prometheus_path(str(path)) == expected
    assert prometheus_path("") is None


@pytest.mark.parametrize(
    ("text", "start"),
    [
        ("prometheus_config { enable: yes please }", "Invalid protobuf file: '"),
        ('prometheus_config { enable: true path: "metrics" }', "prometheus_config.path must"),
    ],
)
def test_bad_monitoring_config_is_invalid_argument(tmp_path: Path, text: str, start: str) -> None:
    path = tmp_path / "monitoring.config"
    path.write_text(text)
    with pytest.raises(ServingError) as info:
        prometheus_path(str(path))
    assert info.value.code is Code.INVALID_ARGUMENT
    assert info.value.message.startswith(start)


def test_a_bad_monitoring_config_fails_start_up_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "monitoring.config"
    path.write_text('prometheus_config { enable: true path: "metrics" }')
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "serving",
            "--model_base_path=/models/m",
            f"--monitoring_config_file={path}",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith("python -m serving: error: prometheus_config.path must start")
