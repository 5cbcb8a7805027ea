"""Unit tests for serving.util.metrics: TF Serving's metric names, exposition and monitoring config."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from serving.apis import ModelSpec, PredictRequest, PredictResponse
from serving.config.monitoring_config import PROMETHEUS_PATH, prometheus_path
from serving.core.servable_handle import ServableHandle
from serving.servables.tensorflow.monitored import (
    MonitoredInference,
    MonitoredPredictor,
    MonitoredSession,
    instrument_loader,
)
from serving.util.errors import Code, ServingError
from serving.util.metrics import API_LABELS, ServingMetrics, exponential_buckets
from tools.processes import run_to_exit, serving_command


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
    assert "# HELP" not in page and "_created" not in page
    assert ":tensorflow:serving:request_count_total" not in page
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
        (":tensorflow:serving:request_example_counts", "histogram"),
        (":tensorflow:serving:request_example_count_total", "counter"),
        (":tensorflow:serving:model_warmup_latency", "histogram"),
        (":tensorflow:serving:batching_session:queuing_latency", "histogram"),
        (":tensorflow:serving:batching_session:input_batch_size", "histogram"),
        (":tensorflow:serving:batching_session:processed_batch_size", "histogram"),
        (":tensorflow:serving:batching_session:padding_size", "histogram"),
        (":tensorflow:cc:saved_model:load_attempt_count", "counter"),
        (":tensorflow:cc:saved_model:load_latency", "counter"),
        (":tensorflow:serving:request_limit_exceeded_count", "counter"),
    ]


def test_limit_exceeded_counter() -> None:
    metrics = ServingMetrics()
    metrics.record_limit_exceeded("REST", "body_bytes")
    metrics.record_limit_exceeded("REST", "body_bytes")
    metrics.record_limit_exceeded("GRPC", "elements")
    page = metrics.render().decode()
    name = ":tensorflow:serving:request_limit_exceeded_count"
    assert f'{name}{{entrypoint="REST",reason="body_bytes"}} 2\n' in page
    assert f'{name}{{entrypoint="GRPC",reason="elements"}} 1\n' in page


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

    async def decode_and_predict(
        self,
        spec: ModelSpec,
        decode: Callable[[dict[str, str]], tuple[Any, Mapping[str, np.ndarray]]],
        *,
        timeout_ms: int | None = None,
    ) -> tuple[Any, PredictResponse]:
        context, inputs = decode({"x": "DT_FLOAT"})
        return context, await self.predict(PredictRequest(spec, inputs), timeout_ms=timeout_ms)


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


def test_rest_predict_is_recorded_with_its_decoding() -> None:
    """REST predict decodes inside the recorded call (it needs the signature's dtypes): a body
    whose tensors do not decode is counted with its code, as TF Serving's REST server counts it."""
    metrics = ServingMetrics()
    predictor = MonitoredPredictor(_Predictor(), metrics, entrypoint="REST")

    def decode(dtypes: dict[str, str]) -> tuple[str, dict[str, np.ndarray]]:
        assert dtypes == {"x": "DT_FLOAT"}
        return "row", {"x": np.zeros(1, np.float32)}

    def bad_decode(dtypes: dict[str, str]) -> tuple[str, dict[str, np.ndarray]]:
        raise ServingError(Code.INVALID_ARGUMENT, "JSON Value: ... Type: String is not of type")

    context, response = asyncio.run(predictor.decode_and_predict(ModelSpec("m"), decode))
    assert context == "row" and list(response.outputs) == ["y"]
    with pytest.raises(ServingError):
        asyncio.run(predictor.decode_and_predict(ModelSpec("m"), bad_decode))
    samples = _samples(metrics)
    latency = ':tensorflow:serving:request_latency_count{model_name="m",API="predict",'
    assert samples[latency + 'entrypoint="REST",status="OK"}'] == "1"
    assert samples[latency + 'entrypoint="REST",status="INVALID_ARGUMENT"}'] == "1"


class _Inference:
    """Answers every API with a marker, or raises ``error``."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error

    async def _answer(self, api: str) -> str:
        if self.error is not None:
            raise self.error
        return api

    async def classify(self, request: Any, *, timeout_ms: int | None = None) -> Any:
        return await self._answer("classify")

    async def regress(self, request: Any, *, timeout_ms: int | None = None) -> Any:
        return await self._answer("regress")

    async def multi_inference(self, request: Any, *, timeout_ms: int | None = None) -> Any:
        return await self._answer("multi_inference")


@pytest.mark.parametrize("entrypoint", ["REST", "GRPC"])
def test_monitored_inference_records_classify_and_regress_like_tf_serving(
    entrypoint: str,
) -> None:
    from serving.apis import ExampleRequest, InferenceTask, MultiInferenceRequest

    metrics = ServingMetrics()
    inference = MonitoredInference(_Inference(), metrics, entrypoint=entrypoint)
    examples = np.array([b""], object)
    request = ExampleRequest(ModelSpec("m"), examples)
    task = InferenceTask(ModelSpec("m"), "tensorflow/serving/classify")
    multi = MultiInferenceRequest((task,), examples)

    async def calls() -> list[Any]:
        return [
            await inference.classify(request, timeout_ms=5),
            await inference.regress(request),
            await inference.regress(request),
            await inference.multi_inference(multi),
        ]

    assert asyncio.run(calls()) == ["classify", "regress", "regress", "multi_inference"]
    samples = _samples(metrics)
    # Classify and Regress count; MultiInference counts nowhere (PredictionServiceImpl records no
    # request metric for it).
    assert samples[':tensorflow:serving:request_count{model_name="m",status="OK"}'] == "3"
    latency = ':tensorflow:serving:request_latency_count{model_name="m",'
    classify, regress = API_LABELS[entrypoint]["classify"], API_LABELS[entrypoint]["regress"]
    assert samples[latency + f'API="{classify}",entrypoint="{entrypoint}",status="OK"}}'] == "1"
    assert samples[latency + f'API="{regress}",entrypoint="{entrypoint}",status="OK"}}'] == "2"
    assert len([key for key in samples if key.startswith(latency)]) == 2
    assert (classify, regress) == (
        ("classify", "regress") if entrypoint == "REST" else ("Classify", "Regress")
    )


def test_monitored_inference_records_failures_with_their_code() -> None:
    from serving.apis import ExampleRequest

    metrics = ServingMetrics()
    error = ServingError(Code.INVALID_ARGUMENT, "No signature was found with the name: x")
    inference = MonitoredInference(_Inference(error), metrics, entrypoint="GRPC")
    with pytest.raises(ServingError):
        asyncio.run(inference.classify(ExampleRequest(ModelSpec("m"), np.array([], object))))
    samples = _samples(metrics)
    key = ':tensorflow:serving:request_count{model_name="m",status="INVALID_ARGUMENT"}'
    assert samples[key] == "1"


class _Session:
    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error

    async def run_tensors(
        self, handle: object, feeds: object, fetches: object, timeout_ms: object
    ) -> list[np.ndarray]:
        if self.error is not None:
            raise self.error
        return [np.ones(1)]


def test_monitored_session_records_runtime_latency() -> None:
    metrics = ServingMetrics()
    session = MonitoredSession(_Session(), metrics, api="Classify")
    handle = ServableHandle("m", 3, object())
    feeds = {"inputs:0": np.array([b"", b""], object)}
    assert asyncio.run(session.run_tensors(handle, feeds, (), None))[0].tolist() == [1.0]
    key = ':tensorflow:serving:runtime_latency_count{model_name="m",API="Classify",runtime="TF1"}'
    samples = _samples(metrics)
    assert samples[key] == "1"
    assert not any("request_example" in key and "{" in key for key in samples)


def test_monitored_session_records_nothing_for_a_failed_run() -> None:
    """TF Serving records runtime_latency after TF_RETURN_IF_ERROR(session->Run(...))."""
    metrics = ServingMetrics()
    error = ServingError(Code.INVALID_ARGUMENT, "Type mismatch")
    session = MonitoredSession(_Session(error), metrics, api="Predict")
    with pytest.raises(ServingError):
        asyncio.run(session.run_tensors(ServableHandle("m", 1, object()), {}, (), None))
    runtime = ":tensorflow:serving:runtime_latency"
    assert not any(key.startswith(runtime) for key in _samples(metrics))


def test_multi_inference_runs_record_example_counts_not_runtime_latency() -> None:
    metrics = ServingMetrics()
    session = MonitoredSession(_Session(), metrics, api="MultiInference")
    handle = ServableHandle("m", 1, object())
    for rows in (3, 5):
        feeds = {"inputs:0": np.array([b""] * rows, object)}
        asyncio.run(session.run_tensors(handle, feeds, (), None))
    page = metrics.render().decode()
    samples = _samples(metrics)
    # TF Serving's names as they are, "_total" included, and its label "model".
    assert "# TYPE :tensorflow:serving:request_example_count_total counter\n" in page
    assert samples[':tensorflow:serving:request_example_count_total{model="m"}'] == "8"
    assert samples[':tensorflow:serving:request_example_counts_count{model="m"}'] == "2"
    buckets = ':tensorflow:serving:request_example_counts_bucket{model="m",'
    assert samples[buckets + 'le="4"}'] == "1"
    assert samples[buckets + 'le="16384"}'] == "2"  # TF's 15 buckets: 1 .. 2**14
    assert not any(key.startswith(":tensorflow:serving:runtime_latency") for key in samples)


def test_warmup_latency_is_labelled_with_path_and_status() -> None:
    metrics = ServingMetrics()
    metrics.record_warmup("/m/1", "OK", 0.002)
    metrics.record_warmup("/m/2", "DATA_LOSS: corrupted record at 0", 0.001)
    samples = _samples(metrics)
    prefix = ":tensorflow:serving:model_warmup_latency_count"
    assert samples[prefix + '{model_path="/m/1",status="OK"}'] == "1"
    assert samples[prefix + '{model_path="/m/2",status="DATA_LOSS: corrupted record at 0"}'] == "1"


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
    done = run_to_exit(serving_command(model_base_path="/models/m", monitoring_config_file=path))
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith("python -m serving: error: prometheus_config.path must start")
