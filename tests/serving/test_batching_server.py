"""End to end: ``python -m serving --enable_batching`` merges concurrent requests (REST and gRPC).

One server for the module, with a batching parameters file whose long ``batch_timeout_micros``
makes merging deterministic: a batch runs when ``max_batch_size`` rows have arrived (or after one
second). Concurrent callers send distinct inputs to ``half_plus_two`` (y = 0.5 x + 2, exact in
float32 for these inputs) and must each get exactly their own rows back; the Prometheus page
(``--monitoring_config_file``) must show batches of more than one request. A second server splits
large requests (``enable_large_batch_splitting``): a request larger than
``max_execution_batch_size`` must get exactly its rows back, and no executed batch may be larger.
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

from tests.serving.serving_testlib import start_test_serving
from tests.support import Process

ROWS_PER_REQUEST = 2
CALLERS = 8
MAX_BATCH_SIZE = ROWS_PER_REQUEST * CALLERS
READY_TIMEOUT_S = 90.0


@dataclass
class Server:
    proc: Process
    rest: str
    grpc_target: str


def _start(
    serving_model_dir: Path,
    workdir: Path,
    models: tuple[str, ...],
    batching_parameters: str,
) -> Server:
    """``python -m serving --enable_batching`` with these parameters and Prometheus metrics,
    once ``models`` are AVAILABLE."""
    config = workdir / "models.config"
    config.write_text(
        "model_config_list {\n"
        + "".join(
            f'  config {{ name: "{name}" base_path: "{serving_model_dir / name}" '
            'model_platform: "tensorflow" }\n'
            for name in models
        )
        + "}\n"
    )
    (workdir / "batching.config").write_text(batching_parameters)
    (workdir / "monitoring.config").write_text(
        'prometheus_config { enable: true path: "/monitoring/prometheus/metrics" }\n'
    )
    serving = start_test_serving(
        config,
        workdir / "server.log",
        enable_batching=True,
        batching_parameters_file=workdir / "batching.config",
        monitoring_config_file=workdir / "monitoring.config",
    )
    try:
        serving.wait_available(*models, timeout_s=READY_TIMEOUT_S)
    except BaseException:
        serving.stop()
        raise
    return Server(serving.process, serving.rest_url, serving.grpc_target)


@pytest.fixture(scope="module")
def server(serving_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    started = _start(
        serving_model_dir,
        tmp_path_factory.mktemp("batching-server"),
        ("half_plus_two", "two_inputs"),
        f"max_batch_size {{ value: {MAX_BATCH_SIZE} }}\n"
        "batch_timeout_micros { value: 1000000 }\n"
        "max_enqueued_batches { value: 100 }\n"
        "num_batch_threads { value: 1 }\n",
    )
    try:
        yield started
    finally:
        code = started.proc.stop()
        assert code == 0, started.proc.log()


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
        (":tensorflow:serving:request_example_counts", "histogram"),
        (":tensorflow:serving:request_example_count_total", "counter"),
        (":tensorflow:serving:model_warmup_latency", "histogram"),
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
    # No prometheus-client suffixes: "_total" only where TF Serving's own name has it.
    assert "_created" not in page
    tf_total = ":tensorflow:serving:request_example_count_total"
    assert re.findall(rf"^(?!{tf_total})(\S+_total)[{{ ]", page, re.MULTILINE) == []
    assert re.findall(r"^# TYPE (\S+_total) ", page, re.MULTILINE) == [
        ":tensorflow:serving:request_example_count_total"
    ]


def test_thread_pool_sizes_are_logged_at_start(server: Server) -> None:
    log = server.proc.log_path.read_text(errors="replace")
    assert "intra_op_parallelism_threads=1 inter_op_parallelism_threads=1" in log
    assert "Batching: max_batch_size=16, batch_timeout_micros=1000000" in log


SPLIT_MAX_EXECUTION_BATCH_SIZE = 4


@pytest.fixture(scope="module")
def splitting_server(
    serving_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    started = _start(
        serving_model_dir,
        tmp_path_factory.mktemp("splitting-server"),
        ("half_plus_two",),
        "max_batch_size { value: 64 }\n"
        "enable_large_batch_splitting { value: true }\n"
        f"max_execution_batch_size {{ value: {SPLIT_MAX_EXECUTION_BATCH_SIZE} }}\n"
        "allowed_batch_sizes: [2, 4]\n"
        "num_batch_threads { value: 1 }\n",
    )
    try:
        yield started
    finally:
        code = started.proc.stop()
        assert code == 0, started.proc.log()


def _histogram(server: Server, name: str) -> dict[str, int]:
    """``le`` / ``sum`` / ``count`` -> value of an unlabelled batching_session histogram."""
    page = httpx.get(f"{server.rest}/monitoring/prometheus/metrics", timeout=10.0).text
    prefix = f":tensorflow:serving:batching_session:{name}"
    values = {
        match[1]: int(float(match[2]))
        for match in re.finditer(rf'^{prefix}_bucket{{le="([^"]+)"}} (\S+)$', page, re.MULTILINE)
    }
    for key in ("sum", "count"):
        found = re.search(rf"^{prefix}_{key}{{}} (\S+)$", page, re.MULTILINE)
        values[key] = int(float(found[1])) if found else 0
    return values


def test_requests_larger_than_max_execution_batch_size_are_split_row_exactly(
    splitting_server: Server,
) -> None:
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    xs = [0.25 * i for i in range(10)]  # 10 rows: parts of 4, 4 and 2
    response = httpx.post(
        f"{splitting_server.rest}/v1/models/half_plus_two:predict",
        json={"instances": xs},
        timeout=30.0,
    )
    assert response.status_code == 200, response.text
    assert response.json() == {"predictions": [0.5 * x + 2 for x in xs]}
    with grpc.insecure_channel(splitting_server.grpc_target) as channel:
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "half_plus_two"
        request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array(xs[::-1], np.float32)))
        reply = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(
            request, timeout=30.0
        )
    np.testing.assert_array_equal(
        tf.make_ndarray(reply.outputs["y"]), [0.5 * x + 2 for x in xs[::-1]]
    )
    processed = _histogram(splitting_server, "processed_batch_size")
    # Each 10-row request ran as batches of 4, 4 and 2 rows: none above the limit.
    assert (processed["count"], processed["sum"]) == (6, 20)
    assert processed[str(SPLIT_MAX_EXECUTION_BATCH_SIZE)] == processed["+Inf"] == 6
    inputs = _histogram(splitting_server, "input_batch_size")
    assert (inputs["count"], inputs["sum"], inputs["8"], inputs["16"]) == (2, 20, 0, 2)
    # max_batch_size still bounds one request.
    response = httpx.post(
        f"{splitting_server.rest}/v1/models/half_plus_two:predict",
        json={"instances": [1.0] * 65},
        timeout=30.0,
    )
    assert response.status_code == 400
    assert response.json() == {"error": "Task size 65 is larger than maximum input batch size 64"}
