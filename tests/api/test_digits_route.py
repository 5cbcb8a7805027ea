"""`POST /v1/digits/classify` in process: upload limits and input errors, and the
classifier's contract with serving through a fake `ServingClient` (the client's public
protocol; the wire formats are the transports' own tests').

The route tests point the app at a port where nothing listens: every case here is
answered before serving would be called (serving itself is covered end to end in
tests/test_digits_end_to_end.py).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.deadlines import Deadline
from api.digits import Classes, DigitClassifier, images_tensor
from api.routes.digits import MULTIPART_ALLOWANCE_BYTES
from api.scoring import ServedModel
from api.serving_client import (
    DataType,
    ModelStatus,
    PredictRequest,
    PredictResponse,
    ServingBadResponse,
    ServingNotFound,
    Tensor,
    VersionStatus,
)
from api.settings import Settings
from models.digits_data import encode, load_split, render
from tests.support import REPO

URL = "/v1/digits/classify"
IMAGE_LIMIT = 50_000


@pytest.fixture(scope="module")
def png() -> bytes:
    return encode(render(load_split().test_x[0]))


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    settings = Settings(serving_url="http://127.0.0.1:9", digits_max_image_bytes=IMAGE_LIMIT)
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
    assert body["detail"] == f"image is larger than {IMAGE_LIMIT} bytes"
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


# --- DigitClassifier against a fake serving client -----------------------------------


class FakeServing:
    """A `ServingClient` answering model status and predict, recording the predicts."""

    def __init__(self, *, versions: list[int], outputs: dict[str, Tensor], missing: frozenset[int] = frozenset()):
        self.versions = versions
        self.outputs = outputs
        self.missing = missing
        self.predicts: list[PredictRequest] = []

    async def model_status(self, model_name: str, deadline: Deadline) -> ModelStatus:
        assert model_name == "digits"
        return ModelStatus(tuple(VersionStatus(v, "AVAILABLE") for v in self.versions))

    async def predict(self, request: PredictRequest, deadline: Deadline) -> PredictResponse:
        self.predicts.append(request)
        if request.model_spec.version in self.missing:
            raise ServingNotFound(f"Servable not found: version {request.model_spec.version}")
        return PredictResponse(self.outputs)

    async def aclose(self) -> None:
        pass


GRID = [[[float(r + c)] for c in range(8)] for r in range(8)]


def unnamed(rows: list[list[float]]) -> dict[str, Tensor]:
    """A single unnamed output, as TF Serving's REST answer for a one-output signature has it."""
    return {"": Tensor.from_rows(rows)}


async def classify_with(fake: FakeServing, n_images: int = 1) -> Classes:
    classifier = DigitClassifier(
        ServedModel(fake, model_name="digits", version_ttl_s=60.0, status_timeout_s=2.0)
    )
    return await classifier.classify([GRID] * n_images, Deadline.after(5.0))


def probs(hot: int) -> list[float]:
    return [0.91 if d == hot else 0.01 for d in range(10)]


@pytest.mark.anyio
async def test_classifier_sends_the_signature_and_pins_the_version() -> None:
    fake = FakeServing(versions=[1, 2], outputs=unnamed([probs(7), probs(2)]))
    classes = await classify_with(fake, n_images=2)
    assert classes.version == 2
    assert classes.probabilities == [probs(7), probs(2)]
    [request] = fake.predicts
    assert (request.model_spec.name, request.model_spec.signature_name, request.model_spec.version) == (
        "digits", "serving_default", 2,
    )  # fmt: skip
    image = request.inputs["image"]
    assert image.shape == (2, 8, 8, 1) and image.dtype == DataType.DT_FLOAT
    assert image.values[3 * 8 + 5] == 8.0  # row-major [batch, row, col, channel]


@pytest.mark.anyio
async def test_classifier_accepts_the_named_output_too() -> None:
    fake = FakeServing(versions=[1], outputs={"probabilities": Tensor.from_rows([probs(4)])})
    assert (await classify_with(fake)).probabilities == [probs(4)]


@pytest.mark.anyio
async def test_classifier_rereads_status_once_when_the_version_went_away() -> None:
    fake = FakeServing(versions=[3], outputs=unnamed([probs(1)]), missing=frozenset({3}))
    with pytest.raises(ServingNotFound):
        await classify_with(fake)
    assert [p.model_spec.version for p in fake.predicts] == [3, 3]


@pytest.mark.anyio
@pytest.mark.parametrize(
    "outputs",
    [
        unnamed([[0.1] * 9]),  # 9 classes
        unnamed([probs(1), probs(2)]),  # 2 rows for 1 image
        unnamed([[0.1] * 9 + [2.0]]),  # not a probability
        unnamed([[0.1] * 9 + [float("nan")]]),
        {"": Tensor((1, 10), [b"a"] * 10)},  # not numbers
        {"": Tensor((10,), [0.1] * 10)},  # no batch dimension
        {"other": Tensor.from_rows([probs(1)])},  # not the output asked for
    ],
)
async def test_classifier_refuses_a_malformed_answer(outputs: dict[str, Tensor]) -> None:
    with pytest.raises(ServingBadResponse):
        await classify_with(FakeServing(versions=[1], outputs=outputs))


def test_images_tensor_checks_the_grid() -> None:
    tensor = images_tensor([GRID, GRID])
    assert tensor.shape == (2, 8, 8, 1) and tensor.dtype == DataType.DT_FLOAT
    assert tensor.values[3 * 8 + 5] == 8.0
    with pytest.raises(ValueError, match="8×8×1"):
        images_tensor([GRID[:7]])
    with pytest.raises(ValueError, match="at least one"):
        images_tensor([])


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


PROBE = """
import sys
from fastapi.testclient import TestClient
from api.app import create_app
from api.settings import Settings
from models.digits_data import encode, load_split, render

png = encode(render(load_split().test_x[0]))
with TestClient(create_app(Settings(serving_url="http://127.0.0.1:9"))) as client:
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
