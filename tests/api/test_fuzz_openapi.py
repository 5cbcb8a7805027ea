"""Fuzzing the API from its own OpenAPI schema, against the real processes.

`python -m serving` and the API (one uvicorn process) run on loopback. Schemathesis
reads the `/openapi.json` the API publishes and generates requests for every
operation in it: valid by the schema (`GenerationMode.POSITIVE`) and invalid
(`NEGATIVE`: wrong types, missing or unknown fields, bodies that are not JSON). On top
of that: a valid body with one field dropped, replaced by any JSON value or joined by
an unknown one; random bytes; GETs with random `X-Request-ID` and
`X-Request-Timeout-Ms` headers (the middleware reads those; the schema does not list
them); random bytes and corrupted PNGs as the multipart digits image.

For every answer: no 500, an answer within `TIMEOUT_S` (the client raises otherwise),
every non-2xx in the error shape of `api.request.errors` (`{"detail", "code", "request_id"}`,
`request_id` equal to the `X-Request-ID` header), and every 2xx body valid against the
operation's documented response schema (schemathesis' `response_schema_conformance`).
Bounded and reproducible: about 200 examples in all, `derandomize=True`, no example
database, no deadline.
"""

from __future__ import annotations

import copy
import string
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import Case, GenerationMode
from schemathesis.checks import response_schema_conformance

from tests.support import (
    REPO,
    Process,
    free_port,
    http_ok,
    start_api,
    start_example_serving,
)

# Per request. Far above any answer's real time (the API's own budget is
# REQUEST_TIMEOUT_S = 2 s), so only a hang trips it.
TIMEOUT_S = 10.0
SCORE = "/v1/fraud/score"
CLASSIFY = "/v1/digits/classify"
# Statuses an answer may have when the input is the only thing wrong or random.
CLIENT_ERRORS = {400, 404, 405, 413, 415, 422}


def fuzz(max_examples: int) -> settings:
    """Hypothesis settings of one fuzz run: reproducible, no deadline, bounded."""
    return settings(
        max_examples=max_examples,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


@dataclass
class Api:
    base_url: str
    client: httpx.Client
    schema: schemathesis.BaseSchema

    def call(self, case: Case, headers: dict[str, str] | None = None) -> schemathesis.Response:
        """Send a generated case; check the answer (see `check_answer`) and return it."""
        response = case.call(base_url=self.base_url, headers=headers, timeout=TIMEOUT_S)
        check_answer(response)
        case.validate_response(response, checks=[response_schema_conformance])
        return response


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    tmp = tmp_path_factory.mktemp("fuzz")
    api_port = free_port()
    serving = start_example_serving(tmp)
    api_proc: Process = start_api(
        api_port,
        serving.rest_url,
        tmp / "api.log",
        EVENTS_JSONL_PATH=str(tmp / "events.jsonl"),
        ACCESS_LOG="false",
    )
    base = f"http://127.0.0.1:{api_port}"

    try:
        serving.wait_available("fraud", "digits")
        api_proc.wait_ready(lambda: http_ok(f"{base}/readyz"), 60, "/readyz")
        with httpx.Client(base_url=base, timeout=TIMEOUT_S) as client:
            yield Api(base, client, schemathesis.openapi.from_url(f"{base}/openapi.json"))
    finally:
        api_proc.stop()
        serving.stop()
    log = api_proc.log_path.read_text()
    assert "Traceback" not in log, log[-4000:]


def _header(response: schemathesis.Response | httpx.Response, name: str) -> str:
    if isinstance(response, httpx.Response):
        return response.headers[name]
    values = {k.lower(): v for k, v in response.headers.items()}[name]
    return values[0] if isinstance(values, list) else values


def check_answer(response: schemathesis.Response | httpx.Response) -> None:
    """No 500; a non-2xx answer is in the API's error shape (see module doc)."""
    status = response.status_code
    assert status != 500, response.text
    if 200 <= status < 300:
        return
    assert _header(response, "content-type") == "application/json"
    body = response.json()
    assert set(body) == {"detail", "code", "request_id"}, body
    assert isinstance(body["code"], str) and body["code"], body
    assert isinstance(body["detail"], (str, list)), body
    assert body["request_id"] == _header(response, "x-request-id"), body


# --- generators --------------------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
# What a client could put in a header: printable ASCII (httpx refuses the rest).
header_text = st.text(alphabet=string.printable.strip(), max_size=40)


@st.composite
def mutated(draw: st.DrawFn, body: dict[str, Any]) -> dict[str, Any]:
    """A copy of `body` with one (possibly nested) field dropped, replaced or added."""
    body = copy.deepcopy(body)
    target = body
    # Walk into a nested object now and then (device, location, user_history).
    while draw(st.booleans()):
        nested = [k for k, v in target.items() if isinstance(v, dict) and v]
        if not nested:
            break
        target = target[draw(st.sampled_from(sorted(nested)))]
    keys = sorted(target)
    action = draw(st.sampled_from(["drop", "replace", "add"] if keys else ["add"]))
    if action == "drop":
        del target[draw(st.sampled_from(keys))]
    elif action == "replace":
        target[draw(st.sampled_from(keys))] = draw(json_values)
    else:
        key = draw(st.text(min_size=1, max_size=8).filter(lambda k: k not in target))
        target[key] = draw(json_values)
    return body


@st.composite
def corrupted_png(draw: st.DrawFn) -> bytes:
    """The example PNG truncated, or with a few bytes overwritten."""
    data = bytearray((REPO / "examples" / "digit-3.png").read_bytes())
    if draw(st.booleans()):
        return bytes(data[: draw(st.integers(0, len(data) - 1))])
    for _ in range(draw(st.integers(1, 8))):
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    return bytes(data)


def test_openapi_lists_every_operation_fuzzed_here(api: Api) -> None:
    operations = {
        (op.method.upper(), op.path) for op in (r.ok() for r in api.schema.get_all_operations())
    }
    assert {
        ("POST", SCORE),
        ("POST", CLASSIFY),
        ("GET", "/healthz"),
        ("GET", "/readyz"),
    } <= operations


# --- POST /v1/fraud/score ----------------------------------------------------------------------


def test_score_schema_valid_bodies_are_scored(api: Api) -> None:
    statuses: list[int] = []

    @fuzz(45)
    @given(case=api.schema[SCORE]["POST"].as_strategy(GenerationMode.POSITIVE))
    def run(case: Case) -> None:
        # The rollout headers are valid by the schema, but whether a client may pin a version
        # (and not both headers at once) is the rollout's to say: tests/api/test_rollout_route.py.
        for header in ("X-Model-Version", "X-Model-Label"):
            (case.headers or {}).pop(header, None)
        response = api.call(case)
        # Valid by the schema is valid for the API, except that JSON Schema's
        # date-time allows what pydantic's AwareDatetime refuses (no UTC offset,
        # years pydantic cannot represent).
        assert response.status_code in (200, 422), response.text
        if response.status_code == 422:
            locs = {tuple(e["loc"]) for e in response.json()["detail"]}
            assert locs == {("body", "timestamp")}, response.text
        statuses.append(response.status_code)

    run()
    assert statuses.count(200) > len(statuses) // 2, statuses


def test_score_schema_invalid_requests_are_refused_in_the_error_shape(api: Api) -> None:
    statuses: list[int] = []

    @fuzz(45)
    @given(case=api.schema[SCORE]["POST"].as_strategy(GenerationMode.NEGATIVE))
    def run(case: Case) -> None:
        response = api.call(case)
        # Negative cases include a wrong media type (415 is not ours to promise;
        # FastAPI answers 422) and bodies pydantic's lax mode still accepts ("12" for
        # a number is not JSON Schema-valid, but a valid amount): 200.
        assert response.status_code in CLIENT_ERRORS | {200}, response.text
        statuses.append(response.status_code)

    run()
    assert 422 in statuses, statuses


def test_score_valid_bodies_with_one_field_broken(api: Api) -> None:
    statuses: list[int] = []

    @fuzz(30)
    @given(case=api.schema[SCORE]["POST"].as_strategy(GenerationMode.POSITIVE), data=st.data())
    def run(case: Case, data: st.DataObject) -> None:
        case.body = data.draw(mutated(case.body) | json_values)
        response = api.call(case)
        # A mutation may leave a valid transaction (a new amount, say); else 422.
        assert response.status_code in (200, 422), response.text
        statuses.append(response.status_code)

    run()
    assert 422 in statuses, statuses


# --- GET endpoints -----------------------------------------------------------------------------


def test_get_endpoints_with_random_request_headers(api: Api) -> None:
    operations = [r.ok() for r in api.schema.get_all_operations() if r.ok().method.upper() == "GET"]
    cases = st.sampled_from(operations).flatmap(
        lambda op: st.sampled_from(list(GenerationMode)).flatmap(op.as_strategy)
    )

    @fuzz(40)
    @given(
        case=cases,
        request_id=st.none() | header_text,
        timeout_ms=st.none() | header_text | st.integers(-10, 10**12).map(str),
    )
    def run(case: Case, request_id: str | None, timeout_ms: str | None) -> None:
        headers = {}
        if request_id is not None:
            headers["X-Request-ID"] = request_id
        if timeout_ms is not None:
            headers["X-Request-Timeout-Ms"] = timeout_ms
        response = api.call(case, headers)
        # 504 when the caller's own budget (a few ms) runs out before serving answers.
        assert response.status_code in {200, 504} | CLIENT_ERRORS, response.text

    run()


# --- POST /v1/digits/classify (multipart) ------------------------------------------------------


def test_digits_schema_generated_uploads(api: Api) -> None:
    op = api.schema[CLASSIFY]["POST"]

    @fuzz(10)
    @given(case=st.sampled_from(list(GenerationMode)).flatmap(op.as_strategy))
    def run(case: Case) -> None:
        response = api.call(case)
        assert response.status_code in CLIENT_ERRORS, response.text

    run()


def test_digits_upload_of_random_bytes_never_fails_the_server(api: Api) -> None:
    op = api.schema[CLASSIFY]["POST"]
    statuses: list[int] = []

    @fuzz(30)
    @given(
        image=st.binary(max_size=2048) | corrupted_png(),
        filename=st.text(alphabet=string.ascii_letters + string.digits + "._-", max_size=20),
        content_type=st.sampled_from(["image/png", "image/jpeg", "application/octet-stream"]),
    )
    def run(image: bytes, filename: str, content_type: str) -> None:
        files = {"image": (filename or "x", image, content_type)}
        response = api.client.post(CLASSIFY, files=files)
        check_answer(response)
        response.request.read()  # schemathesis reads the request of what it validates
        op.Case().validate_response(response, checks=[response_schema_conformance])
        assert response.status_code in (200, 413, 422), response.text
        statuses.append(response.status_code)

    run()
    assert 422 in statuses, statuses
