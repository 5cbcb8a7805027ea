"""End to end: ``python -m serving`` records every API's requests as TF Serving does.

One real server (loopback, free ports, readiness polled, SIGTERM at the end) with
``--monitoring_config_file`` serves TF Serving's half_plus_two test model
(:mod:`tf_serving_testdata`: predict, classify and regress signatures). Requests go through REST
(``:predict``, ``:classify``, ``:regress``) and gRPC (``Predict``, ``Classify``, ``Regress``,
``MultiInference``, official stubs); the Prometheus page must then hold exactly what TF Serving
records for them: ``request_count`` and ``request_latency`` per request with TF Serving's ``API``
and ``entrypoint`` labels (none for MultiInference), ``runtime_latency`` per successful Session run
of Predict/Classify/Regress, and MultiInference's example counts.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import httpx
import pytest
from tensorflow_serving.apis import (
    classification_pb2,
    inference_pb2,
    input_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)

from tests.serving.serving_testlib import start_test_serving
from tests.serving.tf_serving_testdata import export_testdata
from tests.support import Process

READY_DEADLINE_S = 120.0
RPC_TIMEOUT_S = 10.0
MODEL = "half_plus_two"
METRICS_PATH = "/monitoring/prometheus/metrics"


@dataclass
class Server:
    proc: Process
    rest: httpx.Client
    stub: prediction_service_pb2_grpc.PredictionServiceStub


def _available(rest: httpx.Client) -> bool:
    try:
        status = rest.get(f"/v1/models/{MODEL}").json()
    except (httpx.HTTPError, ValueError):
        return False
    return any(v["state"] == "AVAILABLE" for v in status.get("model_version_status", []))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = export_testdata(tmp_path_factory.mktemp("testdata"))
    workdir = tmp_path_factory.mktemp("metrics-server")
    config = workdir / "models.config"
    config.write_text(
        f'model_config_list {{ config {{ name: "{MODEL}" base_path: "{root / MODEL}" '
        'model_platform: "tensorflow" } }\n'
    )
    monitoring = workdir / "monitoring.config"
    monitoring.write_text(f'prometheus_config {{ enable: true path: "{METRICS_PATH}" }}\n')
    serving = start_test_serving(config, workdir / "server.log", monitoring_config_file=monitoring)
    proc = serving.process
    rest = httpx.Client(base_url=serving.rest_url, timeout=RPC_TIMEOUT_S)
    channel = grpc.insecure_channel(serving.grpc_target)
    try:
        proc.wait_ready(lambda: _available(rest), READY_DEADLINE_S, MODEL)
        grpc.channel_ready_future(channel).result(timeout=RPC_TIMEOUT_S)
        yield Server(proc, rest, prediction_service_pb2_grpc.PredictionServiceStub(channel))
    finally:
        channel.close()
        rest.close()
        assert proc.stop() == 0, proc.log()


def _examples(*xs: float) -> input_pb2.Input:
    examples = input_pb2.Input()
    for x in xs:
        examples.example_list.examples.add().features.feature["x"].float_list.value.append(x)
    return examples


def _samples(server: Server) -> dict[str, float]:
    """``name{labels}`` -> value, from the served Prometheus page."""
    page = server.rest.get(METRICS_PATH).text
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in page.splitlines()
        if line and not line.startswith("#")
    }


def test_every_api_is_recorded_like_tf_serving(server: Server) -> None:
    rest = server.rest
    # REST: predict, classify, regress (OK), and a regress refused by its signature.
    assert rest.post(f"/v1/models/{MODEL}:predict", json={"instances": [1.0]}).status_code == 200
    body = {"signature_name": "classify_x_to_y", "examples": [{"x": 2.0}]}
    answer = rest.post(f"/v1/models/{MODEL}:classify", json=body).json()
    assert answer == {"results": [[["", 3.0]]]}
    body = {"signature_name": "regress_x_to_y", "examples": [{"x": 2.0}, {"x": 4.0}]}
    assert rest.post(f"/v1/models/{MODEL}:regress", json=body).json() == {"results": [3.0, 4.0]}
    body = {"signature_name": "nope", "examples": [{"x": 2.0}]}
    assert rest.post(f"/v1/models/{MODEL}:regress", json=body).status_code == 400
    # gRPC: Classify, Regress, MultiInference (3 examples).
    classify = classification_pb2.ClassificationRequest(input=_examples(2.0))
    classify.model_spec.name, classify.model_spec.signature_name = MODEL, "classify_x_to_y"
    server.stub.Classify(classify, timeout=RPC_TIMEOUT_S)
    regress = regression_pb2.RegressionRequest(input=_examples(2.0))
    regress.model_spec.name, regress.model_spec.signature_name = MODEL, "regress_x_to_y"
    server.stub.Regress(regress, timeout=RPC_TIMEOUT_S)
    multi = inference_pb2.MultiInferenceRequest(input=_examples(1.0, 2.0, 3.0))
    for signature, method in (
        ("regress_x_to_y", "tensorflow/serving/regress"),
        ("classify_x_to_y", "tensorflow/serving/classify"),
    ):
        task = multi.tasks.add(method_name=method)
        task.model_spec.name, task.model_spec.signature_name = MODEL, signature
    assert len(server.stub.MultiInference(multi, timeout=RPC_TIMEOUT_S).results) == 2

    samples = _samples(server)
    count = ":tensorflow:serving:request_count"
    # 5 successful requests (MultiInference is not one of them in TF Serving), 1 refused.
    assert samples[f'{count}{{model_name="{MODEL}",status="OK"}}'] == 5
    assert samples[f'{count}{{model_name="{MODEL}",status="INVALID_ARGUMENT"}}'] == 1
    latency = {
        key.split("{", 1)[1]: value
        for key, value in samples.items()
        if key.startswith(":tensorflow:serving:request_latency_count{")
    }
    assert latency == {
        f'model_name="{MODEL}",API="predict",entrypoint="REST",status="OK"}}': 1,
        f'model_name="{MODEL}",API="classify",entrypoint="REST",status="OK"}}': 1,
        f'model_name="{MODEL}",API="regress",entrypoint="REST",status="OK"}}': 1,
        f'model_name="{MODEL}",API="regress",entrypoint="REST",status="INVALID_ARGUMENT"}}': 1,
        f'model_name="{MODEL}",API="Classify",entrypoint="GRPC",status="OK"}}': 1,
        f'model_name="{MODEL}",API="Regress",entrypoint="GRPC",status="OK"}}': 1,
    }
    # runtime_latency: the successful Session runs of Predict, Classify and Regress, whatever the
    # front end; the refused regress never ran, MultiInference records none.
    runtime = {
        re.search(r'API="(\w+)"', key)[1]: value  # type: ignore[index]
        for key, value in samples.items()
        if key.startswith(":tensorflow:serving:runtime_latency_count{")
    }
    assert runtime == {"Predict": 1, "Classify": 2, "Regress": 2}
    # MultiInference: its examples (RecordRequestExampleCount), labelled "model".
    assert samples[f':tensorflow:serving:request_example_count_total{{model="{MODEL}"}}'] == 3
    assert samples[f':tensorflow:serving:request_example_counts_count{{model="{MODEL}"}}'] == 1
    assert samples[f':tensorflow:serving:request_example_counts_sum{{model="{MODEL}"}}'] == 3


def test_requests_for_unknown_models_are_counted_under_their_name(server: Server) -> None:
    """TF Serving labels with the request's model name, found or not (REST and gRPC)."""
    body = {"examples": [{"x": 2.0}]}
    assert server.rest.post("/v1/models/nope:classify", json=body).status_code == 404
    response = server.rest.post("/v1/models/nope:predict", json={"instances": [1.0]})
    assert response.status_code == 404
    regress = regression_pb2.RegressionRequest(input=_examples(2.0))
    regress.model_spec.name = "nope"
    with pytest.raises(grpc.RpcError):
        server.stub.Regress(regress, timeout=RPC_TIMEOUT_S)
    samples = _samples(server)
    assert samples[':tensorflow:serving:request_count{model_name="nope",status="NOT_FOUND"}'] == 3
    # (REST predict looks the servable up inside the recorded call, so it counts too.)
    prefix = ':tensorflow:serving:request_latency_count{model_name="nope",'
    assert samples[prefix + 'API="classify",entrypoint="REST",status="NOT_FOUND"}'] == 1
    assert samples[prefix + 'API="predict",entrypoint="REST",status="NOT_FOUND"}'] == 1
    assert samples[prefix + 'API="Regress",entrypoint="GRPC",status="NOT_FOUND"}'] == 1


def test_the_page_names_every_metric_as_tf_serving(server: Server) -> None:
    page = server.rest.get(METRICS_PATH).text
    for metric, kind in [
        (":tensorflow:serving:request_example_counts", "histogram"),
        (":tensorflow:serving:request_example_count_total", "counter"),
        (":tensorflow:serving:model_warmup_latency", "histogram"),
    ]:
        assert f"# TYPE {metric} {kind}\n" in page
