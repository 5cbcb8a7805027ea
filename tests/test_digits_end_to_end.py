"""The digits example end to end: serving tier + API as real processes on loopback.

`python -m serving` loads both models of models.config (fraud and digits); images go
into `POST /v1/digits/classify` as multipart uploads. Answers must match the exported
model's own output on the same preprocessed input (computed here with TensorFlow), and
held-out digits rendered as big pictures must mostly be recognised.
"""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import numpy as np
import pytest

from examples.digits.images import preprocess_digit
from models.digits_data import encode, load_split, render
from tests.support import (
    REPO,
    Process,
    Serving,
    free_port,
    http_ok,
    start_api,
    start_example_serving,
)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
URL = "/v1/digits/classify"
MAX_IMAGE_BYTES = 2 * 1024 * 1024  # the digits route's FileUpload.max_bytes (MODELS__DIGITS__MAX_BODY_BYTES)
N_DIGITS = 50


@dataclass
class Stack:
    serving: Serving
    api: Process
    serving_url: str
    api_url: str


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("digits-e2e")
    api_port = free_port()
    api_url = f"http://127.0.0.1:{api_port}"
    serving = start_example_serving(tmp)
    api = start_api(api_port, serving.rest_url, tmp / "api.log")
    s = Stack(serving, api, serving.rest_url, api_url)
    try:
        serving.wait_available("fraud", "digits")
        api.wait_ready(lambda: http_ok(api_url + "/readyz"), 60, "/readyz")
        yield s
    finally:
        api_log = api.log()
        # uvicorn shuts down gracefully on SIGTERM, then re-raises the signal so that
        # its exit status says why it stopped: -SIGTERM, not a crash.
        assert s.api.stop() in (0, -signal.SIGTERM), api_log
        s.serving.stop()


@pytest.fixture(scope="module")
def reference_model():  # type: ignore[no-untyped-def]
    """The exported model's serving_default signature, run in this process."""
    import tensorflow as tf

    signature = tf.saved_model.load(str(REPO / "models" / "digits" / "1")).signatures[
        "serving_default"
    ]

    def run(grids: list) -> np.ndarray:
        x = tf.constant(np.asarray(grids, dtype=np.float32))
        return signature(image=x)["probabilities"].numpy()

    return run


@pytest.fixture(scope="module")
def held_out() -> tuple[np.ndarray, np.ndarray]:
    split = load_split()
    return split.test_x[:N_DIGITS], split.test_y[:N_DIGITS]


def post_image(api_url: str, data: bytes, filename: str, content_type: str) -> httpx.Response:
    return httpx.post(
        api_url + URL, files={"image": (filename, data, content_type)}, timeout=10.0
    )


def test_serving_loads_both_models_with_the_documented_signature(stack: Stack) -> None:
    for name in ("fraud", "digits"):
        status = httpx.get(f"{stack.serving_url}/v1/models/{name}").json()
        assert status["model_version_status"][0]["state"] == "AVAILABLE", status
    meta = httpx.get(f"{stack.serving_url}/v1/models/digits/metadata").json()
    sig = meta["metadata"]["signature_def"]["signature_def"]["serving_default"]
    [(in_name, tensor_in)] = sig["inputs"].items()
    [(out_name, tensor_out)] = sig["outputs"].items()
    dims = lambda t: [int(d["size"]) for d in t["tensor_shape"]["dim"]]  # noqa: E731
    assert (in_name, tensor_in["dtype"], dims(tensor_in)) == ("image", "DT_FLOAT", [-1, 8, 8, 1])
    assert (out_name, tensor_out["dtype"], dims(tensor_out)) == ("probabilities", "DT_FLOAT", [-1, 10])


def test_readme_example(stack: Stack) -> None:
    data = (REPO / "examples" / "digit-3.png").read_bytes()
    r = post_image(stack.api_url, data, "digit-3.png", "image/png")
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"digit", "probabilities", "model"}
    assert body["digit"] == 3
    assert body["model"] == {"name": "digits", "version": 1}
    assert len(body["probabilities"]) == 10
    assert sum(body["probabilities"]) == pytest.approx(1.0, abs=1e-4)


@pytest.mark.parametrize(
    ("image_format", "content_type", "params"),
    [("PNG", "image/png", {}), ("JPEG", "image/jpeg", {"quality": 85})],
)
def test_held_out_digits_are_recognised_and_match_the_model(
    stack: Stack,
    reference_model,  # type: ignore[no-untyped-def]
    held_out: tuple[np.ndarray, np.ndarray],
    image_format: str,
    content_type: str,
    params: dict,
) -> None:
    images, labels = held_out
    uploads = [encode(render(x, scale=32), image_format, **params) for x in images]
    # A few at a time, so several decodes run in the API's worker threads at once.
    with ThreadPoolExecutor(max_workers=4) as pool:
        answers = list(
            pool.map(lambda d: post_image(stack.api_url, d, "d." + image_format.lower(), content_type), uploads)
        )
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers[:3]]
    bodies = [a.json() for a in answers]
    got = np.asarray([b["probabilities"] for b in bodies])
    assert got.shape == (N_DIGITS, 10)
    np.testing.assert_allclose(got.sum(axis=1), 1.0, atol=1e-4)
    assert [b["digit"] for b in bodies] == list(got.argmax(axis=1))
    assert all(b["model"] == {"name": "digits", "version": 1} for b in bodies)

    # Exactly what the model itself says about the API's preprocessing of each upload.
    grids = [preprocess_digit(d, max_pixels=4096 * 4096) for d in uploads]
    np.testing.assert_allclose(got, reference_model(grids), atol=1e-5)

    correct = int((got.argmax(axis=1) == labels).sum())
    assert correct >= 45, f"{correct}/{N_DIGITS} recognised"


def test_oversize_image_is_413(stack: Stack) -> None:
    data = b"\x89PNG" + os.urandom(MAX_IMAGE_BYTES + 1000)
    r = post_image(stack.api_url, data, "big.png", "image/png")
    assert r.status_code == 413
    assert r.json()["code"] == "payload_too_large"


def test_oversize_declared_length_is_refused_without_reading_the_body(stack: Stack) -> None:
    # Headers announce 100 MB and no body byte is sent: the 413 must come from the
    # header alone. (Body bytes the server never reads would make its close a reset,
    # which can discard the answer before the client reads it.)
    host, port = stack.api_url.removeprefix("http://").split(":")
    head = (
        f"POST {URL} HTTP/1.1\r\nHost: {host}\r\n"
        "Content-Type: multipart/form-data; boundary=b\r\n"
        f"Content-Length: {100 * 1024 * 1024}\r\n\r\n"
    ).encode()
    with socket.create_connection((host, int(port)), timeout=10.0) as sock:
        sock.sendall(head)
        # Read until the server closes: headers and body may come in separate segments.
        answer = b""
        while b"payload_too_large" not in answer:
            try:
                part = sock.recv(4096)
            except ConnectionResetError:
                break
            if not part:
                break
            answer += part
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"payload_too_large" in answer


@pytest.mark.parametrize(
    ("files", "data", "loc_message"),
    [
        ({"image": ("notes.txt", b"a text file, not an image\n", "text/plain")}, None, "not a PNG or JPEG"),
        (None, {"something": "else"}, "Field required"),
    ],
)
def test_bad_uploads_are_422(
    stack: Stack, files: dict | None, data: dict | None, loc_message: str
) -> None:
    r = httpx.post(stack.api_url + URL, files=files, data=data, timeout=10.0)
    assert r.status_code == 422, r.text
    [error] = r.json()["detail"]
    assert error["loc"] == ["body", "image"]
    assert loc_message in error["msg"]


def test_truncated_png_is_422(stack: Stack, held_out: tuple[np.ndarray, np.ndarray]) -> None:
    data = encode(render(held_out[0][0], scale=32).convert("RGB"))
    r = post_image(stack.api_url, data[: len(data) // 2], "cut.png", "image/png")
    assert r.status_code == 422, r.text
    assert "truncated or corrupt PNG" in r.json()["detail"][0]["msg"]


def test_fraud_still_scores_next_to_digits(stack: Stack) -> None:
    from tests.test_end_to_end import EXAMPLE

    r = httpx.post(stack.api_url + "/v1/fraud/score", json=EXAMPLE, timeout=10.0)
    assert r.status_code == 200, r.text
    assert r.json()["model"] == {"name": "fraud", "version": 1}


def test_export_carries_tf_serving_warmup_records() -> None:
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_log_pb2

    path = REPO / "models" / "digits" / "1" / "assets.extra" / "tf_serving_warmup_requests"
    shapes = []
    for record in tf.data.TFRecordDataset(str(path)):
        log = prediction_log_pb2.PredictionLog.FromString(record.numpy())
        request = log.predict_log.request
        assert request.model_spec.name == "digits"
        assert request.model_spec.signature_name == "serving_default"
        tensor = tf.make_ndarray(request.inputs["image"])
        assert tensor.dtype == np.float32 and tensor.min() >= 0 and tensor.max() <= 16
        shapes.append(tensor.shape)
    assert shapes == [(1, 8, 8, 1), (8, 8, 8, 1), (64, 8, 8, 1)]
