"""The API under gunicorn (`gunicorn.conf.py`) against hostile connections, on loopback.

gunicorn starts under a soft open-files limit of 512 (its hard limit stays higher), two
workers, `API_WORKER_CONNECTIONS=64`. Checks that the workers run with the soft limit raised
to the hard one, that an idle-connection flood several times the cap, a slow head and a
huge head leave `/healthz` answering and no worker restarted, and that a body over the
limit is answered a 413 every common client reads. No serving tier is needed: `/healthz`
never calls it, and a 413 is answered before the route.
"""

from __future__ import annotations

import json
import resource
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import requests

from tests.api.test_gunicorn import children
from tests.support import Process, free_port, http_ok, ops_url, start_gunicorn, wait_until

pytestmark = pytest.mark.http_hardening  # on uvicorn's internals: .ci/run runs these on its newest release too

WORKERS = 2
CAP = 64
FLOOD = 6 * CAP


def soft_nofile(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no open-files limit")


@pytest.fixture
def gunicorn(tmp_path: Path) -> Iterator[tuple[Process, str]]:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard <= 512:
        pytest.skip(f"hard open-files limit {hard} leaves nothing to raise")
    port = free_port()
    proc = start_gunicorn(
        tmp_path / "gunicorn.log",
        prefix=["prlimit", "--nofile=512:"],  # soft only: what a container runtime commonly gives
        WEB_CONCURRENCY=str(WORKERS),
        API_BIND=f"127.0.0.1:{port}",
        API_WORKER_CONNECTIONS=str(CAP),
        API_HEADER_TIMEOUT_S="1",
        SERVING_URL="http://127.0.0.1:9",
        EVENTS_JSONL_PATH=str(tmp_path / "events.jsonl"),
        PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "prometheus"),
        ACCESS_LOG="false",
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: proc.alive() and http_ok(base + "/healthz"), 60, "gunicorn")
        wait_until(lambda: len(children(proc.popen.pid)) == WORKERS, 30, "both workers")
        yield proc, base
    finally:
        assert proc.stop() == 0, proc.log()


def test_workers_run_with_the_open_files_limit_raised(gunicorn: tuple[Process, str]) -> None:
    proc, _ = gunicorn
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    for pid in [proc.popen.pid, *children(proc.popen.pid)]:
        assert soft_nofile(pid) == hard


def test_floods_of_idle_slow_and_huge_heads_leave_the_workers_answering(gunicorn: tuple[Process, str]) -> None:
    proc, base = gunicorn
    port = int(base.rsplit(":", 1)[1])
    workers = set(children(proc.popen.pid))
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(FLOOD)]
    slow = [socket.create_connection(("127.0.0.1", port)) for _ in range(CAP)]
    try:
        for s in slow:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # and never the rest
        with httpx.Client(timeout=5) as client:
            for _ in range(20):
                assert client.get(base + "/healthz", headers={"connection": "close"}).status_code == 200
            big = client.get(base + "/healthz", headers={"x-big": "a" * 100_000})
            assert big.status_code == 431
            assert big.json()["code"] == "request_header_fields_too_large"
        # The slow heads are cut off with 408 after API_HEADER_TIMEOUT_S (those not
        # already closed to make room for newer connections).
        time.sleep(1.5)
        assert http_ok(base + "/healthz")
        metrics = httpx.get(ops_url(proc) + "/metrics", timeout=5).text
        assert 'api_connections_closed_total{reason="evicted"}' in metrics
    finally:
        for s in idle + slow:
            s.close()
    assert set(children(proc.popen.pid)) == workers, "a worker was restarted"
    assert "WORKER TIMEOUT" not in proc.log()


BIG = 20 << 20  # far over both limits: MAX_BODY_BYTES (64 KiB) and the digits upload (2 MiB)


def oversize_bodies() -> dict[str, tuple[str, bytes]]:
    """Route -> (content type, a body of about BIG bytes)."""
    boundary = uuid.uuid4().hex
    multipart = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="image"; filename="digit.png"\r\n'
        "Content-Type: image/png\r\n\r\n"
    ).encode() + b"\x89PNG" + b"x" * BIG + f"\r\n--{boundary}--\r\n".encode()
    return {
        "/v1/fraud/score": ("application/json", b'{"pad": "' + b"x" * BIG + b'"}'),
        "/v1/digits/classify": (f"multipart/form-data; boundary={boundary}", multipart),
    }


def chunks(body: bytes) -> Iterator[bytes]:
    """The body as a stream: sent chunked (no Content-Length) by every client below."""
    for i in range(0, len(body), 1 << 16):
        yield body[i : i + (1 << 16)]


def via_urllib(url: str, ctype: str, body: bytes, chunked: bool) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=chunks(body) if chunked else body, headers={"content-type": ctype})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def via_requests(url: str, ctype: str, body: bytes, chunked: bool) -> tuple[int, dict]:
    answer = requests.post(url, data=chunks(body) if chunked else body, headers={"content-type": ctype}, timeout=30)
    return answer.status_code, answer.json()


def via_httpx(url: str, ctype: str, body: bytes, chunked: bool) -> tuple[int, dict]:
    answer = httpx.post(url, content=chunks(body) if chunked else body, headers={"content-type": ctype}, timeout=30)
    return answer.status_code, answer.json()


def via_curl(url: str, ctype: str, body: bytes, chunked: bool, tmp: Path) -> tuple[int, dict]:
    path = tmp / "body"
    path.write_bytes(body)
    framing = ["-H", "transfer-encoding: chunked"] if chunked else []
    headers = ["-H", f"content-type: {ctype}", *framing]
    out = subprocess.run(
        ["curl", "-s", "-w", "\n%{http_code}", *headers, "--data-binary", f"@{path}", url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    text, _, status = out.stdout.rpartition("\n")
    return int(status or 0), json.loads(text) if text else {}


def test_a_body_over_the_limit_is_a_413_every_client_reads(gunicorn: tuple[Process, str], tmp_path: Path) -> None:
    """urllib (sends `Connection: close` and its whole body before reading), requests, httpx
    and curl; with Content-Length and chunked; a JSON route and the multipart upload route."""
    _, base = gunicorn
    clients: dict[str, Callable[[str, str, bytes, bool], tuple[int, dict]]] = {
        "urllib": via_urllib,
        "requests": via_requests,
        "httpx": via_httpx,
        "curl": lambda url, ctype, body, chunked: via_curl(url, ctype, body, chunked, tmp_path),
    }
    seen = {}
    for route, (ctype, body) in oversize_bodies().items():
        for name, send in clients.items():
            for chunked in (False, True):
                status, answer = send(base + route, ctype, body, chunked)
                seen[(route, name, chunked)] = (status, answer.get("code"))
    assert set(seen.values()) == {(413, "payload_too_large")}, seen
