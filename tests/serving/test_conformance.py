"""Conformance: ``python -m serving`` gives TF Serving's documented answers, REST and gRPC.

One real server process for the module (loopback, free ports, readiness polled, SIGTERM at the
end) serves TF Serving's classic test models, exported by :mod:`tf_serving_testdata`:
half_plus_two (predict, regress and classify signatures parsing tf.Example), a two-version copy
with labels, and the counter model. gRPC calls go through the official ``tensorflow-serving-api``
stubs; expected answers and messages are those of TF Serving's REST API doc, its
``tensorflow_model_server_test.py`` and its C++ sources (quoted where they are asserted).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    inference_pb2,
    model_management_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)

from tests.serving.serving_testlib import start_test_serving
from tests.serving.tf_serving_testdata import HALF_PLUS_TWO_VERSION, classic_models_config, export_testdata
from tests.support import Process

READY_DEADLINE_S = 120.0
RPC_TIMEOUT_S = 10.0
MODELS = ("half_plus_two", "half_plus_two_versions", "counter", "half_plus_two_tf2")
CLASSIFY = "tensorflow/serving/classify"
REGRESS = "tensorflow/serving/regress"
INVALID_ARGUMENT = grpc.StatusCode.INVALID_ARGUMENT


@dataclass
class Server:
    proc: Process
    rest: httpx.Client
    channel: grpc.Channel
    predict: prediction_service_pb2_grpc.PredictionServiceStub
    model: model_service_pb2_grpc.ModelServiceStub
    config_text: str


def _all_available(rest: httpx.Client) -> bool:
    try:
        statuses = [rest.get(f"/v1/models/{name}").json() for name in MODELS]
    except (httpx.HTTPError, ValueError):
        return False
    return all(
        "model_version_status" in status
        and all(v["state"] == "AVAILABLE" for v in status["model_version_status"])
        for status in statuses
    ) and len(statuses[1]["model_version_status"]) == 2


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = export_testdata(tmp_path_factory.mktemp("testdata"))
    workdir = tmp_path_factory.mktemp("conformance")
    config_text = classic_models_config(root)
    config = workdir / "models.config"
    config.write_text(config_text)
    # The config labels versions that are not loaded yet at start-up (a TF Serving trap).
    serving = start_test_serving(config, workdir / "server.log", allow_version_labels_for_unavailable_models=True)
    proc = serving.process
    rest = httpx.Client(base_url=serving.rest_url, timeout=RPC_TIMEOUT_S)
    # Clients of large responses raise their own receive limit (gRPC's default is 4 MB).
    channel = grpc.insecure_channel(serving.grpc_target, options=[("grpc.max_receive_message_length", -1)])
    try:
        proc.wait_ready(lambda: _all_available(rest), READY_DEADLINE_S, "models")
        grpc.channel_ready_future(channel).result(timeout=RPC_TIMEOUT_S)
        yield Server(
            proc,
            rest,
            channel,
            prediction_service_pb2_grpc.PredictionServiceStub(channel),
            model_service_pb2_grpc.ModelServiceStub(channel),
            config_text,
        )
    finally:
        channel.close()
        rest.close()
        proc.stop()


def _rpc_error(call: Any, request: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=RPC_TIMEOUT_S)
    return info.value


def _predict_request(model: str, x: Any, **spec: Any) -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    for key, value in spec.items():
        if key == "version":
            request.model_spec.version.value = value
        else:
            setattr(request.model_spec, key, value)
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.asarray(x, np.float32)))
    return request


def _examples(*xs: float, feature: str = "x") -> Any:
    input_proto = classification_pb2.ClassificationRequest().input
    for x in xs:
        input_proto.example_list.examples.add().features.feature[feature].float_list.value.append(x)
    return input_proto


# ---- REST: the examples of TF Serving's REST API doc and README -----------------------------


def test_rest_predict_doc_example(server: Server) -> None:
    response = server.rest.post(
        "/v1/models/half_plus_two:predict", json={"instances": [1.0, 2.0, 5.0]}
    )
    assert response.status_code == 200
    assert response.json() == {"predictions": [2.5, 3.0, 4.5]}
    response = server.rest.post(
        "/v1/models/half_plus_two:predict", json={"inputs": {"x": [[1.0], [2.0]]}}
    )
    assert response.json() == {"outputs": [[2.5], [3.0]]}


def test_rest_classify_and_regress_tf_serving_test_answers(server: Server) -> None:
    # tensorflow_model_server_test.py: testClassifyREST / testRegressREST.
    body = {"signature_name": "classify_x_to_y", "examples": [{"x": 2.0}]}
    response = server.rest.post("/v1/models/half_plus_two:classify", json=body)
    assert response.status_code == 200
    assert response.json() == {"results": [[["", 3.0]]]}
    body = {"signature_name": "regress_x_to_y", "examples": [{"x": 2.0}]}
    response = server.rest.post("/v1/models/half_plus_two:regress", json=body)
    assert response.json() == {"results": [3.0]}


def test_rest_classify_labels_scores_and_batches(server: Server) -> None:
    body = {
        "signature_name": "classify_x_to_classes_and_scores",
        "examples": [{"x": 2.0}, {"x": [4.0]}],
    }
    response = server.rest.post("/v1/models/half_plus_two:classify", json=body)
    assert response.json() == {
        "results": [[["y", 3.0], ["y2", 4.0]], [["y", 4.0], ["y2", 5.0]]]
    }


def test_rest_regress_context_is_merged_into_every_example(server: Server) -> None:
    # regress_x_to_y2 reads x (from the context here): y2 = 0.5 * 2 + 3 for both examples.
    body = {
        "signature_name": "regress_x_to_y2",
        "context": {"x": 2.0},
        "examples": [{"x2": 1.0}, {"x2": 4.0}],
    }
    response = server.rest.post("/v1/models/half_plus_two:regress", json=body)
    assert response.json() == {"results": [4.0, 4.0]}
    # An example's own feature wins over the context's.
    body["examples"] = [{"x": 4.0}, {"x2": 1.0}]
    response = server.rest.post("/v1/models/half_plus_two:regress", json=body)
    assert response.json() == {"results": [5.0, 4.0]}


def test_rest_classify_versions_and_labels(server: Server) -> None:
    body = {"signature_name": "classify_x_to_y", "examples": [{"x": 2.0}]}
    for path, score in (
        ("/v1/models/half_plus_two_versions", 4.0),  # latest: version 2, 0.5x + 3
        ("/v1/models/half_plus_two_versions/versions/1", 3.0),
        ("/v1/models/half_plus_two_versions/labels/stable", 3.0),
        ("/v1/models/half_plus_two_versions/labels/canary", 4.0),
    ):
        response = server.rest.post(f"{path}:classify", json=body)
        assert response.json() == {"results": [[["", score]]]}, path


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        # FillClassifyRegressRequestFromJson: JSON errors come before the model lookup.
        (
            {"signature_name": "regress_x_to_y"},
            400,
            "When method is classify, key 'examples' is expected and was not found",
        ),
        ({"examples": []}, 400, "'examples' value is an empty array"),
        ({"examples": {"x": 1.0}}, 400, "Expecting 'examples' value to be an list/array"),
        ({"examples": [[1.0]]}, 400, "Example must be JSON object but got JSON Array"),
        (
            {"examples": [{"x": None}]},
            400,
            "Feature: x has element with unexpected JSON type: Null",
        ),
        (
            {"examples": [{"x": [[1.0]]}]},
            400,
            "Feature: x has element with unexpected JSON type: Array",
        ),
        (
            {"examples": [{"x": [1.0, "a"]}]},
            400,
            "Unexpected element type in feature: x expecting type: float",
        ),
        (
            {"examples": [{"x": 2**63}]},
            400,
            "Feature: x has uint64_t element. Only int64_t is supported.",
        ),
        ({"context": [], "examples": [{"x": 1.0}]}, 400, "Example must be JSON object"),
    ],
)
def test_rest_example_json_errors(
    server: Server, body: dict[str, Any], status: int, message: str
) -> None:
    response = server.rest.post("/v1/models/nope:regress", json=body)
    assert response.status_code == status
    assert message in response.json()["error"]


def test_rest_classify_regress_errors_after_parsing(server: Server) -> None:
    examples = [{"x": 2.0}]
    response = server.rest.post("/v1/models/nope:classify", json={"examples": examples})
    assert response.status_code == 404
    assert response.json() == {"error": "Servable not found for request: Latest(nope)"}
    body = {"signature_name": "nope", "examples": examples}
    response = server.rest.post("/v1/models/half_plus_two:classify", json=body)
    assert (response.status_code, response.json()) == (
        400,
        {"error": "No signature was found with the name: nope"},
    )
    # No method-name check by default: the predict signature fails on its layout.
    response = server.rest.post("/v1/models/half_plus_two:regress", json={"examples": examples})
    assert response.status_code == 400
    assert response.json()["error"].startswith("No regression inputs found in SignatureDef: ")
    # The int64 trap: {"x": 2} is an int64 feature, the model parses x as float.
    body = {"signature_name": "regress_x_to_y", "examples": [{"x": 2}]}
    response = server.rest.post("/v1/models/half_plus_two:regress", json=body)
    assert response.status_code == 400
    assert "Data types don't match" in response.json()["error"]
    # A signature whose input is a float tensor cannot take Examples (TensorFlow's error).
    body = {"signature_name": "classify_x2_to_y3", "examples": examples}
    response = server.rest.post("/v1/models/half_plus_two:classify", json=body)
    assert response.status_code == 400
    assert "Type mismatch: actual string vs. expect float" in response.json()["error"]


# ---- gRPC: PredictionService.Predict --------------------------------------------------------


def test_grpc_predict(server: Server) -> None:
    # tensorflow_model_server_test.py: VerifyPredictRequest reads outputs["y"].float_val.
    request = _predict_request("half_plus_two", [[2.0]])
    request.output_filter.append("y")
    response = server.predict.Predict(request, timeout=RPC_TIMEOUT_S)
    assert response.outputs["y"].dtype == tf.float32.as_datatype_enum
    assert list(response.outputs["y"].float_val) == [3.0]
    assert response.model_spec.name == "half_plus_two"
    assert response.model_spec.signature_name == "serving_default"
    assert response.model_spec.version.value == HALF_PLUS_TWO_VERSION
    # Inputs in tensor_content (tf.make_tensor_proto's choice) or in typed fields.
    request = _predict_request("half_plus_two", [[1.0], [2.0], [5.0]])
    assert request.inputs["x"].tensor_content
    response = server.predict.Predict(request, timeout=RPC_TIMEOUT_S)
    np.testing.assert_array_equal(tf.make_ndarray(response.outputs["y"]), [[2.5], [3.0], [4.5]])
    request.inputs["x"].ClearField("tensor_content")
    request.inputs["x"].ClearField("float_val")
    request.inputs["x"].float_val.extend([1.0, 2.0, 5.0])
    response = server.predict.Predict(request, timeout=RPC_TIMEOUT_S)
    np.testing.assert_array_equal(tf.make_ndarray(response.outputs["y"]), [[2.5], [3.0], [4.5]])


def test_grpc_predict_typed_field_shorter_than_shape_repeats_last_value(server: Server) -> None:
    # TensorFlow's Tensor::FromProto: a short typed field is padded with its last value.
    request = _predict_request("half_plus_two", [[0.0]])
    tensor = request.inputs["x"]
    tensor.ClearField("tensor_content")
    tensor.ClearField("float_val")
    tensor.tensor_shape.dim[0].size = 3
    tensor.float_val.append(2.0)
    response = server.predict.Predict(request, timeout=RPC_TIMEOUT_S)
    np.testing.assert_array_equal(tf.make_ndarray(response.outputs["y"]), [[3.0]] * 3)


def test_grpc_predict_versions_and_labels(server: Server) -> None:
    cases: list[tuple[dict[str, Any], float, int]] = [
        ({}, 4.0, 2),
        ({"version": 1}, 3.0, 1),
        ({"version": 2}, 4.0, 2),
        ({"version_label": "stable"}, 3.0, 1),
        ({"version_label": "canary"}, 4.0, 2),
    ]
    for spec, y, version in cases:
        request = _predict_request("half_plus_two_versions", [[2.0]], **spec)
        response = server.predict.Predict(request, timeout=RPC_TIMEOUT_S)
        assert list(response.outputs["y"].float_val) == [y], spec
        assert response.model_spec.version.value == version, spec


@pytest.mark.parametrize(
    ("spec", "code", "message"),
    [
        (
            {"name": "nope"},
            grpc.StatusCode.NOT_FOUND,
            "Servable not found for request: Latest(nope)",
        ),
        (
            {"name": "half_plus_two", "version": 99},
            grpc.StatusCode.NOT_FOUND,
            "Servable not found for request: Specific(half_plus_two, 99)",
        ),
        (
            # ServerCore::GetModelVersionForLabel answers INVALID_ARGUMENT, not NOT_FOUND.
            {"name": "half_plus_two_versions", "version_label": "nope"},
            grpc.StatusCode.INVALID_ARGUMENT,
            "Unrecognized servable version label: nope",
        ),
        (
            {"name": "half_plus_two", "signature_name": "nope"},
            grpc.StatusCode.FAILED_PRECONDITION,
            'Serving signature key "nope" not found.',
        ),
    ],
)
def test_grpc_predict_lookup_errors(
    server: Server, spec: dict[str, Any], code: grpc.StatusCode, message: str
) -> None:
    request = _predict_request(spec.pop("name"), [[1.0]], **spec)
    error = _rpc_error(server.predict.Predict, request)
    assert (error.code(), error.details()) == (code, message)


def test_grpc_predict_input_errors(server: Server) -> None:
    request = predict_pb2.PredictRequest()
    error = _rpc_error(server.predict.Predict, request)
    assert (error.code(), error.details()) == (INVALID_ARGUMENT, "Missing ModelSpec")

    request.model_spec.name = "half_plus_two"
    error = _rpc_error(server.predict.Predict, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == (
        "input size does not match signature: 0!=1 len({}) != len({x}). "
        "Sent extra: {}. Missing but required: {x}."
    )

    request = _predict_request("half_plus_two", [[1.0]])
    request.inputs["x"].tensor_content = b"\x00" * 3  # not 4 bytes per float
    error = _rpc_error(server.predict.Predict, request)
    assert (error.code(), error.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "tensor parsing error: x",
    )

    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([[1]], np.int32)))
    error = _rpc_error(server.predict.Predict, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().startswith("Type mismatch: actual int32 vs. expect float")

    request = _predict_request("half_plus_two", [[1.0]])
    request.output_filter.append("z")
    error = _rpc_error(server.predict.Predict, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().startswith("output tensor alias not found in signature: z")


def test_grpc_predict_message_larger_than_4mb(server: Server) -> None:
    x = np.arange(2_000_000, dtype=np.float32).reshape(-1, 1)  # 8 MB in, 8 MB out
    request = _predict_request("half_plus_two", x)
    assert request.ByteSize() > 4 * 1024 * 1024
    response = server.predict.Predict(request, timeout=60)
    y = tf.make_ndarray(response.outputs["y"])
    np.testing.assert_array_equal(y, 0.5 * x + 2.0)


def test_grpc_counter_model(server: Server) -> None:
    def call(signature: str, **inputs: float) -> float:
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "counter"
        request.model_spec.signature_name = signature
        for name, value in inputs.items():
            request.inputs[name].CopyFrom(tf.make_tensor_proto(value, dtype=tf.float32))
        response = server.predict.Predict(request, timeout=RPC_TIMEOUT_S)
        return float(tf.make_ndarray(response.outputs["output"]))

    assert call("reset_counter") == 0.0
    assert call("incr_counter") == 1.0
    assert call("incr_counter") == 2.0
    assert call("incr_counter_by", delta=3.0) == 5.0
    assert call("get_counter") == 5.0
    assert call("reset_counter") == 0.0
    assert call("get_counter") == 0.0


# ---- gRPC: Classify, Regress, MultiInference --------------------------------------------------


def test_grpc_classify_and_regress(server: Server) -> None:
    # tensorflow_model_server_test.py: testClassify / testRegress.
    request = classification_pb2.ClassificationRequest()
    request.model_spec.name = "half_plus_two"
    request.model_spec.signature_name = "classify_x_to_y"
    request.input.CopyFrom(_examples(2.0))
    response = server.predict.Classify(request, timeout=RPC_TIMEOUT_S)
    assert len(response.result.classifications) == 1
    assert [(c.label, c.score) for c in response.result.classifications[0].classes] == [("", 3.0)]
    assert response.model_spec.name == "half_plus_two"
    assert response.model_spec.signature_name == "classify_x_to_y"
    assert response.model_spec.version.value == HALF_PLUS_TWO_VERSION

    regress = regression_pb2.RegressionRequest()
    regress.model_spec.name = "half_plus_two"
    regress.model_spec.signature_name = "regress_x_to_y"
    regress.input.CopyFrom(_examples(2.0, 4.0))
    response = server.predict.Regress(regress, timeout=RPC_TIMEOUT_S)
    assert [r.value for r in response.result.regressions] == [3.0, 4.0]
    assert response.model_spec.signature_name == "regress_x_to_y"


def test_grpc_classify_labels_and_context(server: Server) -> None:
    request = classification_pb2.ClassificationRequest()
    request.model_spec.name = "half_plus_two"
    request.model_spec.signature_name = "classify_x_to_classes_and_scores"
    with_context = request.input.example_list_with_context
    with_context.context.features.feature["x"].float_list.value.append(2.0)
    with_context.examples.add()  # only the context's x
    with_context.examples.add().features.feature["x"].float_list.value.append(4.0)
    response = server.predict.Classify(request, timeout=RPC_TIMEOUT_S)
    got = [[(c.label, c.score) for c in row.classes] for row in response.result.classifications]
    assert got == [[("y", 3.0), ("y2", 4.0)], [("y", 4.0), ("y2", 5.0)]]


def test_grpc_classify_regress_errors(server: Server) -> None:
    request = classification_pb2.ClassificationRequest()
    error = _rpc_error(server.predict.Classify, request)
    assert (error.code(), error.details()) == (INVALID_ARGUMENT, "Missing ModelSpec")
    request.model_spec.name = "half_plus_two"
    request.model_spec.signature_name = "classify_x_to_y"
    error = _rpc_error(server.predict.Classify, request)  # no examples
    assert (error.code(), error.details()) == (grpc.StatusCode.INVALID_ARGUMENT, "Input is empty.")
    request.model_spec.signature_name = "nope"
    request.input.CopyFrom(_examples(1.0))
    error = _rpc_error(server.predict.Classify, request)
    assert (error.code(), error.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "No signature was found with the name: nope",
    )
    regress = regression_pb2.RegressionRequest()
    regress.model_spec.name = "half_plus_two"
    regress.model_spec.signature_name = "classify_x_to_y"  # a classify signature
    regress.input.CopyFrom(_examples(1.0))
    error = _rpc_error(server.predict.Regress, regress)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().startswith("No regression outputs found in SignatureDef: ")
    regress.model_spec.name = "nope"
    error = _rpc_error(server.predict.Regress, regress)
    assert (error.code(), error.details()) == (
        grpc.StatusCode.NOT_FOUND,
        "Servable not found for request: Latest(nope)",
    )


def _multi_inference(*tasks: tuple[str, str, str]) -> inference_pb2.MultiInferenceRequest:
    request = inference_pb2.MultiInferenceRequest()
    for model, signature, method in tasks:
        task = request.tasks.add()
        task.model_spec.name = model
        task.model_spec.signature_name = signature
        task.method_name = method
    request.input.CopyFrom(_examples(2.0))
    return request




def test_grpc_multi_inference(server: Server) -> None:
    # tensorflow_model_server_test.py: testMultiInference.
    request = _multi_inference(
        ("half_plus_two", "regress_x_to_y", REGRESS),
        ("half_plus_two", "classify_x_to_y", CLASSIFY),
    )
    response = server.predict.MultiInference(request, timeout=RPC_TIMEOUT_S)
    assert len(response.results) == 2
    assert [r.value for r in response.results[0].regression_result.regressions] == [3.0]
    classes = response.results[1].classification_result.classifications[0].classes
    assert [c.score for c in classes] == [3.0]
    assert [r.model_spec.signature_name for r in response.results] == [
        "regress_x_to_y",
        "classify_x_to_y",
    ]


@pytest.mark.parametrize(
    ("tasks", "code", "message"),
    [
        (
            [("half_plus_two", "regress_x_to_y", REGRESS), ("counter", "x", REGRESS)],
            grpc.StatusCode.INVALID_ARGUMENT,
            "All ModelSpecs in a MultiInferenceRequest must access the same model name.",
        ),
        (
            [
                ("half_plus_two", "regress_x_to_y", REGRESS),
                ("half_plus_two", "regress_x_to_y", REGRESS),
            ],
            grpc.StatusCode.INVALID_ARGUMENT,
            "Duplicate evaluation of signature: regress_x_to_y",
        ),
        (
            [("half_plus_two", "nope", REGRESS)],
            grpc.StatusCode.INVALID_ARGUMENT,
            "Requested signature not found in model graph: nope",
        ),
        (
            [("half_plus_two", "regress_x_to_y", "tensorflow/serving/predict")],
            grpc.StatusCode.UNIMPLEMENTED,
            "Unsupported signature method_name: tensorflow/serving/predict",
        ),
    ],
)
def test_grpc_multi_inference_errors(
    server: Server, tasks: list[tuple[str, str, str]], code: grpc.StatusCode, message: str
) -> None:
    error = _rpc_error(server.predict.MultiInference, _multi_inference(*tasks))
    assert (error.code(), error.details()) == (code, message)


@pytest.mark.parametrize(
    ("tasks", "expected"),
    [
        # multi_inference_test.cc MultipleValidRegressSignaturesTest (y = 0.5x + 2, y2 = 0.5x + 3).
        ((("regress_x_to_y", REGRESS), ("regress_x_to_y2", REGRESS)), [[3.0], [4.0]]),
        # RegressAndClassifySignaturesTest: a regression and a classification score.
        ((("regress_x_to_y", REGRESS), ("classify_x_to_y", CLASSIFY)), [[3.0], [3.0]]),
    ],
)
def test_grpc_multi_inference_tf2(
    server: Server, tasks: tuple[tuple[str, str], ...], expected: list[list[float]]
) -> None:
    # tensorflow_model_server_test.py testMultiInferenceTf2 and multi_inference_test.cc with
    # tf2_model_t: every signature of a TF2 export has its own input placeholder; the Examples
    # are fed to each (PerformOneShotTensorComputation with a set of input tensor names).
    request = _multi_inference(*(("half_plus_two_tf2", sig, method) for sig, method in tasks))
    response = server.predict.MultiInference(request, timeout=RPC_TIMEOUT_S)
    values = [
        [r.value for r in result.regression_result.regressions]
        or [c.score for c in result.classification_result.classifications[0].classes]
        for result in response.results
    ]
    assert values == expected
    assert [r.model_spec.signature_name for r in response.results] == [sig for sig, _ in tasks]
    assert [r.model_spec.version.value for r in response.results] == [1, 1]


def test_grpc_multi_inference_examples_fed_to_a_float_input_fail_in_tensorflow(
    server: Server,
) -> None:
    # regress_x2_to_y3's input is a float tensor: the Examples fed to it fail in the run
    # (TF Serving refused it before running, until its input-tensor-set change).
    tasks = [("half_plus_two", "regress_x_to_y", REGRESS), ("half_plus_two", "regress_x2_to_y3", REGRESS)]
    error = _rpc_error(server.predict.MultiInference, _multi_inference(*tasks))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "string" in error.details()


# ---- gRPC: metadata, status, config reload -----------------------------------------------------


def test_grpc_get_model_metadata(server: Server) -> None:
    request = get_model_metadata_pb2.GetModelMetadataRequest()
    request.model_spec.name = "half_plus_two"
    request.metadata_field.append("signature_def")
    response = server.predict.GetModelMetadata(request, timeout=RPC_TIMEOUT_S)
    assert response.model_spec.name == "half_plus_two"
    assert response.model_spec.version.value == HALF_PLUS_TWO_VERSION
    packed = response.metadata["signature_def"]
    assert packed.type_url == "type.googleapis.com/tensorflow.serving.SignatureDefMap"
    signature_map = get_model_metadata_pb2.SignatureDefMap()
    assert packed.Unpack(signature_map)
    assert set(signature_map.signature_def) == {
        "serving_default",
        "regress_x_to_y",
        "regress_x_to_y2",
        "regress_x2_to_y3",
        "classify_x_to_y",
        "classify_x2_to_y3",
        "classify_x_to_classes_and_scores",
    }
    assert signature_map.signature_def["classify_x_to_y"].method_name == CLASSIFY
    # The same SignatureDefs over REST.
    rest = server.rest.get("/v1/models/half_plus_two/metadata").json()
    assert set(rest["metadata"]["signature_def"]["signature_def"]) == set(
        signature_map.signature_def
    )


def test_grpc_get_model_metadata_errors(server: Server) -> None:
    request = get_model_metadata_pb2.GetModelMetadataRequest()
    error = _rpc_error(server.predict.GetModelMetadata, request)
    assert (error.code(), error.details()) == (INVALID_ARGUMENT, "Missing ModelSpec")
    request.model_spec.name = "half_plus_two"
    error = _rpc_error(server.predict.GetModelMetadata, request)
    assert (error.code(), error.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "GetModelMetadataRequest must specify at least one metadata_field",
    )
    request.metadata_field.append("signature_def")
    request.model_spec.name = "nope"
    error = _rpc_error(server.predict.GetModelMetadata, request)
    assert error.code() == grpc.StatusCode.NOT_FOUND


def test_grpc_error_messages_over_1024_characters_are_truncated(server: Server) -> None:
    # ToGRPCStatus (grpc_status_util.cc): the first 1024 characters, then "...TRUNCATED".
    request = get_model_metadata_pb2.GetModelMetadataRequest()
    request.model_spec.name = "half_plus_two"
    request.metadata_field.append("f" * 2000)
    error = _rpc_error(server.predict.GetModelMetadata, request)
    assert error.code() == INVALID_ARGUMENT
    full = "Metadata field " + "f" * 2000 + " is not supported"
    assert error.details() == full[:1024] + "...TRUNCATED"


def test_grpc_get_model_status(server: Server) -> None:
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = "half_plus_two_versions"
    response = server.model.GetModelStatus(request, timeout=RPC_TIMEOUT_S)
    assert [(s.version, s.state, s.status.error_code) for s in response.model_version_status] == [
        (2, get_model_status_pb2.ModelVersionStatus.AVAILABLE, 0),
        (1, get_model_status_pb2.ModelVersionStatus.AVAILABLE, 0),
    ]
    request.model_spec.version.value = 1
    response = server.model.GetModelStatus(request, timeout=RPC_TIMEOUT_S)
    assert [s.version for s in response.model_version_status] == [1]
    request.model_spec.version.value = 7
    error = _rpc_error(server.model.GetModelStatus, request)
    assert (error.code(), error.details()) == (
        grpc.StatusCode.NOT_FOUND,
        "Could not find version 7 of model half_plus_two_versions",
    )
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = "nope"
    error = _rpc_error(server.model.GetModelStatus, request)
    assert (error.code(), error.details()) == (
        grpc.StatusCode.NOT_FOUND,
        "Could not find any versions of model nope",
    )


def test_grpc_handle_reload_config_request(server: Server) -> None:
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    request = model_management_pb2.ReloadConfigRequest()
    request.config.custom_model_config.SetInParent()
    error = _rpc_error(server.model.HandleReloadConfigRequest, request)
    assert (error.code(), error.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "ServerModelConfig type not supported by HandleReloadConfigRequest. Only "
        "ModelConfigList is currently supported",
    )
    # Reloading the config in force changes nothing and answers OK.
    request = model_management_pb2.ReloadConfigRequest()
    text_format.Parse(server.config_text, request.config)
    assert isinstance(request.config, model_server_config_pb2.ModelServerConfig)
    response = server.model.HandleReloadConfigRequest(request, timeout=60)
    assert response.status.error_code == 0
    response = server.predict.Predict(_predict_request("half_plus_two", [[2.0]]), timeout=10)
    assert list(response.outputs["y"].float_val) == [3.0]


def test_sigterm_exits_zero(server: Server) -> None:
    """Last: SIGTERM drains both front ends and the process exits 0."""
    assert server.proc.stop() == 0
    log = server.proc.log_path.read_text(errors="replace")
    assert "Running gRPC ModelServer at 127.0.0.1:" in log
    assert "Server stopped" in log
