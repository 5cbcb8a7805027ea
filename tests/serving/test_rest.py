"""The REST front end in-process: the real Starlette app over real servables, via AppClient."""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from google.protobuf import text_format
from starlette.types import ASGIApp

from serving.apis import ModelSpec, PredictRequest
from serving.config.model_server_config import ModelServerConfig
from serving.core.manager import ServableManager
from serving.model_servers.http_rest_api_handler import (
    CODEC_OFFLOAD_BODY_BYTES,
    CODEC_OFFLOAD_OUTPUT_ELEMENTS,
    HttpRestApiHandler,
)
from serving.model_servers.http_server import create_app
from serving.servables.tensorflow.inference_runner import InferenceRunner
from serving.servables.tensorflow.predict_impl import Predictor
from serving.util.executor import BlockingExecutor
from tests.serving.serving_testlib import models_config_text


class AppClient:
    """A synchronous client for an ASGI app through httpx's ASGITransport (one loop per call)."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    def request(self, method: str, path: str, **kwargs: object) -> httpx.Response:
        async def send() -> httpx.Response:
            transport = httpx.ASGITransport(app=self._app, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                return await client.request(method, path, **kwargs)  # type: ignore[arg-type]

        return asyncio.run(send())

    def get(self, path: str, **kwargs: object) -> httpx.Response:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs: object) -> httpx.Response:
        return self.request("POST", path, **kwargs)

    def options(self, path: str, **kwargs: object) -> httpx.Response:
        return self.request("OPTIONS", path, **kwargs)


@pytest.fixture(scope="module")
def manager(serving_model_dir: Path) -> Iterator[ServableManager]:
    from serving.servables.tensorflow.servable import Servable  # imports TensorFlow

    config = text_format.Parse(models_config_text(serving_model_dir), ModelServerConfig())
    manager = ServableManager(
        functools.partial(Servable.load, intra_op_threads=1, inter_op_threads=1),
        # models_config_text labels versions of "multi" that are not loaded yet at start-up.
        allow_version_labels_for_unavailable_models=True,
    )
    manager.aspire(config)
    manager.load_aspired()
    yield manager
    manager.unload_all()


@pytest.fixture(scope="module")
def executor() -> Iterator[BlockingExecutor]:
    executor = BlockingExecutor(2, "session-run")
    yield executor
    executor.shutdown()


@pytest.fixture(scope="module")
def client(manager: ServableManager, executor: BlockingExecutor) -> Iterator[AppClient]:
    inference = InferenceRunner(manager, executor)
    yield AppClient(
        create_app(Predictor(manager, executor), manager, inference=inference, timeout_ms=30000)
    )


def test_paths_are_case_insensitive(client: AppClient) -> None:
    response = client.post("/V1/MODELS/half_plus_two:predict", json={"instances": [1.0]})
    assert response.json() == {"predictions": [2.5]}
    # ... but the verb is compared exactly, as TF Serving does.
    response = client.post("/v1/models/half_plus_two:PREDICT", json={"instances": [1.0]})
    assert response.status_code == 400
    assert response.json() == {"error": "Malformed request: POST /v1/models/half_plus_two:PREDICT"}


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/models/half_plus_two"),
        ("GET", "/v1/models/half_plus_two:predict"),
        ("PUT", "/v1/models/half_plus_two"),
        ("POST", "/v1/models/half_plus_two/versions/x:predict"),
    ],
)
def test_malformed_requests(client: AppClient, method: str, path: str) -> None:
    response = client.request(method, path)
    assert response.status_code == 400
    assert response.json() == {"error": f"Malformed request: {method} {path}"}


def test_missing_model_name(client: AppClient) -> None:
    response = client.get("/v1/models")
    assert response.status_code == 400
    assert response.json() == {"error": "Missing model name in request."}


def test_version_overflow(client: AppClient) -> None:
    response = client.get("/v1/models/multi/versions/99999999999999999999")
    assert response.status_code == 400
    assert response.json() == {
        "error": "Failed to convert version: 99999999999999999999 to numeric."
    }


def test_url_encoded_model_name(client: AppClient) -> None:
    response = client.get("/v1/models/half%5Fplus%5Ftwo")
    assert response.status_code == 200


def test_status_with_label_lists_all_versions(client: AppClient) -> None:
    body = client.get("/v1/models/multi/labels/stable").json()
    assert [v["version"] for v in body["model_version_status"]] == ["2", "1"]


def test_metadata_by_version_and_label(client: AppClient) -> None:
    assert client.get("/v1/models/multi/versions/1/metadata").json()["model_spec"]["version"] == "1"
    assert (
        client.get("/v1/models/multi/labels/canary/metadata").json()["model_spec"]["version"] == "2"
    )
    response = client.get("/v1/models/nope/metadata")
    assert response.status_code == 404
    assert response.json() == {"error": "Servable not found for request: Latest(nope)"}


def test_keras_metadata(client: AppClient) -> None:
    body = client.get("/v1/models/keras_half_plus_two/metadata").json()
    signature = body["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert signature["inputs"]["x"]["tensor_shape"]["dim"] == [
        {"size": "-1", "name": ""},
        {"size": "1", "name": ""},
    ]
    assert list(signature["outputs"]) == ["output_0"]


def test_two_inputs_row_and_columnar(client: AppClient) -> None:
    response = client.post(
        "/v1/models/two_inputs:predict",
        json={"instances": [{"a": 1.0, "b": 2.0}, {"a": 3.0, "b": 4.0}]},
    )
    assert response.json() == {
        "predictions": [{"product": 2.0, "sum": 3.0}, {"product": 12.0, "sum": 7.0}]
    }
    response = client.post(
        "/v1/models/two_inputs:predict", json={"inputs": {"a": [1.0, 2.0], "b": [3.0, 4.0]}}
    )
    assert response.json() == {"outputs": {"product": [3.0, 8.0], "sum": [4.0, 6.0]}}


def test_rank_0_string_output_in_columnar_answer(client: AppClient) -> None:
    # json_tensor.cc AddTensorValues: a tensor of no dimension is written as its one value
    # (MultipleNamedTensorColumnarFormat's "bin_tensor" is such a scalar string, as a request).
    # A scalar string comes out of the Session as bytes: it is DT_STRING all the same.
    response = client.post("/v1/models/scalar_string:predict", json={"inputs": [1.0, 2.0]})
    assert response.status_code == 200, response.text
    assert response.json() == {"outputs": {"label": "half", "y": [2.0, 3.0]}}
    # The row format needs a batch dimension on every output (MakeRowFormatJsonFromTensors).
    response = client.post("/v1/models/scalar_string:predict", json={"instances": [1.0]})
    assert response.status_code == 400
    assert response.json() == {"error": "Tensor name: label has no shape information "}


def test_runtime_shape_mismatch_is_tensorflow_error(client: AppClient) -> None:
    response = client.post(
        "/v1/models/two_inputs:predict", json={"inputs": {"a": [1.0, 2.0], "b": [3.0, 4.0, 5.0]}}
    )
    assert response.status_code == 400
    assert "Incompatible shapes" in response.json()["error"]


def test_unknown_signature(client: AppClient) -> None:
    response = client.post(
        "/v1/models/half_plus_two:predict", json={"signature_name": "nope", "instances": [1.0]}
    )
    assert response.status_code == 400
    assert response.json() == {"error": 'Serving signature name: "nope" not found in signature def'}


def test_explicit_default_signature(client: AppClient) -> None:
    response = client.post(
        "/v1/models/half_plus_two:predict",
        json={"signature_name": "serving_default", "instances": [2.0]},
    )
    assert response.json() == {"predictions": [3.0]}


def test_non_finite_round_trip(client: AppClient) -> None:
    response = client.post(
        "/v1/models/half_plus_two:predict", content=b'{"instances": [NaN, Infinity, -Infinity]}'
    )
    assert response.status_code == 200
    assert response.content == b'{"predictions":[NaN,Infinity,-Infinity]}'


def test_body_is_not_an_object(client: AppClient) -> None:
    response = client.post("/v1/models/half_plus_two:predict", content=b"[1]")
    assert response.status_code == 400
    assert response.json() == {"error": "JSON Value: [1] Is not object"}


def test_empty_body(client: AppClient) -> None:
    response = client.post("/v1/models/half_plus_two:predict", content=b"")
    assert response.status_code == 400
    assert response.json() == {"error": "JSON Parse error: The document is empty"}


def test_classify_and_regress(client: AppClient) -> None:
    # A predict signature (x -> y) has no "inputs" input: refused by its layout, since the
    # method-name check is off by default (tests/serving/test_conformance.py has more).
    response = client.post("/v1/models/half_plus_two:classify", json={"examples": [{"x": 1.0}]})
    assert response.status_code == 400
    assert response.json()["error"].startswith("No classification inputs found in SignatureDef: ")
    body = {"signature_name": "x", "examples": [{"x": 1.0}]}
    response = client.post("/v1/models/half_plus_two:regress", json=body)
    assert response.status_code == 400
    assert response.json() == {"error": "No signature was found with the name: x"}
    response = client.post("/v1/models/nope:regress", json={"examples": [{"x": 1.0}]})
    assert response.status_code == 404


def test_cors(manager: ServableManager, executor: BlockingExecutor) -> None:
    inference = InferenceRunner(manager, executor)
    app = create_app(Predictor(manager, executor), manager, inference=inference, enable_cors=True)
    cors_client = AppClient(app)
    response = cors_client.options("/v1/models/half_plus_two:predict")
    assert response.status_code == 200
    assert response.headers["access-control-allow-origin"] == "*"
    response = cors_client.get("/v1/models/nope")
    assert response.status_code == 404
    assert response.headers["access-control-allow-methods"] == "POST, GET"


def test_predict_core_runs_off_the_event_loop(
    manager: ServableManager, executor: BlockingExecutor
) -> None:
    """The gRPC-facing core: numpy in, numpy out, Session.run on the executor's threads."""
    predictor = Predictor(manager, executor)
    seen: list[str] = []

    async def call() -> None:
        with manager.acquire(ModelSpec("half_plus_two")) as handle:
            original = handle.servable.run_tensors

            def spy(*args: object) -> object:
                seen.append(threading.current_thread().name)
                return original(*args)

            handle.servable.run_tensors = spy
            try:
                request = PredictRequest(
                    ModelSpec("half_plus_two"), {"x": np.array([1.0, 2.0], np.float32)}
                )
                response = await predictor.predict(request)
            finally:
                del handle.servable.run_tensors
        assert response.model_spec == ModelSpec(
            "half_plus_two", version=1, signature_name="serving_default"
        )
        np.testing.assert_array_equal(response.outputs["y"], [2.5, 3.0])

    asyncio.run(call())
    assert seen and seen[0].startswith("session-run")


def test_rest_predict_looks_the_servable_up_once(
    manager: ServableManager, client: AppClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GetInfoMap (input dtypes), decoding and the prediction share one lookup -- so they use one
    version -- and the answers and errors are unchanged, in TF Serving's order: lookup, then
    signature, then the body's tensors."""
    specs: list[ModelSpec] = []
    acquire = manager.acquire

    def counting(spec: ModelSpec) -> object:
        specs.append(spec)
        return acquire(spec)

    monkeypatch.setattr(manager, "acquire", counting)
    body = {"inputs": {"a": [1.0], "b": [2.0]}}
    response = client.post("/v1/models/two_inputs:predict", json=body)
    assert response.json() == {"outputs": {"product": [2.0], "sum": [3.0]}}
    assert specs == [ModelSpec("two_inputs")]
    for path, body, status, error in [
        (
            "/v1/models/nope:predict",
            {"signature_name": "nope", "instances": ["not a number"]},
            404,
            "Servable not found for request: Latest(nope)",
        ),
        (
            "/v1/models/half_plus_two:predict",
            {"signature_name": "nope", "instances": ["not a number"]},
            400,
            'Serving signature name: "nope" not found in signature def',
        ),
    ]:
        specs.clear()
        response = client.post(path, json=body)
        assert (response.status_code, response.json()) == (status, {"error": error})
        assert len(specs) == 1
    specs.clear()
    response = client.post("/v1/models/half_plus_two:predict", json={"instances": ["text"]})
    assert response.status_code == 400 and len(specs) == 1


def test_servable_input_checks(manager: ServableManager) -> None:
    from serving.util.errors import ServingError

    with manager.acquire(ModelSpec("two_inputs")) as handle:
        servable = handle.servable
        with pytest.raises(ServingError) as info:
            servable.run("", {"a": np.zeros(1, np.float32)})
        assert info.value.message == (
            "input size does not match signature: 1!=2 len({a}) != len({a,b}). "
            "Sent extra: {}. Missing but required: {b}."
        )
        with pytest.raises(ServingError) as info:
            servable.run("", {"a": np.zeros(1, np.float32), "c": np.zeros(1, np.float32)})
        assert info.value.message.startswith("Signature input alias: b(feed name: b:0) not found")
        with pytest.raises(ServingError, match="^output tensor alias not found in signature: z"):
            servable.run("", {"a": np.zeros(1, np.float32), "b": np.zeros(1, np.float32)}, ["z"])
        with pytest.raises(ServingError) as info:
            servable.run("nope", {})
        assert info.value.message == 'Serving signature key "nope" not found.'
        name, outputs = servable.run(
            "", {"a": np.ones(2, np.float32), "b": np.ones(2, np.float32)}, ["sum"]
        )
        assert name == "serving_default" and list(outputs) == ["sum"]


# ---- large bodies: decoded, and large answers encoded, on the codec executor ------------------

#: Whitespace after the document (never read, as in rapidjson) makes any body a large one.
LARGE_PADDING = b" " * CODEC_OFFLOAD_BODY_BYTES


def offloading_app(manager: ServableManager, executor: BlockingExecutor) -> ASGIApp:
    """The app with a codec executor (the request threads here; the server's worker processes
    are tested in tests/serving/test_json_processes.py)."""
    inference = InferenceRunner(manager, executor)
    return create_app(
        Predictor(manager, executor), manager, inference=inference, timeout_ms=30000, codec_executor=executor
    )


@pytest.fixture(scope="module")
def offloading_client(manager: ServableManager, executor: BlockingExecutor) -> AppClient:
    return AppClient(offloading_app(manager, executor))


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/models/half_plus_two:predict", b'{"instances": [1.0, 2.0]}'),
        ("/v1/models/half_plus_two:predict", b'{"inputs": {"x": [1.0, 2.0], "extra": [1]}}'),
        ("/v1/models/two_inputs:predict", b'{"instances": [{"a": 1.0, "b": 2.0}]}'),
        ("/v1/models/strings:predict", b'{"instances": ["a", {"b64": "Yg=="}]}'),
        # The errors, in TF Serving's order: parse, lookup, signature, decode.
        ("/v1/models/nope:predict", b'{"instances": [1.0,,]}'),
        ("/v1/models/nope:predict", b'{"instances": ["a"]}'),
        ("/v1/models/half_plus_two:predict", b'{"signature_name": "nope", "instances": ["a"]}'),
        ("/v1/models/half_plus_two:predict", b'{"signature_name": 3, "instances": [1.0]}'),
        ("/v1/models/half_plus_two:predict", b'{"instances": ["a"]}'),
        ("/v1/models/half_plus_two:predict", b'{"instances": [[1.0], 2.0]}'),
        ("/v1/models/half_plus_two:predict", b'{"nothing": 1}'),
        ("/v1/models/half_plus_two/versions/9:predict", b'{"instances": [1.0]}'),
        ("/v1/models/two_inputs:predict", b'{"inputs": {"a": [1.0]}}'),
        ("/v1/models/half_plus_two:predict", b'{"instances": ' + b"[" * 1000 + b"1" + b"]" * 1000 + b"}"),
        ("/v1/models/half_plus_two:predict", b'{"instances": [1.0], "x": ' + b"[" * 1000 + b"]" * 1000 + b"}"),
        ("/v1/models/half_plus_two:predict", b'{"instances": ["\xff\xfe"]}'),
        ("/v1/models/half_plus_two:predict", b'{"signature_name": "\xff", "instances": [1.0]}'),
        ("/v1/models/half_plus_two:predict", b'{"instances": [\xff]}'),
        ("/v1/models/half_plus_two:regress", b'{"examples": [{"x": 1.0}]}'),
        ("/v1/models/nope:classify", b'{"examples": [{"x": 1.0}]}'),
        ("/v1/models/nope:classify", b'{"examples": [{"x": [[1]]}]}'),
    ],
)
def test_a_large_body_is_answered_as_a_small_one(
    client: AppClient, offloading_client: AppClient, path: str, body: bytes
) -> None:
    small = client.post(path, content=body)
    large = offloading_client.post(path, content=body + LARGE_PADDING)
    assert (large.status_code, large.json()) == (small.status_code, small.json())


def test_a_large_answer_is_encoded_as_a_small_one(client: AppClient, offloading_client: AppClient) -> None:
    values = [float(i) for i in range(CODEC_OFFLOAD_OUTPUT_ELEMENTS)]
    for body in ({"instances": values}, {"inputs": values}):
        small = client.post("/v1/models/half_plus_two:predict", json=body)
        large = offloading_client.post("/v1/models/half_plus_two:predict", json=body)
        assert small.status_code == large.status_code == 200
        assert small.content == large.content


def test_a_large_body_decoded_for_a_swapped_version_is_decoded_again(
    manager: ServableManager, executor: BlockingExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The servable's dtypes were read before the body was sent; if the version serving the request
    # then has others (a version swap in between), the body is decoded again for those.
    stale = {"serving_default": {"x": "DT_STRING"}}
    monkeypatch.setattr(HttpRestApiHandler, "_input_dtypes_by_signature", lambda self, model: stale)
    body = b'{"instances": [1.0, 2.0]}' + LARGE_PADDING
    response = AppClient(offloading_app(manager, executor)).post("/v1/models/half_plus_two:predict", content=body)
    assert (response.status_code, response.json()) == (200, {"predictions": [2.5, 3.0]})
