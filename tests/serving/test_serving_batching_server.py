"""End to end: ``python -m serving --enable_batching`` merges concurrent requests (REST and gRPC).

One server for the module, with a batching parameters file whose long ``batch_timeout_micros``
makes merging deterministic: a batch runs when ``max_batch_size`` rows have arrived (or after one
second). Concurrent callers send distinct inputs to ``half_plus_two`` (y = 0.5 x + 2, exact in
float32 for these inputs) and must each get exactly their own rows back; the Prometheus page
(``--monitoring_config_file``) must show batches of more than one request.
"""

from __future__ import annotations

import concurrent.futures
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
from serving_testlib import free_port

from tests.support import Proc, start_serving, wait_until

ROWS_PER_REQUEST = 2
CALLERS = 8
MAX_BATCH_SIZE = ROWS_PER_REQUEST * CALLERS
READY_TIMEOUT_S = 90.0


@dataclass
class Server:
    proc: Proc
    rest: str
    grpc_target: str


def _model_ready(url: str) -> bool:
    try:
        response = httpx.get(url, timeout=2.0)
    except httpx.HTTPError:
        return False
    return response.status_code == 200 and any(
        status["state"] == "AVAILABLE" for status in response.json()["model_version_status"]
    )


@pytest.fixture(scope="module")
def server(serving_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    workdir = tmp_path_factory.mktemp("batching-server")
    config = workdir / "models.config"
    config.write_text(
        "model_config_list {\n"
        + "".join(
            f'  config {{ name: "{name}" base_path: "{serving_model_dir / name}" '
            'model_platform: "tensorflow" }\n'
            for name in ("half_plus_two", "two_inputs")
        )
        + "}\n"
    )
    (workdir / "batching.config").write_text(
        f"max_batch_size {{ value: {MAX_BATCH_SIZE} }}\n"
        "batch_timeout_micros { value: 1000000 }\n"
        "max_enqueued_batches { value: 100 }\n"
        "num_batch_threads { value: 1 }\n"
    )
    (workdir / "monitoring.config").write_text(
        'prometheus_config { enable: true path: "/monitoring/prometheus/metrics" }\n'
    )
    rest_port, grpc_port = free_port(), free_port()
    proc = start_serving(
        config,
        rest_port,
        grpc_port,
        workdir / "server.log",
        "--grpc_host=127.0.0.1",
        "--enable_batching",
        f"--batching_parameters_file={workdir / 'batching.config'}",
        f"--monitoring_config_file={workdir / 'monitoring.config'}",
        "--tensorflow_intra_op_parallelism=1",
        "--tensorflow_inter_op_parallelism=1",
    )
    rest = f"http://127.0.0.1:{rest_port}"
    try:
        for model in ("half_plus_two", "two_inputs"):
            wait_until(
                lambda model=model: not proc.alive() or _model_ready(f"{rest}/v1/models/{model}"),
                READY_TIMEOUT_S,
                f"{model} AVAILABLE",
            )
        assert proc.alive(), proc.log()
        yield Server(proc, rest, f"127.0.0.1:{grpc_port}")
    finally:
        code = proc.stop()
        assert code == 0, proc.log()


def _inputs(caller: int) -> list[float]:
    return [caller + 0.25 * row for row in range(ROWS_PER_REQUEST)]


def _batch_sizes(server: Server) -> tuple[int, int]:
    """(batches processed, of which with a single row) from the Prometheus page."""
    page = httpx.get(f"{server.rest}/monitoring/prometheus/metrics", timeout=10.0).text
    prefix = ":tensorflow:serving:batching_session:processed_batch_size"
    count = int(re.search(rf"^{prefix}_count{{}} (\d+)$", page, re.MULTILINE)[1])  # type: ignore[index]
    single = int(re.search(rf'^{prefix}_bucket{{le="1"}} (\d+)$', page, re.MULTILINE)[1])  # type: ignore[index]
    return count, single


def test_concurrent_rest_predicts_are_merged_and_split_row_exactly(server: Server) -> None:
    before, _ = _batch_sizes(server)

    def predict(caller: int) -> list[float]:
        response = httpx.post(
            f"{server.rest}/v1/models/half_plus_two:predict",
            json={"instances": _inputs(caller)},
            timeout=30.0,
        )
        assert response.status_code == 200, response.text
        return response.json()["predictions"]

    with concurrent.futures.ThreadPoolExecutor(CALLERS) as pool:
        answers = list(pool.map(predict, range(CALLERS)))
    for caller, predictions in enumerate(answers):
        assert predictions == [0.5 * x + 2 for x in _inputs(caller)]
    after, _ = _batch_sizes(server)
    # 16 rows, max_batch_size 16, a 1 s batch timeout: one full batch -- and never 8 of them.
    assert 1 <= after - before < CALLERS


def test_concurrent_grpc_predicts_are_merged_and_split_row_exactly(server: Server) -> None:
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    before, _ = _batch_sizes(server)
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        calls = []
        for caller in range(CALLERS):
            request = predict_pb2.PredictRequest()
            request.model_spec.name = "half_plus_two"
            request.inputs["x"].CopyFrom(
                tf.make_tensor_proto(np.array(_inputs(caller), np.float32))
            )
            calls.append(stub.Predict.future(request, timeout=30.0))
        for caller, call in enumerate(calls):
            y = tf.make_ndarray(call.result().outputs["y"])
            np.testing.assert_array_equal(y, [0.5 * x + 2 for x in _inputs(caller)])
    after, _ = _batch_sizes(server)
    assert 1 <= after - before < CALLERS


def test_batching_errors_are_tf_servings_and_fail_alone(server: Server) -> None:
    """Inputs that disagree on the batch dimension: TF Serving's batching error, 400."""

    def post(body: dict[str, object], model: str) -> httpx.Response:
        return httpx.post(f"{server.rest}/v1/models/{model}:predict", json=body, timeout=30.0)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        bad = pool.submit(post, {"inputs": {"a": [1.0, 2.0], "b": [3.0]}}, "two_inputs")
        good = pool.submit(post, {"inputs": {"a": [1.0], "b": [3.0]}}, "two_inputs")
        assert bad.result().status_code == 400
        assert bad.result().json() == {
            "error": "Batching Run() input tensors must have equal 0th-dimension size"
        }
        assert good.result().json() == {"outputs": {"product": [3.0], "sum": [4.0]}}


def test_prometheus_page_has_tf_servings_metrics(server: Server) -> None:
    response = httpx.get(f"{server.rest}/monitoring/prometheus/metrics", timeout=10.0)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    page = response.text
    for metric, kind in [
        (":tensorflow:serving:request_count", "counter"),
        (":tensorflow:serving:request_latency", "histogram"),
        (":tensorflow:serving:runtime_latency", "histogram"),
        (":tensorflow:serving:batching_session:queuing_latency", "histogram"),
        (":tensorflow:serving:batching_session:input_batch_size", "histogram"),
        (":tensorflow:serving:batching_session:processed_batch_size", "histogram"),
        (":tensorflow:serving:batching_session:padding_size", "histogram"),
        (":tensorflow:cc:saved_model:load_attempt_count", "counter"),
        (":tensorflow:cc:saved_model:load_latency", "counter"),
    ]:
        assert f"# TYPE {metric} {kind}\n" in page
    assert re.search(
        r'^:tensorflow:serving:request_count\{model_name="half_plus_two",status="OK"\} [1-9]\d*$',
        page,
        re.MULTILINE,
    )
    assert re.search(
        r'^:tensorflow:serving:request_latency_count\{model_name="half_plus_two",API="predict",'
        r'entrypoint="REST",status="OK"\} [1-9]',
        page,
        re.MULTILINE,
    )
    assert re.search(
        r'^:tensorflow:serving:runtime_latency_count\{model_name="half_plus_two",API="Predict",'
        r'runtime="TF1"\} [1-9]',
        page,
        re.MULTILINE,
    )
    assert re.search(
        r"^:tensorflow:serving:batching_session:queuing_latency_count"
        r'\{thread_pool_name="batch_threads"\} [1-9]',
        page,
        re.MULTILINE,
    )
    assert re.search(
        r'^:tensorflow:cc:saved_model:load_attempt_count\{model_path="[^"]*/half_plus_two/1",'
        r'status="success"\} 1$',
        page,
        re.MULTILINE,
    )
    assert "_created" not in page and "_total" not in page


def test_thread_pool_sizes_are_logged_at_start(server: Server) -> None:
    log = server.proc.log_path.read_text(errors="replace")
    assert "intra_op_parallelism_threads=1 inter_op_parallelism_threads=1" in log
    assert "Batching: max_batch_size=16, batch_timeout_micros=1000000" in log
