"""`POST /v1/digits/classify` in process: upload limits and input errors, and the route's
contract with serving through a fake `ServingClient` (tests.api.fake_client; the wire formats
are the transports' own tests').

The input tests point the app at a port where nothing listens: every case there is
answered before serving would be called (serving itself is covered end to end in
tests/test_digits_end_to_end.py).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.config.enabled_routes import MULTIPART_ALLOWANCE_BYTES
from api.config.settings import Settings
from api.request.admission.rules import multipart_boundary
from api.serving_client import DataType, PredictRequest, Tensor
from examples.digits.route import route as digits_route
from models.digits_data import encode, load_split, render
from tests.api.fake_client import FakeClient, FakeModel, signature_info
from tests.support import EXAMPLE_ROUTES, REPO

URL = "/v1/digits/classify"
IMAGE_LIMIT = 50_000


@pytest.fixture(scope="module")
def png() -> bytes:
    return encode(render(load_split().test_x[0]))


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    settings = Settings(
        model_routes=EXAMPLE_ROUTES.split(","),
        serving_url="http://127.0.0.1:9",
        models={"digits": {"max_body_bytes": IMAGE_LIMIT}},
    )
    with TestClient(create_app(settings)) as c:
        yield c


def image_error(response: httpx.Response) -> str:
    """The message of a 422 located at the `image` field (FastAPI's format)."""
    assert response.status_code == 422, response.text
    [error] = response.json()["detail"]
    assert error["loc"] == ["body", "image"]
    return str(error["msg"])


def test_valid_image_reaches_serving(client: TestClient, png: bytes) -> None:
    # Nothing listens on port 9: the image passed every check and the call to serving
    # failed, answered by the app's serving-error handler.
    r = client.post(URL, files={"image": ("d.png", png, "image/png")})
    assert r.status_code == 503
    assert r.json()["detail"].startswith("serving tier:")


def test_missing_field(client: TestClient) -> None:
    r = client.post(URL, data={"picture": "x"})
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["body", "image"]
    assert r.json()["detail"][0]["type"] == "missing"


def test_no_body_at_all(client: TestClient) -> None:
    r = client.post(URL)
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["body", "image"]


def test_field_that_is_not_a_file(client: TestClient) -> None:
    assert "UploadFile" in image_error(client.post(URL, data={"image": "a string"}))


def test_text_file(client: TestClient) -> None:
    r = client.post(URL, files={"image": ("notes.txt", b"not an image\n", "text/plain")})
    assert "not a PNG or JPEG" in image_error(r)
    assert r.json()["detail"][0]["input"] == {
        "filename": "notes.txt",
        "content_type": "text/plain",
        "size": 13,
    }


def test_text_file_claiming_to_be_png(client: TestClient) -> None:
    r = client.post(URL, files={"image": ("d.png", b"not an image\n", "image/png")})
    assert "not a PNG or JPEG" in image_error(r)


def test_truncated_png(client: TestClient, png: bytes) -> None:
    r = client.post(URL, files={"image": ("d.png", png[: len(png) // 2], "image/png")})
    assert "truncated or corrupt PNG" in image_error(r)


def test_blank_image(client: TestClient) -> None:
    from PIL import Image

    r = client.post(URL, files={"image": ("b.png", encode(Image.new("L", (32, 32), 255)))})
    assert "no digit" in image_error(r)


def test_too_many_pixels(client: TestClient) -> None:
    from tests.api.test_digits_images import png_header_only

    r = client.post(URL, files={"image": ("bomb.png", png_header_only(30_000, 30_000))})
    assert "at most" in image_error(r)


def test_image_over_the_limit_is_413(client: TestClient) -> None:
    # Body within the framing allowance, image itself over the limit.
    r = client.post(URL, files={"image": ("big.png", b"\0" * (IMAGE_LIMIT + 1), "image/png")})
    assert r.status_code == 413
    body = r.json()
    limit = f"image is larger than {IMAGE_LIMIT} bytes"
    assert body["detail"] == f"{limit} (raise the limit with MODELS__DIGITS__MAX_BODY_BYTES)"
    assert body["code"] == "payload_too_large"  # the same code as the body-size middleware


def test_image_at_the_limit_is_read(client: TestClient) -> None:
    r = client.post(URL, files={"image": ("big.png", b"\0" * IMAGE_LIMIT, "image/png")})
    assert "not a PNG or JPEG" in image_error(r)


def test_declared_content_length_over_the_limit_is_413_before_reading(client: TestClient) -> None:
    # The header claims far more than the limit; the 10 bytes sent are never read.
    r = client.post(
        URL,
        content=b"0123456789",
        headers={"content-type": "multipart/form-data; boundary=b", "content-length": "999999999"},
    )
    assert r.status_code == 413
    assert r.json()["code"] == "payload_too_large"


def test_chunked_body_over_the_limit_is_413(client: TestClient) -> None:
    def body() -> Iterator[bytes]:  # no Content-Length: sent chunked
        yield b'--b\r\nContent-Disposition: form-data; name="image"; filename="a.png"\r\n\r\n'
        for _ in range(10):
            yield b"\0" * 10_000  # 100 kB in all, over the 66 kB body limit
        yield b"\r\n--b--\r\n"

    r = client.post(URL, content=body(), headers={"content-type": "multipart/form-data; boundary=b"})
    assert r.status_code == 413
    assert r.json()["code"] == "payload_too_large"
    assert f"larger than {IMAGE_LIMIT + MULTIPART_ALLOWANCE_BYTES} bytes" in r.json()["detail"]


def test_openapi_documents_the_upload(client: TestClient) -> None:
    op = client.get("/openapi.json").json()["paths"][URL]["post"]
    assert "multipart/form-data" in op["requestBody"]["content"]
    assert {"200", "413", "422", "503"} <= set(op["responses"])


# --- the route against a fake serving client ------------------------------------------


def probs(hot: int) -> list[float]:
    return [0.91 if d == hot else 0.01 for d in range(10)]


def classify_with(tmp_path: Path, png: bytes, model: FakeModel) -> tuple[httpx.Response, FakeClient]:
    fake = FakeClient({"digits": model})
    settings = Settings(model_routes=["examples.digits.route:route"], events_jsonl_path=tmp_path / "events.jsonl")
    with TestClient(create_app(settings, open_client=fake.opener)) as c:
        return c.post(URL, files={"image": ("d.png", png, "image/png")}), fake


def digits_model(answer: object, **kwargs: object) -> FakeModel:
    served = {"serving_default": signature_info(digits_route.signature)}
    return FakeModel(served, answer, **kwargs)  # type: ignore[arg-type]


def test_the_route_sends_the_grid_to_the_latest_version(tmp_path: Path, png: bytes) -> None:
    answer = {"probabilities": Tensor((1, 10), probs(7))}
    model = digits_model(lambda r: answer, versions={1: "AVAILABLE", 2: "AVAILABLE"})
    r, fake = classify_with(tmp_path, png, model)
    assert r.status_code == 200, r.text
    assert r.json() == {"digit": 7, "probabilities": probs(7), "model": {"name": "digits", "version": 2}}
    assert r.headers["x-model-version"] == "2"
    [request] = fake.predicts
    spec = request.model_spec
    # The latest version is asked for; the serving client pins it per replica and names it.
    assert (spec.name, spec.signature_name, spec.version, spec.version_label) == (
        "digits", "serving_default", None, None
    )  # fmt: skip
    image = request.inputs["image"]
    assert image.shape == (1, 8, 8, 1) and image.dtype == DataType.DT_FLOAT
    assert max(image.values) == 16.0  # the preprocessed grid: 0..16, the darkest cell 16


def test_a_single_unnamed_output_is_the_one_asked_for(tmp_path: Path, png: bytes) -> None:
    # TF Serving's REST answer for a one-output signature does not name it.
    r, _ = classify_with(tmp_path, png, digits_model(lambda req: {"": Tensor((1, 10), probs(4))}))
    assert r.status_code == 200 and r.json()["digit"] == 4


def test_a_model_with_no_version_left_is_a_misconfiguration(tmp_path: Path, png: bytes) -> None:
    # Retrying a version that went away on another replica is the serving client's
    # (tests/api/test_replica_versions.py); what reaches the route is NOT_FOUND.
    model = digits_model(lambda r: {"probabilities": Tensor((1, 10), probs(1))}, versions={3: "AVAILABLE"}, gone={3})
    r, fake = classify_with(tmp_path, png, model)
    assert r.status_code == 503 and r.json()["code"] == "serving_misconfigured"
    assert [p.model_spec.version for p in fake.predicts] == [None]


@pytest.mark.parametrize(
    "outputs",
    [
        {"probabilities": Tensor((1, 9), [0.1] * 9)},  # 9 classes
        {"probabilities": Tensor((2, 10), probs(1) + probs(2))},  # 2 rows for 1 image
        {"probabilities": Tensor((1, 10), [0.1] * 9 + [2.0])},  # not a probability
        {"probabilities": Tensor((1, 10), [0.1] * 9 + [float("nan")])},
        {"probabilities": Tensor((1, 10), [b"a"] * 10)},  # not numbers
        {"probabilities": Tensor((10,), [0.1] * 10)},  # no batch dimension
        {"other": Tensor((1, 10), probs(1))},  # not the output asked for
    ],
)
def test_a_malformed_answer_is_502(tmp_path: Path, png: bytes, outputs: dict[str, Tensor]) -> None:
    def answer(request: PredictRequest) -> dict[str, Tensor]:
        return outputs

    r, _ = classify_with(tmp_path, png, digits_model(answer))
    assert r.status_code == 502, r.text
    assert r.json()["code"] == "serving_bad_response"


PROBE = """
import sys
from fastapi.testclient import TestClient
from api.app import create_app
from api.config.settings import Settings
from api.request.admission.rules import multipart_boundary
from models.digits_data import encode, load_split, render
from tests.support import EXAMPLE_ROUTES

png = encode(render(load_split().test_x[0]))
settings = Settings(model_routes=EXAMPLE_ROUTES.split(","), serving_url="http://127.0.0.1:9")
with TestClient(create_app(settings)) as client:
    r = client.post("/v1/digits/classify", files={"image": ("d.png", png, "image/png")})
    assert r.status_code == 503, r.text  # preprocessed, then serving unreachable
heavy = sorted(m for m in sys.modules if m.split(".")[0] in {"tensorflow", "keras", "tensorflow_serving"})
print("HEAVY:" + ",".join(heavy))
"""


def test_digits_path_does_not_import_tensorflow() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "HEAVY:", out.stdout


@pytest.mark.parametrize(
    "body",
    [
        # The upload's bytes, then the body ends: no closing boundary.
        b'--b\r\nContent-Disposition: form-data; name="image"; filename="d.png"\r\nContent-Type: image/png\r\n\r\n'
        + b"\x89PNG\r\n\x1a\n" * 100,
        b"",  # no part at all: a multipart body has at least one, and a closing boundary
    ],
    ids=["cut-short", "empty"],
)
def test_a_broken_multipart_upload_is_400(client: TestClient, body: bytes) -> None:
    r = client.post(URL, content=body, headers={"content-type": "multipart/form-data; boundary=b"})
    assert r.status_code == 400, r.text
    assert r.json()["code"] == "bad_request" and "closing boundary" in r.json()["detail"]


@pytest.mark.parametrize(
    "content_type",
    [
        b"multipart/form-data; boundary=b", b"Multipart/Form-Data;BOUNDARY=b", b'multipart/form-data; boundary="a;b"',
        b'multipart/form-data; boundary="a \\"b\\\\c"; charset=utf-8', b"multipart/form-data ; boundary=----x",
        b"multipart/form-data; boundary=", b"multipart/form-data", b"multipart/form-data; boundary*=utf-8''b",
        b"multipart/mixed; boundary=b", b"application/json",
    ],
)  # fmt: skip
def test_the_close_watch_reads_the_boundary_the_form_parser_reads(content_type: bytes) -> None:
    from python_multipart.multipart import parse_options_header

    media_type, params = parse_options_header(content_type)
    parsers = params.get(b"boundary") if media_type == b"multipart/form-data" else None
    assert multipart_boundary(content_type) == (parsers or None)


def test_a_whole_form_without_the_image_field_is_still_422(client: TestClient) -> None:
    body = b'--b\r\nContent-Disposition: form-data; name="picture"; filename="d.png"\r\n\r\nabc\r\n--b--\r\n'
    r = client.post(URL, content=body, headers={"content-type": "multipart/form-data; boundary=b"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "image"]
