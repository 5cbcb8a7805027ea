"""The OIP front scored by the clients people use, against the running stack, compared with TF Serving.

Clients: Triton's HTTP client (in this process, JSON and binary tensor data), Triton's gRPC client
and KServe's `InferenceRESTClient` / `InferenceGRPCClient` (v2; JSON/typed contents and binary/raw
contents), those three in their own venv (tests/oip/clients.py). Every answer is compared with TF
Serving's own Predict on the same tensors (the official `tensorflow-serving-api` protos, straight to
the serving tier): identical values, element for element and bit for bit. Each test runs once per
protocol between the tiers (`oip_stack`: gRPC, REST).

The inputs are made from each model's OIP metadata (random values of the datatype and shape it
reports, the batch 3), so the metadata is checked by use too.
"""

from __future__ import annotations

from typing import Any

import httpx
import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from tests.oip.clients import decode, encode, run_jobs, serving_predict
from tests.oip.conftest import OipStack

#: OIP datatype -> numpy dtype the clients take it as (BF16: ml_dtypes, as tritonclient wants).
NUMPY: dict[str, Any] = {
    "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
    "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64, "FP16": np.float16,
    "FP32": np.float32, "FP64": np.float64, "BYTES": np.object_, "BF16": ml_dtypes.bfloat16,
}  # fmt: skip
#: What TF Serving's REST API cannot carry as an input (its JSON codec has no such type), so the
#: API calling serving over REST answers them with serving's INVALID_ARGUMENT.
NOT_OVER_REST = {"FP16", "BF16", "UINT16"}
BATCH = 3
SIXTEEN_BIT = ("FP16", "BF16")
REMOTE_CLIENTS = ("triton_grpc", "kserve_rest", "kserve_grpc")


def random_tensor(datatype: str, shape: list[int], rng: np.random.Generator) -> np.ndarray:
    """Random values of `datatype`, -1 dimensions made `BATCH`."""
    dims = [BATCH if d < 0 else d for d in shape]
    if datatype == "BOOL":
        return rng.integers(0, 2, dims).astype(np.bool_)
    if datatype == "BYTES":
        words = [f"w{rng.integers(0, 10**6)}-é".encode() for _ in range(int(np.prod(dims)))]
        return np.array(words, dtype=np.object_).reshape(dims)
    dtype = NUMPY[datatype]
    if datatype in ("FP16", "FP32", "FP64", "BF16"):
        return rng.normal(0.5, 0.3, dims).astype(np.float32).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -(10**6)), min(info.max, 10**6), dims, dtype=dtype)


def same(a: np.ndarray, b: np.ndarray) -> bool:
    """Identical values: equal shapes, equal elements (floats compared bit for bit)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return False
    if a.dtype == np.object_ or b.dtype == np.object_:
        # Triton's HTTP client gives BYTES sent as JSON as str: the UTF-8 of the elements is compared.
        def utf8(x: object) -> bytes:
            return x.encode() if isinstance(x, str) else bytes(x)  # type: ignore[call-overload]

        return [utf8(x) for x in a.ravel()] == [utf8(x) for x in b.ravel()]
    if a.dtype.kind == "f" or b.dtype.kind == "f" or "bfloat16" in (a.dtype.name, b.dtype.name):
        return bool(np.array_equal(a.astype(np.float64), b.astype(np.float64)))
    return bool(np.array_equal(a, b))


def metadata(stack: OipStack, model: str) -> dict[str, Any]:
    return triton_http.InferenceServerClient(stack.http_host).get_model_metadata(model)


def inputs_for(
    stack: OipStack, model: str, seed: int, signature: str | None = None
) -> dict[str, tuple[str, np.ndarray]]:
    """Random inputs for `model` from its OIP metadata: name -> (datatype, array)."""
    url = f"{stack.rest}/v2/models/{model}" + (f"?signature_name={signature}" if signature else "")
    described = httpx.get(url).json()
    rng = np.random.default_rng(seed)
    return {t["name"]: (t["datatype"], random_tensor(t["datatype"], t["shape"], rng)) for t in described["inputs"]}


def tf_serving(
    stack: OipStack, model: str, inputs: dict[str, tuple[str, np.ndarray]], **kw: Any
) -> dict[str, np.ndarray]:
    dtypes = {name: tf.bfloat16 for name, (datatype, _) in inputs.items() if datatype == "BF16"}
    arrays = {name: array for name, (_, array) in inputs.items()}
    return serving_predict(stack.serving.grpc_target, model, arrays, dtypes=dtypes, **kw)


def triton_http_infer(
    stack: OipStack, model: str, inputs: dict[str, tuple[str, np.ndarray]], *, binary: bool,
    outputs: list[str] | None = None, version: str = "", parameters: dict[str, Any] | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    client = triton_http.InferenceServerClient(stack.http_host)
    tensors = []
    for name, (datatype, array) in inputs.items():
        tensor = triton_http.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array, binary_data=binary or datatype in SIXTEEN_BIT)
        tensors.append(tensor)
    sixteen = {f"{n}_out" for n, (d, _) in inputs.items() if d in SIXTEEN_BIT}
    wanted = (
        [triton_http.InferRequestedOutput(n, binary_data=binary or n in sixteen) for n in outputs] if outputs else None
    )
    result = client.infer(
        model, tensors, model_version=version, outputs=wanted, request_id="req-7", parameters=parameters
    )
    response = result.get_response()
    return {o["name"]: result.as_numpy(o["name"]) for o in response["outputs"]}, response


def reported_version(client: str, version: str) -> str | None:
    """The `model_version` `client` reports for an answer of `version`: KServe's REST client
    (0.21.0, `InferResponse.from_bytes`) drops the field the server sends, so it reports None."""
    return None if client == "kserve_rest" else version


def remote_jobs(
    stack: OipStack, client: str, model: str, inputs: dict[str, tuple[str, np.ndarray]], *, binary: bool, **job: Any
) -> dict[str, Any]:
    return {
        "client": client,
        "url": stack.rest if client == "kserve_rest" else stack.grpc,
        "op": "infer",
        "model": model,
        "binary": binary,
        "id": "req-7",
        "inputs": [encode(name, datatype, array) for name, (datatype, array) in inputs.items()],
        **job,
    }


# --- metadata -----------------------------------------------------------------------------------


def test_server_and_model_metadata_through_both_triton_clients(oip_stack: OipStack) -> None:
    client = triton_http.InferenceServerClient(oip_stack.http_host)
    assert client.is_server_live() and client.is_server_ready()
    server = client.get_server_metadata()
    assert server["name"] == "tfserve-split" and "binary_tensor_data" in server["extensions"]
    described = {model: client.get_model_metadata(model) for model in ("fraud", "digits", "dtypes")}
    assert described["fraud"] == {
        "name": "fraud", "versions": ["1"], "platform": "tensorflow_savedmodel",
        "inputs": [{"name": "features", "datatype": "FP32", "shape": [-1, 11]}],
        "outputs": [{"name": "fraud_score", "datatype": "FP32", "shape": [-1, 1]}],
    }  # fmt: skip
    assert described["digits"]["inputs"] == [{"name": "image", "datatype": "FP32", "shape": [-1, 8, 8, 1]}]
    assert described["dtypes"]["inputs"] == [
        {"name": "count", "datatype": "INT64", "shape": [-1]},
        {"name": "text", "datatype": "BYTES", "shape": [-1]},
    ]
    assert described["dtypes"]["outputs"] == [
        {"name": "length", "datatype": "INT64", "shape": [-1]},
        {"name": "upper", "datatype": "BYTES", "shape": [-1]},
    ]
    assert client.is_model_ready("fraud") and client.is_model_ready("half_plus_two_versions", "2")
    assert not client.is_model_ready("half_plus_two_versions", "7")
    # The same through gRPC, and the readiness probes of every remote client.
    jobs: list[dict[str, Any]] = [
        {"client": "triton_grpc", "url": oip_stack.grpc, "op": "server_metadata"},
        {"client": "triton_grpc", "url": oip_stack.grpc, "op": "model_metadata", "model": "fraud"},
        {"client": "triton_grpc", "url": oip_stack.grpc, "op": "model_metadata", "model": "dtypes"},
    ]
    for remote in REMOTE_CLIENTS:
        url = oip_stack.rest if remote == "kserve_rest" else oip_stack.grpc
        jobs += [{"client": remote, "url": url, "op": op, "model": "fraud"} for op in ("live", "ready", "model_ready")]
    results = run_jobs(jobs)
    assert all(r["ok"] for r in results), [(j, r) for j, r in zip(jobs, results, strict=True) if not r["ok"]]
    assert results[0]["value"]["name"] == "tfserve-split"
    for index, model in ((1, "fraud"), (2, "dtypes")):
        grpc_described = results[index]["value"]
        for tensor in grpc_described["inputs"] + grpc_described["outputs"]:
            tensor["shape"] = [int(d) for d in tensor["shape"]]  # int64 is a JSON string in proto3 JSON
        assert {k: grpc_described[k] for k in ("name", "versions", "platform", "inputs", "outputs")} == described[model]
    assert [r["value"] for r in results[3:]] == [True] * 9


# --- inference, compared with TF Serving's Predict ---------------------------------------------------


@pytest.mark.parametrize("model", ["fraud", "digits", "dtypes"])
def test_every_client_answers_what_tf_serving_answers(oip_stack: OipStack, model: str) -> None:
    inputs = inputs_for(oip_stack, model, seed=len(model))
    expected = tf_serving(oip_stack, model, inputs)
    for binary in (False, True):
        got, response = triton_http_infer(oip_stack, model, inputs, binary=binary)
        assert response["model_name"] == model and response["model_version"] == "1" and response["id"] == "req-7"
        assert got.keys() == expected.keys()
        for name in expected:
            assert same(got[name], expected[name]), (binary, name, got[name], expected[name])
    jobs = [
        remote_jobs(oip_stack, client, model, inputs, binary=binary)
        for client in REMOTE_CLIENTS
        for binary in ((True,) if client == "triton_grpc" else (False, True))
    ]
    for job, result in zip(jobs, run_jobs(jobs), strict=True):
        assert result["ok"], (job["client"], job["binary"], result)
        answer = result["value"]
        assert answer["model_version"] == reported_version(job["client"], "1") and answer["id"] == "req-7"
        assert answer["outputs"].keys() == expected.keys()
        for name, spec in answer["outputs"].items():
            assert same(decode(spec), expected[name]), (job["client"], job["binary"], name)


def test_every_datatype_both_ways(oip_stack: OipStack) -> None:
    """Echo signatures (the `signature_name` parameter) of every datatype, as binary data and as
    JSON (FP16 and BF16 always binary: Triton's client has no JSON form for them). TF Serving's
    REST API carries no FP16, BF16 or UINT16: over it `echo_rest` has the others, and `echo` is
    refused by serving, answered with serving's code (400 or 501)."""
    signature = "echo" if oip_stack.protocol == "grpc" else "echo_rest"
    inputs = inputs_for(oip_stack, "dtypes", seed=22, signature=signature)
    carried = set(NUMPY) if oip_stack.protocol == "grpc" else set(NUMPY) - NOT_OVER_REST
    assert {datatype for datatype, _ in inputs.values()} == carried
    expected = tf_serving(oip_stack, "dtypes", inputs, signature=signature)
    outputs = [f"{name}_out" for name in sorted(inputs)]
    parameters = {"signature_name": signature}
    for binary in (True, False):
        got, response = triton_http_infer(
            oip_stack, "dtypes", inputs, binary=binary, outputs=outputs, parameters=parameters
        )
        assert [o["datatype"] for o in response["outputs"]] == [inputs[n.removesuffix("_out")][0] for n in outputs]
        for name in outputs:
            assert same(got[name], expected[name]), (binary, name, got[name], expected[name])
    if oip_stack.protocol == "rest":
        every = inputs_for(oip_stack, "dtypes", seed=22, signature="echo")
        with pytest.raises(InferenceServerException) as raised:
            triton_http_infer(oip_stack, "dtypes", every, binary=True, parameters={"signature_name": "echo"})
        # Serving's own code, passed through: INVALID_ARGUMENT (400) or, for a type its JSON
        # codec has no conversion to (bfloat16), UNIMPLEMENTED (501).
        assert raised.value.status() in ("400", "501") and "serving tier" in raised.value.message(), raised.value
    # Triton's gRPC client sends raw contents; KServe's (no BF16) typed contents and raw, on `echo_rest`.
    rest_inputs = inputs_for(oip_stack, "dtypes", seed=23, signature="echo_rest")
    rest_expected = tf_serving(oip_stack, "dtypes", rest_inputs, signature="echo_rest")
    jobs = [remote_jobs(oip_stack, "triton_grpc", "dtypes", inputs, binary=True, parameters=parameters)]
    jobs += [
        remote_jobs(oip_stack, client, "dtypes", rest_inputs, binary=binary, parameters={"signature_name": "echo_rest"})
        for client in ("kserve_rest", "kserve_grpc")
        for binary in (False, True)
    ]
    for job, result in zip(jobs, run_jobs(jobs), strict=True):
        assert result["ok"], (job["client"], job["binary"], result)
        wanted = expected if job["client"] == "triton_grpc" else rest_expected
        assert result["value"]["outputs"].keys() == wanted.keys()
        for name, spec in result["value"]["outputs"].items():
            assert same(decode(spec), wanted[name]), (job["client"], job["binary"], name)


def test_outputs_selection_and_order(oip_stack: OipStack) -> None:
    inputs = inputs_for(oip_stack, "dtypes", seed=3)
    expected = tf_serving(oip_stack, "dtypes", inputs)
    got, response = triton_http_infer(oip_stack, "dtypes", inputs, binary=False, outputs=["upper"])
    assert [o["name"] for o in response["outputs"]] == ["upper"] and same(got["upper"], expected["upper"])
    got, response = triton_http_infer(oip_stack, "dtypes", inputs, binary=True, outputs=["upper", "length"])
    assert [o["name"] for o in response["outputs"]] == ["upper", "length"]
    jobs = [remote_jobs(oip_stack, c, "dtypes", inputs, binary=True, outputs=["length"]) for c in REMOTE_CLIENTS]
    for result in run_jobs(jobs):
        assert result["ok"] and list(result["value"]["outputs"]) == ["length"], result
        assert same(decode(result["value"]["outputs"]["length"]), expected["length"])


def test_versions_and_labels(oip_stack: OipStack) -> None:
    """`versions/{v}`: a number is that version, a label the version models.config gives it."""
    x = {"x": ("FP32", np.array([[1.0], [4.0]], np.float32))}
    for version, number, plus in (("1", 1, 2.0), ("2", 2, 3.0), ("stable", 1, 2.0), ("canary", 2, 3.0), ("", 2, 3.0)):
        got, response = triton_http_infer(oip_stack, "half_plus_two_versions", x, binary=False, version=version)
        assert response["model_version"] == str(number), version
        expected = tf_serving(oip_stack, "half_plus_two_versions", x, version=number)
        assert same(got["y"], expected["y"]) and same(got["y"], 0.5 * x["x"][1] + plus), version
    described = httpx.get(f"{oip_stack.rest}/v2/models/half_plus_two_versions/versions/canary").json()
    assert described["versions"] == ["1", "2"]
    jobs = [remote_jobs(oip_stack, "triton_grpc", "half_plus_two_versions", x, binary=True, version="stable"),
            remote_jobs(oip_stack, "kserve_rest", "half_plus_two_versions", x, binary=False, version="canary")]
    answers = run_jobs(jobs)
    assert [a["value"]["model_version"] for a in answers] == ["1", reported_version("kserve_rest", "2")], answers
    assert same(decode(answers[1]["value"]["outputs"]["y"]), 0.5 * x["x"][1] + 3.0), answers
    for version in ("7", "nightly"):
        answer = httpx.post(
            f"{oip_stack.rest}/v2/models/half_plus_two_versions/versions/{version}/infer",
            json={"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]},
        )
        assert answer.status_code == 404 and version in answer.json()["error"], answer.text


# --- errors -------------------------------------------------------------------------------------------

FRAUD_ROW = np.full((1, 11), 0.25, np.float32)
ERROR_CASES = {
    # case: (model, inputs, REST status, gRPC code, words the message has)
    "unknown model": ("no_such_model", {"features": ("FP32", FRAUD_ROW)}, 404, "NOT_FOUND", "unknown model"),
    "wrong shape": ("fraud", {"features": ("FP32", FRAUD_ROW[:, :5])}, 400, "INVALID_ARGUMENT", "shape"),
    "wrong datatype": ("fraud", {"features": ("FP64", FRAUD_ROW.astype(np.float64))}, 400, "INVALID_ARGUMENT",
                       "FP32"),
    "missing input": ("dtypes", {"text": ("BYTES", np.array([b"a"], np.object_))}, 400, "INVALID_ARGUMENT",
                      "count"),
    "unknown input": ("fraud", {"features": ("FP32", FRAUD_ROW), "extra": ("FP32", FRAUD_ROW)}, 400,
                      "INVALID_ARGUMENT", "extra"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_error_cases_get_the_specs_status_and_shape(oip_stack: OipStack, case: str) -> None:
    model, inputs, status, code, words = ERROR_CASES[case]
    for binary in (False, True):
        with pytest.raises(InferenceServerException) as raised:
            triton_http_infer(oip_stack, model, inputs, binary=binary)
        assert raised.value.status() == str(status) and words in raised.value.message(), raised.value
    body = {"inputs": [{"name": n, "shape": list(a.shape), "datatype": d, "data": a.ravel().tolist()}
                       for n, (d, a) in inputs.items() if d != "BYTES"]}  # fmt: skip
    body["inputs"] += [{"name": n, "shape": list(a.shape), "datatype": d, "data": [v.decode() for v in a.ravel()]}
                       for n, (d, a) in inputs.items() if d == "BYTES"]  # fmt: skip
    raw = httpx.post(f"{oip_stack.rest}/v2/models/{model}/infer", json=body)
    assert raw.status_code == status and raw.headers["content-type"] == "application/json"
    answer = raw.json()
    assert words in answer["error"] and answer["request_id"] == raw.headers["x-request-id"]
    jobs = [remote_jobs(oip_stack, c, model, inputs, binary=b) for c in REMOTE_CLIENTS for b in (False, True)]
    for job, result in zip(jobs, run_jobs(jobs), strict=True):
        expected = status if job["client"] == "kserve_rest" else code
        assert not result["ok"] and result["status"] == expected, (job["client"], job["binary"], result)
        assert words in result["message"], (job["client"], result)


def test_malformed_requests_get_400_in_the_oip_shape(oip_stack: OipStack) -> None:
    url = f"{oip_stack.rest}/v2/models/fraud/infer"
    row = {"name": "features", "shape": [1, 11], "datatype": "FP32"}
    header = (
        b'{"inputs": [{"name": "features", "shape": [1, 11], "datatype": "FP32",'
        b' "parameters": {"binary_data_size": 44}}]}'
    )
    cases: list[tuple[bytes, dict[str, str], str]] = [
        (b"{not json", {}, "not JSON"),
        (b"[]", {}, "JSON object"),
        (b'{"inputs": {}}', {}, "'inputs'"),
        (httpx.Request("POST", url, json={"inputs": [{**row, "data": [1.0] * 10}]}).content, {}, "neither"),
        (httpx.Request("POST", url, json={"inputs": [{**row, "data": ["a"] * 11}]}).content, {}, "numbers"),
        (httpx.Request("POST", url, json={"inputs": [{**row, "datatype": "FP8", "data": [1] * 11}]}).content, {},
         "datatype"),
        (httpx.Request("POST", url, json={"inputs": [{**row, "shape": [-1, 11], "data": [1] * 11}]}).content, {},
         "shape"),
        (header + bytes(40), {"inference-header-content-length": str(len(header))}, "binary_data_size"),
        (header + bytes(48), {"inference-header-content-length": str(len(header))}, "add up"),
        (header + bytes(44), {"inference-header-content-length": "99999"}, "Inference-Header-Content-Length"),
    ]  # fmt: skip
    for body, headers, words in cases:
        answer = httpx.post(url, content=body, headers={"content-type": "application/json", **headers})
        assert answer.status_code == 400 and words in answer.json()["error"], (body[:80], answer.text)
    good = httpx.post(
        url, content=header + FRAUD_ROW.tobytes(), headers={"inference-header-content-length": str(len(header))}
    )
    assert good.status_code == 200 and good.json()["outputs"][0]["name"] == "fraud_score"
    too_large = httpx.post(url, content=b" " * (4 * 1024 * 1024 + 1))
    assert too_large.status_code == 413 and "larger than" in too_large.json()["error"]
    unknown_signature = httpx.post(
        url, json={"parameters": {"signature_name": "nope"}, "inputs": [{**row, "data": [0.5] * 11}]}
    )
    assert unknown_signature.status_code == 400 and "no signature 'nope'" in unknown_signature.json()["error"]


def test_the_surface_is_in_the_openapi_document(oip_stack: OipStack) -> None:
    paths = httpx.get(f"{oip_stack.rest}/openapi.json").json()["paths"]
    for path in (
        "/v2", "/v2/health/live", "/v2/health/ready", "/v2/models/{model_name}", "/v2/models/{model_name}/ready",
        "/v2/models/{model_name}/infer", "/v2/models/{model_name}/versions/{model_version}",
        "/v2/models/{model_name}/versions/{model_version}/ready",
        "/v2/models/{model_name}/versions/{model_version}/infer",
    ):  # fmt: skip
        assert path in paths, path
    infer = paths["/v2/models/{model_name}/infer"]["post"]
    assert "application/octet-stream" in infer["requestBody"]["content"]
    assert infer["responses"]["400"]["content"]["application/json"]["schema"]["$ref"].endswith("ErrorResponse")
