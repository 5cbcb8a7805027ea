"""What the OIP front refuses itself, with its own message, and what it must serve: values beyond
their datatype's range, a shape with no elements, a large request under `OIP__MAX_BODY_BYTES`.
Both tiers as real processes (`oip_stack`: the API calling serving over gRPC and over REST)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest

from api.protos.inference import open_inference_grpc_pb2 as pb
from api.protos.inference import open_inference_grpc_pb2_grpc as pb_grpc
from api.serving_client._tf_messages import without_graph_internals
from tests.oip.conftest import OipStack, start_oip_api
from tests.oip.dtypes_model import ECHO_DTYPES, NOT_OVER_REST
from tests.support import start_example_serving

# The echo signature's input name -> its OIP datatype and two in-range values (one [1, 2] row).
ECHO: dict[str, tuple[str, list[Any]]] = {
    "bool": ("BOOL", [True, False]), "uint8": ("UINT8", [0, 255]), "uint16": ("UINT16", [0, 65535]),
    "uint32": ("UINT32", [0, 2**32 - 1]), "uint64": ("UINT64", [0, 2**64 - 1]), "int8": ("INT8", [-128, 127]),
    "int16": ("INT16", [-(2**15), 2**15 - 1]), "int32": ("INT32", [-(2**31), 2**31 - 1]),
    "int64": ("INT64", [-(2**63), 2**63 - 1]), "half": ("FP16", [65504.0, -1.5]),
    "float": ("FP32", [3.4028234e38, -1.0]), "double": ("FP64", [1e300, -1e-300]), "string": ("BYTES", ["a", ""]),
    "bfloat16": ("BF16", [3.3895313892515355e38, 1.0]),
}  # fmt: skip
assert ECHO.keys() == ECHO_DTYPES.keys()
# TensorFlow's own words for its graph, which must never reach a client.
GRAPH_TEXT = re.compile(r"\{\{node|\[\[node|Detected at node|\{\{function_node|\[Op:")


def _signature(stack: OipStack) -> str:
    return "echo" if stack.protocol == "grpc" else "echo_rest"


def _echo(stack: OipStack, **overrides: Any) -> httpx.Response:
    """The echo signature called with every input in range but `overrides` (name -> values)."""
    names = [n for n in ECHO if stack.protocol == "grpc" or n not in NOT_OVER_REST]
    inputs = [
        {"name": n, "datatype": ECHO[n][0], "shape": [1, 2], "data": overrides.get(n, ECHO[n][1])} for n in names
    ]
    body = json.dumps({"parameters": {"signature_name": _signature(stack)}, "inputs": inputs})
    return httpx.post(f"{stack.rest}/v2/models/dtypes/infer", content=body, timeout=30)


def _fraud(stack: OipStack, body: bytes | str) -> httpx.Response:
    return httpx.post(f"{stack.rest}/v2/models/fraud/infer", content=body, timeout=60)


def test_in_range_values_of_every_datatype_are_served(oip_stack: OipStack) -> None:
    answer = _echo(oip_stack)
    assert answer.status_code == 200, answer.text
    outputs = {o["name"]: o["data"] for o in answer.json()["outputs"]}
    assert outputs["double_out"] == [1e300, -1e-300]  # FP64 is JSON's own range
    assert outputs["int64_out"] == [-(2**63), 2**63 - 1] and outputs["uint8_out"] == [0, 255]
    assert np.float32(outputs["float_out"][0]) == np.float32(3.4028234e38)  # FP32's largest, not inf


@pytest.mark.parametrize(
    ("name", "value", "range_text"),
    [
        ("float", 1e39, "FP32's range [-3.4028235e+38, 3.4028235e+38]"),
        ("float", -3.5e38, "FP32's range"),
        ("half", 70000.0, "FP16's range [-65504, 65504]"),
        ("bfloat16", 3.4e38, "BF16's range [-3.3895314e+38, 3.3895314e+38]"),
        ("int64", 2**63, "INT64's range [-9223372036854775808, 9223372036854775807]"),
        ("int32", 2**31, "INT32's range [-2147483648, 2147483647]"),
        ("uint8", -1, "UINT8's range [0, 255]"),
        ("uint8", 300, "UINT8's range [0, 255]"),
        ("uint64", 2**64, "UINT64's range [0, 18446744073709551615]"),  # beyond 64 bits: a double in JSON
    ],
)
def test_a_value_beyond_its_datatypes_range_is_refused_naming_the_range(
    oip_stack: OipStack, name: str, value: float, range_text: str
) -> None:
    if oip_stack.protocol == "rest" and name in NOT_OVER_REST:
        pytest.skip(f"echo_rest has no {name} input")
    answer = _echo(oip_stack, **{name: [value, ECHO[name][1][1]]})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert f"input '{name}'" in error and "out of " + range_text in error, error
    assert "integer" not in error, error


def test_non_finite_literals_stay_refused_as_not_json(oip_stack: OipStack) -> None:
    # JSON has no NaN or Infinity; the front's parser refuses them, as it always has.
    for token in ("NaN", "Infinity", "-Infinity"):
        data = "[" + ", ".join([token] + ["0"] * 10) + "]"
        tensor = '{"name": "features", "shape": [1, 11], "datatype": "FP32", "data": ' + data + "}"
        answer = _fraud(oip_stack, '{"inputs": [' + tensor + "]}")
        assert answer.status_code == 400 and "not JSON" in answer.json()["error"], answer.text


def test_a_grpc_typed_integer_beyond_its_datatype_is_refused_naming_the_range(oip_stack: OipStack) -> None:
    request = pb.ModelInferRequest(model_name="dtypes")
    request.parameters["signature_name"].string_param = _signature(oip_stack)
    # uint8's typed contents are uint_contents, 32 bits wide: 300 fits the field, not UINT8.
    tensor = request.inputs.add(name="uint8", datatype="UINT8", shape=[1, 2])
    tensor.contents.uint_contents.extend([300, 1])
    with grpc.insecure_channel(oip_stack.grpc) as channel, pytest.raises(grpc.RpcError) as refused:
        pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "out of UINT8's range [0, 255]" in (refused.value.details() or ""), refused.value.details()


@pytest.mark.parametrize("shape", [[0, 11], [0]])
def test_an_empty_batch_is_refused_by_the_api_in_its_own_words(oip_stack: OipStack, shape: list[int]) -> None:
    body = json.dumps({"inputs": [{"name": "features", "shape": shape, "datatype": "FP32", "data": []}]})
    answer = _fraud(oip_stack, body)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    if shape == [0, 11]:
        assert "batch dimension included, must be at least 1" in error and "features" in error, error
    assert not GRAPH_TEXT.search(error) and "serving tier" not in error, error
    message = pb.ModelInferRequest(model_name="fraud")
    message.inputs.add(name="features", datatype="FP32", shape=[0, 11])
    with grpc.insecure_channel(oip_stack.grpc) as channel, pytest.raises(grpc.RpcError) as refused:
        pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(message, timeout=30)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "must be at least 1" in (refused.value.details() or "")


def test_serving_s_tensorflow_text_is_told_without_graph_internals(oip_stack: OipStack) -> None:
    # What serving itself answers a row of 2 features where the graph takes 11 (TF Serving leaves
    # shapes to the graph): TensorFlow's kernel error with its graph in it, which the serving
    # client keeps from the API's callers.
    direct = httpx.post(
        f"{oip_stack.serving.rest_url}/v1/models/fraud:predict", json={"inputs": {"features": [[1.0, 2.0]]}}, timeout=30
    )
    assert direct.status_code == 400, direct.text
    raw = direct.json()["error"]
    assert GRAPH_TEXT.search(raw), raw
    told = without_graph_internals(raw)
    assert told and not GRAPH_TEXT.search(told), (raw, told)


def test_a_request_under_the_oip_body_limit_is_served_however_large_its_predict_json(oip_stack: OipStack) -> None:
    # 2.2 MB of v2 JSON (fraud rows), over serving's old 1 MiB REST body limit, under the API's 4 MiB.
    rng = np.random.default_rng(5)
    rows = rng.random((16_000, 11), dtype=np.float32)
    body = json.dumps({"inputs": [{"name": "features", "shape": list(rows.shape), "datatype": "FP32",
                                   "data": rows.ravel().tolist()}]})  # fmt: skip
    assert 2_000_000 < len(body) < 4 * 1024 * 1024
    answer = _fraud(oip_stack, body)
    assert answer.status_code == 200, answer.text[:500]
    (output,) = answer.json()["outputs"]
    assert output["shape"] == [16_000, 1] and all(0.0 <= v <= 1.0 for v in output["data"])
    # The same rows as binary data: 704 KB of body, some 4 MB as TF Serving's Predict JSON.
    header = json.dumps({"inputs": [{"name": "features", "shape": list(rows.shape), "datatype": "FP32",
                                     "parameters": {"binary_data_size": rows.nbytes}}]}).encode()  # fmt: skip
    binary = httpx.post(
        f"{oip_stack.rest}/v2/models/fraud/infer",
        content=header + rows.tobytes(),
        headers={"inference-header-content-length": str(len(header))},
        timeout=60,
    )
    assert binary.status_code == 200, binary.text[:500]
    np.testing.assert_allclose(binary.json()["outputs"][0]["data"], output["data"], rtol=1e-6)


def test_a_predict_over_a_lowered_serving_body_limit_is_answered_413(tmp_path: Path) -> None:
    # Serving's REST body limit lowered below what OIP__MAX_BODY_BYTES lets in: the API answers
    # the request as too large (413, as its own body limit), not with serving's 400.
    serving = start_example_serving(tmp_path, rest_api_max_body_bytes=64 * 1024)
    try:
        serving.wait_available("fraud")
        api, rest, _ = start_oip_api(serving, tmp_path / "api.log", "rest")
        try:
            rows = np.full((2_000, 11), 0.125, np.float32)
            body = json.dumps({"inputs": [{"name": "features", "shape": list(rows.shape), "datatype": "FP32",
                                           "data": rows.ravel().tolist()}]})  # fmt: skip
            assert 64 * 1024 < len(body) < 4 * 1024 * 1024
            answer = httpx.post(f"{rest}/v2/models/fraud/infer", content=body, timeout=30)
            assert answer.status_code == 413, answer.text
            assert "OIP__MAX_BODY_BYTES" in answer.json()["error"] and "too large" in answer.json()["error"]
            one_row = {"inputs": [{"name": "features", "shape": [1, 11], "datatype": "FP32", "data": [0.125] * 11}]}
            small = httpx.post(f"{rest}/v2/models/fraud/infer", json=one_row, timeout=30)
            assert small.status_code == 200, small.text
        finally:
            api.stop()
    finally:
        serving.stop()
