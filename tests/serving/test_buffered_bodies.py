"""``--rest_api_max_buffered_body_bytes`` end to end: ``python -m serving`` with a 4 MiB budget.

Clients that send most of a large body and stall each hold it until the body read timeout. With
the budget full, one more large body is answered 503 at once (TF Serving's error body, the
connection closed, counted as ``reason="buffered_bytes"``), a small request is still answered,
and once the stalled clients are gone a large body is accepted again.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from tests.serving.example_server import FRAUD_ROW, ExampleServer, running_example_server
from tests.support import wait_until

pytestmark = pytest.mark.http_hardening  # on uvicorn's internals: .ci/run runs these on its newest release too

BUDGET = 4 * 1024 * 1024
LARGE = 1024 * 1024  # the server's --rest_api_max_body_bytes here: four of them fill the budget
PREDICT = "/v1/models/fraud:predict"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExampleServer]:
    workdir = tmp_path_factory.mktemp("buffered")
    with running_example_server(
        workdir, rest_api_max_buffered_body_bytes=BUDGET, rest_api_max_body_bytes=LARGE
    ) as running:
        yield running


def _large_body_head(port: int) -> socket.socket:
    """A connection that has sent the head of a :data:`LARGE` body."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(f"POST {PREDICT} HTTP/1.1\r\nHost: x\r\nContent-Length: {LARGE}\r\n\r\n".encode())
    return sock


def _stalled_body(port: int) -> socket.socket:
    """A connection that announced :data:`LARGE` bytes of body, sent all but one, and waits."""
    sock = _large_body_head(port)
    sock.sendall(b" " * (LARGE - 1))
    return sock


def _answer(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    answer = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def _large_predict(rows: int) -> bytes:
    return orjson.dumps({"instances": [FRAUD_ROW] * rows})


def test_full_budget_refuses_large_bodies_and_serves_small_ones(server: ExampleServer) -> None:
    port = server.rest_port
    before = server.limit_counts().get(("REST", "buffered_bytes"), 0.0)
    stalled = [_stalled_body(port) for _ in range(BUDGET // LARGE)]
    try:
        # Each stalled body is being received (the server has read it): the budget is full.
        time.sleep(0.5)
        started = time.monotonic()
        refused = _large_body_head(port)  # refused by its Content-Length, before any body
        answer = _answer(refused)
        took = time.monotonic() - started
        refused.close()
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503 "), answer[:300]
        assert b"connection: close" in head.lower()
        assert orjson.loads(body) == {
            "error": "Server is busy receiving other request bodies: they hold the limit of "
            f"{BUDGET} bytes (--rest_api_max_buffered_body_bytes); retry later"
        }
        assert took < 5.0

        # A chunked body (no Content-Length) is refused once it grows past 64 KiB.
        with socket.create_connection(("127.0.0.1", port), timeout=10) as chunked:
            head = f"POST {PREDICT} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            chunk = b" " * (100 * 1024)
            chunked.sendall(head.encode() + b"%x\r\n" % len(chunk) + chunk + b"\r\n")
            answer = _answer(chunked)  # and no more of the body is sent
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503 "), answer[:300]
        assert "--rest_api_max_buffered_body_bytes" in orjson.loads(body)["error"]

        # A small, well-behaved request is not counted and still answered.
        response = server.rest.post(PREDICT, json={"instances": [FRAUD_ROW]})
        assert response.status_code == 200, response.text
        assert len(response.json()["predictions"]) == 1
        assert server.limit_counts()[("REST", "buffered_bytes")] == before + 2
    finally:
        for sock in stalled:
            sock.close()

    # The stalled clients are gone: their bytes are released and a large body is accepted again.
    def large_accepted() -> bool:
        response = server.rest.post(PREDICT, content=_large_predict(2000))
        assert response.status_code in (200, 503), response.text
        return response.status_code == 200

    wait_until(large_accepted, 10.0, "a large body accepted once the stalled ones closed")
    response = server.rest.post(PREDICT, content=_large_predict(2000))
    assert response.status_code == 200 and len(response.json()["predictions"]) == 2000


def test_memory_of_stalled_bodies_is_given_back(tmp_path: Path) -> None:
    """300 stalled 1 MiB bodies (a 512 MiB budget) grow the server by some 300 MB; once their
    clients are gone the heap is trimmed and RSS comes back (without the trim it stayed)."""
    with running_example_server(tmp_path, rest_api_max_buffered_body_bytes=512 * LARGE) as server:
        time.sleep(0.5)
        before = server.rss_bytes()
        stalled = []
        try:
            for _ in range(300):
                stalled.append(_stalled_body(server.rest_port))
            wait_until(lambda: server.rss_bytes() > before + 290e6, 10.0, "the stalled bodies received")
        finally:
            for sock in stalled:
                sock.close()
        wait_until(lambda: server.rss_bytes() < before + 30e6, 10.0, "RSS back after the bodies closed")
        response = server.rest.post(PREDICT, json={"instances": [FRAUD_ROW]})
        assert response.status_code == 200
