"""Every error answered on the OIP's paths has the spec's `error`, whoever answers it; a client
that hangs up mid-body is a 400 like on a model route, never a 500.

The API runs under gunicorn as deployed (one worker, so the HTTP server's own refusals are
`api.http_server.ApiHttpProtocol`'s) with one request in flight at most, in front of the fake
serving tier (nothing here reaches a model). Raw sockets are the clients.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import orjson
import pytest

from tests.api.stack import launch_fake, wait_ready
from tests.http_hardening.wire import connect, read_response
from tests.support import Process, free_port, http_ok, ops_url, start_gunicorn, wait_until

INFER = "/v2/models/fraud/infer"


@dataclass(frozen=True)
class Api:
    port: int
    proc: Process


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    tmp = tmp_path_factory.mktemp("oip-errors")
    fake = launch_fake(tmp, "serving")
    wait_ready(fake)
    port = free_port()
    proc = start_gunicorn(
        tmp / "gunicorn.log",
        WEB_CONCURRENCY="1",
        API_BIND=f"127.0.0.1:{port}",
        SERVING_URL=fake.url,
        OIP__MODELS="fraud",
        MAX_IN_FLIGHT_REQUESTS="1",
        API_HEADER_TIMEOUT_S="1",  # a slow head's 408 within a test's time
        PROMETHEUS_MULTIPROC_DIR=str(tmp / "prometheus"),
    )
    try:
        wait_until(lambda: http_ok(f"http://127.0.0.1:{port}/v2/health/live"), 60, "gunicorn")
        yield Api(port, proc)
    finally:
        proc.stop()
        fake.proc.stop()


def _answer(port: int, request: bytes) -> tuple[int, dict]:
    with connect(port) as s:
        s.sendall(request)
        status, _, body = read_response(s)
    return status, orjson.loads(body)


def _assert_oip_error(document: dict, code: str) -> None:
    # OIP's field, first, and the API's own fields beside it.
    assert list(document)[:2] == ["error", "detail"], document
    assert document["error"] == document["detail"] and document["code"] == code, document
    assert document["request_id"], document


def _started_body(port: int, declared: int = 1000, sent: int = 10) -> socket.socket:
    """A connection whose infer request announced `declared` bytes and sent `sent` of them."""
    s = connect(port)
    s.sendall(
        f"POST {INFER} HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
        f"Content-Length: {declared}\r\n\r\n".encode()
        + b"{" * sent
    )
    return s


def test_the_http_servers_414_and_431_on_oip_paths_carry_error(api: Api) -> None:
    status, document = _answer(api.port, f"GET /v2/models/{'m' * 5000} HTTP/1.1\r\nHost: a\r\n\r\n".encode())
    assert status == 414
    _assert_oip_error(document, "uri_too_long")
    assert document["error"] == "the request target is longer than 4094 bytes"
    fields = "".join(f"x-f{i}: v\r\n" for i in range(150))
    status, document = _answer(api.port, f"GET /v2/health/ready HTTP/1.1\r\nHost: a\r\n{fields}\r\n".encode())
    assert status == 431
    _assert_oip_error(document, "request_header_fields_too_large")
    # Elsewhere the API's shape stays as it was.
    status, document = _answer(api.port, f"GET /v1/{'m' * 5000} HTTP/1.1\r\nHost: a\r\n\r\n".encode())
    assert status == 414 and "error" not in document and document["code"] == "uri_too_long", document


def test_the_http_servers_408_for_a_slow_head_on_an_oip_path_carries_error(api: Api) -> None:
    with connect(api.port) as s:
        s.sendall(f"GET {INFER} HTTP/1.1\r\nHost: a\r\n".encode())  # the head never ends
        status, _, body = read_response(s)
    assert status == 408
    _assert_oip_error(orjson.loads(body), "request_timeout")


def test_the_503_at_the_in_flight_limit_on_infer_carries_error(api: Api) -> None:
    held = _started_body(api.port)  # in the app, waiting for its body: the one request in flight
    try:
        request = f"POST {INFER} HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n{{}}".encode()
        answers: list[tuple[int, dict]] = []

        def refused() -> bool:
            answers.append(_answer(api.port, request))
            return answers[-1][0] == 503

        wait_until(refused, 10, "a 503 at the in-flight limit")
        document = answers[-1][1]
        _assert_oip_error(document, "overloaded")
        assert document["error"].startswith("at the limit of requests in flight (1 of 1"), document
        # The probes are never refused for load, OIP's as the API's own.
        for probe in ("/v2/health/live", "/healthz"):
            status, _ = _answer(api.port, f"GET {probe} HTTP/1.1\r\nHost: a\r\n\r\n".encode())
            assert status == 200, probe
    finally:
        held.close()


def test_a_client_gone_mid_body_is_a_400_not_a_500(api: Api) -> None:
    log = api.proc.log_path
    before = log.read_text()
    _started_body(api.port).close()
    # Its line in the access log is written once the app has answered (to no one).
    wait_until(lambda: f"POST {INFER} " in log.read_text()[len(before) :], 10, "its access log line")
    time.sleep(0.2)  # and whatever else it logs
    written = log.read_text()[len(before) :]
    assert f"POST {INFER} 400" in written, written
    assert "Traceback" not in written and "ClientDisconnect" not in written and "unhandled" not in written, written
    metrics = httpx.get(f"{ops_url(api.proc)}/metrics").text
    infer = [line for line in metrics.splitlines() if INFER.replace("fraud", "{model_name}") in line]
    assert any('status="400"' in line for line in infer), infer
    assert not any('status="500"' in line for line in infer), infer
