"""Every non-2xx answer of the API has one JSON shape: {"detail", "code", "request_id"} (and OIP's
"error" first on the /v2 paths).

In process (FastAPI's TestClient runs the real app, lifespan included), with serving
pointed at a port where nothing listens, plus the pure helpers that bound 422 bodies.
"""

from __future__ import annotations

from collections.abc import Iterator

import orjson
import pytest
from fastapi import APIRouter
from fastapi.testclient import TestClient

from api.app import create_app
from api.config.settings import Settings
from api.request.errors import (
    ERROR_TABLE,
    MAX_VALIDATION_ERRORS,
    bounded,
    bounded_validation_errors,
    classify,
    error_document,
)
from api.serving_client import (
    Code,
    DeadlineExceeded,
    ServingBadResponse,
    ServingInternalError,
    ServingMisconfigured,
    ServingNotFound,
    ServingRejected,
    ServingTimeout,
    ServingUnavailable,
)
from tests.api.stack import transactions
from tests.support import EXAMPLE_ROUTES

SCORE = "/v1/fraud/score"


def assert_error_shape(response, status: int, code: str) -> dict:  # type: ignore[no-untyped-def]
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == {"detail", "code", "request_id"}, body
    assert body["code"] == code
    assert body["request_id"] == response.headers["x-request-id"]
    return body


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    settings = Settings(
        model_routes=EXAMPLE_ROUTES.split(","),
        serving_url="http://127.0.0.1:9",
        events_jsonl_path=tmp_path_factory.mktemp("events") / "events.jsonl",
        serving_max_attempts=1,
    )
    app = create_app(settings)
    boom = APIRouter()

    @boom.get("/_test/boom")
    async def explode() -> None:
        raise RuntimeError("secret internals")

    app.include_router(boom)
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def test_serving_down_is_503_in_the_shape(client: TestClient) -> None:
    response = client.post(SCORE, json=transactions(1)[0])
    body = assert_error_shape(response, 503, "serving_unavailable")
    assert body["detail"].startswith("serving tier: ")
    assert "127.0.0.1:9" not in body["detail"]
    assert response.headers["retry-after"] == "1"


def test_validation_errors_keep_fastapis_list(client: TestClient) -> None:
    body = {**transactions(1)[0], "amount": -5}
    detail = assert_error_shape(client.post(SCORE, json=body), 422, "validation_error")["detail"]
    assert detail[0]["loc"] == ["body", "amount"] and detail[0]["type"] == "greater_than"


def test_422_bodies_stay_small_however_large_the_request(client: TestClient) -> None:
    huge = {f"field_{i}": "x" * 1000 for i in range(40)}  # 40 KB, under the body limit
    response = client.post(SCORE, json={**transactions(1)[0], **huge})
    detail = assert_error_shape(response, 422, "validation_error")["detail"]
    assert len(response.content) < 12_000
    assert len(detail) == MAX_VALIDATION_ERRORS + 1 and detail[-1]["type"] == "too_many_errors"
    assert all(len(str(e.get("input", ""))) <= 201 for e in detail)


@pytest.mark.parametrize(
    "replace",
    [
        (b'"amount":', b'"amount":100000000000000000000000,"was":'),  # beyond 64 bits
        (b'"user_history":{', b'"user_history":{"txn_count_24h":-99999999999999999999,"x":'),
        (b'{', b'{"zz":99999999999999999999999,'),  # in an unknown field
        (b'"user_id":"', b'"user_id":"\\ud800'),  # a lone surrogate, valid JSON text
    ],
)
def test_inputs_json_allows_but_utf8_or_64_bits_cannot_hold_are_422_not_500(
    client: TestClient, replace: tuple[bytes, bytes]
) -> None:
    import orjson

    raw = orjson.dumps(transactions(1)[0]).replace(*replace, 1)
    response = client.post(SCORE, content=raw, headers={"content-type": "application/json"})
    assert response.status_code in (200, 422), response.text
    if response.status_code == 422:
        assert_error_shape(response, 422, "validation_error")


def test_a_repeated_timeout_header_is_refused(client: TestClient) -> None:
    response = client.post(
        SCORE, json=transactions(1)[0], headers=[("X-Request-Timeout-Ms", "5"), ("X-Request-Timeout-Ms", "abc")]
    )
    detail = assert_error_shape(response, 422, "validation_error")["detail"]
    assert detail[0]["loc"] == ["header", "x-request-timeout-ms"] and detail[0]["input"] == "5, abc"


def test_a_container_echo_with_a_surrogate_stays_json(client: TestClient) -> None:
    raw = b'["\\ud800", "x", 100000000000000000000000]'
    response = client.post(SCORE, content=raw, headers={"content-type": "application/json"})
    detail = assert_error_shape(response, 422, "validation_error")["detail"]
    assert detail[0]["input"] == ["\\ud800", "x", "100000000000000000000000"]


@pytest.mark.parametrize("depth", [100, 300, 900])
def test_a_deeply_nested_object_is_summarised_like_any_large_one(client: TestClient, depth: int) -> None:
    """Deeper than orjson writes (255 levels) it was echoed as a Python repr."""
    raw = b'{"a":' * depth + b"{}" + b"}" * depth
    response = client.post(SCORE, content=raw, headers={"content-type": "application/json"})
    detail = assert_error_shape(response, 422, "validation_error")["detail"]
    echoes = [error["input"] for error in detail if isinstance(error.get("input"), str) and "'a'" in error["input"]]
    assert echoes == []
    assert f"<object of {len(raw)} bytes, not echoed>" in [error.get("input") for error in detail]


def test_http_errors_and_bugs_use_the_shape(client: TestClient) -> None:
    assert_error_shape(client.get("/nowhere"), 404, "not_found")
    assert_error_shape(client.get(SCORE), 405, "method_not_allowed")
    body = assert_error_shape(client.get("/_test/boom"), 500, "internal_error")
    assert "secret" not in body["detail"]


def test_timeout_header_and_body_limit_answers_use_the_shape(client: TestClient) -> None:
    assert_error_shape(
        client.post(SCORE, json={}, headers={"x-request-timeout-ms": "-1"}), 422, "validation_error"
    )
    body = assert_error_shape(client.post(SCORE, content=b"x" * (70 * 1024)), 413, "payload_too_large")
    # The 413 names the setting that raises the route's limit.
    assert body["detail"] == (
        "request body is larger than 65536 bytes (raise the limit with MODELS__FRAUD__MAX_BODY_BYTES)"
    )
    unknown = assert_error_shape(client.post("/nowhere", content=b"x" * (70 * 1024)), 413, "payload_too_large")
    assert unknown["detail"].endswith("(raise the limit with MAX_BODY_BYTES)")


@pytest.mark.parametrize(
    ("exc", "status", "code"),
    [
        (DeadlineExceeded("late"), 504, "deadline_exceeded"),
        (ServingTimeout("slow"), 504, "deadline_exceeded"),
        (ServingUnavailable("down"), 503, "serving_unavailable"),
        (ServingUnavailable("full", Code.RESOURCE_EXHAUSTED), 503, "serving_unavailable"),
        (ServingNotFound("no model"), 503, "serving_misconfigured"),
        (ServingMisconfigured('Serving signature key "x" not found.'), 503, "serving_misconfigured"),
        (ServingRejected("bad input"), 502, "serving_rejected"),
        (ServingBadResponse("NaN"), 502, "serving_bad_response"),
        (ServingInternalError("boom"), 502, "serving_error"),
    ],
)
def test_the_one_table(exc: Exception, status: int, code: str) -> None:
    assert classify(exc)[:2] == (status, code)


def test_an_error_on_an_oip_path_has_its_error_field_first_even_with_the_front_off(client: TestClient) -> None:
    response = client.get("/v2/models/fraud")  # no OIP routes in this app: Starlette's 404
    assert response.status_code == 404
    assert response.json() == {
        "error": "Not Found",
        "detail": "Not Found",
        "code": "not_found",
        "request_id": response.headers["x-request-id"],
    }


@pytest.mark.parametrize(
    ("path", "oip"),
    [("/v2", True), ("/v2/models/m/infer", True), ("/v2?x=1", True), ("/v2x", False), ("/v1/v2", False), ("", False)],
)
def test_the_error_document_is_chosen_by_path(path: str, oip: bool) -> None:
    detail = [{"msg": "a"}, {"msg": "b"}]  # a 422's list: `error` is its messages as one line
    document = orjson.loads(error_document("validation_error", detail, "id", path))
    assert ("error" in document) is oip
    if oip:
        assert list(document) == ["error", "detail", "code", "request_id"] and document["error"] == "a; b"


def test_every_table_row_is_reachable() -> None:
    classes = [row[0] for row in ERROR_TABLE]
    for i, cls in enumerate(classes):  # no row is shadowed by a more general one above it
        assert not any(issubclass(cls, earlier) for earlier in classes[:i]), cls


def test_bounded_echoes() -> None:
    assert bounded("short") == "short"
    assert bounded("y" * 500) == "y" * 200 + "…"
    assert bounded({"a": 1}) == {"a": 1}
    assert bounded(list(range(1000))).startswith("<array of ")
    deep: list[object] = []
    text = "[]"  # its JSON, as echoes write it: the surrogate escaped, the integer as digits
    for _ in range(600):
        deep = [deep, "\ud800", 2**70]
        text = f'[{text},"\\\\ud800","{2**70}"]'
    assert bounded(deep) == f"<array of {len(text)} bytes, not echoed>"
    assert bounded(b"\xff" * 300).endswith("…")
    errors = [
        {"type": "t", "loc": ("body", "x" * 100), "msg": "m", "input": "z" * 10_000, "ctx": {"error": ValueError("v")}}
    ]
    [item] = bounded_validation_errors(errors)
    assert len(item["loc"][1]) == 65 and len(item["input"]) == 201 and item["ctx"] == {"error": "v"}
