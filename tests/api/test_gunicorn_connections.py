"""The API under gunicorn (`gunicorn.conf.py`) against hostile connections, on loopback.

gunicorn starts under a soft open-files limit of 512 (its hard limit stays higher), two
workers, `API_WORKER_CONNECTIONS=64`. Checks that the workers run with the soft limit raised
to the hard one, and that an idle-connection flood several times the cap, a slow head and a
huge head leave `/healthz` answering and no worker restarted. No serving tier is needed:
`/healthz` never calls it.
"""

from __future__ import annotations

import resource
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.api.test_gunicorn import children
from tests.support import Proc, free_port, http_ok, wait_until

WORKERS = 2
CAP = 64
FLOOD = 6 * CAP


def soft_nofile(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no open-files limit")


@pytest.fixture
def gunicorn(tmp_path: Path) -> Iterator[tuple[Proc, str]]:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard <= 512:
        pytest.skip(f"hard open-files limit {hard} leaves nothing to raise")
    port = free_port()
    proc = Proc(
        [
            "prlimit",
            "--nofile=512:",  # soft only: what a container runtime commonly gives
            sys.executable,
            "-m",
            "gunicorn",
            "-c",
            "gunicorn.conf.py",
            "api.app:create_app()",
        ],
        tmp_path / "gunicorn.log",
        env={
            "WEB_CONCURRENCY": str(WORKERS),
            "API_BIND": f"127.0.0.1:{port}",
            "API_WORKER_CONNECTIONS": str(CAP),
            "API_HEADER_TIMEOUT_S": "1",
            "SERVING_URL": "http://127.0.0.1:9",
            "EVENTS_JSONL_PATH": str(tmp_path / "events.jsonl"),
            "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "prometheus"),
            "ACCESS_LOG": "false",
        },
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: proc.alive() and http_ok(base + "/healthz"), 60, "gunicorn")
        wait_until(lambda: len(children(proc.popen.pid)) == WORKERS, 30, "both workers")
        yield proc, base
    finally:
        assert proc.stop() == 0, proc.log()


def test_workers_run_with_the_open_files_limit_raised(gunicorn: tuple[Proc, str]) -> None:
    proc, _ = gunicorn
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    for pid in [proc.popen.pid, *children(proc.popen.pid)]:
        assert soft_nofile(pid) == hard


def test_floods_of_idle_slow_and_huge_heads_leave_the_workers_answering(gunicorn: tuple[Proc, str]) -> None:
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
        metrics = httpx.get(base + "/metrics", timeout=5).text
        assert 'api_connections_closed_total{reason="evicted"}' in metrics
    finally:
        for s in idle + slow:
            s.close()
    assert set(children(proc.popen.pid)) == workers, "a worker was restarted"
    assert "WORKER TIMEOUT" not in proc.log()
