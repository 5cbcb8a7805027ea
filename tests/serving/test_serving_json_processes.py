"""``python -m serving``'s JSON worker processes (``--rest_api_num_json_processes``), for real:
a well-behaved client's latency while another posts large bodies, a worker killed in the middle
of a request, and a shutdown with a large request in flight.

Real processes on 127.0.0.1 (the server, its workers, a neighbour client process), bounded in
count and time. The server allows 8 MiB bodies and the neighbour sends 4 MiB ones: each holds the
codec for ~20 ms, so a client next to it would see it at once if the decoding were done in the
server process (measured on 2 shared cores: p99 of back-to-back one-row requests 1-4 ms quiet,
65-80 ms beside it with ``--rest_api_num_json_processes=0``, 3.6-4.8 ms with one worker).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest

from tests.serving.example_server import FRAUD_ROW, ExampleServer, running_example_server
from tests.support import REPO, wait_until

WORKER_MODULE = "serving.util.process_executor"
#: The neighbour's requests, their size, and the time they may take in all (a bound, not a target).
NEIGHBOUR_REQUESTS = 12
NEIGHBOUR_BODY_BYTES = 4 << 20
NEIGHBOUR_BOUND_S = 20.0
MAX_BODY_BYTES = 8 << 20
SMALL_URL = "/v1/models/fraud:predict"

# The neighbour: its own process, so its client work does not share a GIL with the measured client.
_NEIGHBOUR = """
import json, sys, time, httpx
url, path, count, bound_s = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
body = open(path, "rb").read()
statuses, sizes = {}, set()
deadline = time.monotonic() + bound_s
with httpx.Client(timeout=60) as client:
    print("started", flush=True)
    for _ in range(count):
        if time.monotonic() > deadline:
            break
        response = client.post(url, content=body, headers={"content-type": "application/json"})
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        sizes.add(len(response.content))
print(json.dumps({"statuses": statuses, "sizes": sorted(sizes)}), flush=True)
"""


def predict_body(size: int) -> tuple[bytes, int]:
    """The largest fraud ``:predict`` body of at most ``size`` bytes, and its row count."""
    row = orjson.dumps(FRAUD_ROW)
    rows = (size - len(b'{"instances":[]}')) // (len(row) + 1)
    body = b'{"instances":[' + b",".join([row] * rows) + b"]}"
    assert len(body) <= size
    return body, rows


def worker_pids(server: ExampleServer) -> set[int]:
    """The server's JSON worker processes (its children running :data:`WORKER_MODULE`)."""
    pids = set()
    for task in Path(f"/proc/{server.pid}/task").iterdir():
        try:  # threads and processes come and go while this reads
            children = (task / "children").read_text().split()
            pids |= {int(c) for c in children if WORKER_MODULE.encode() in Path(f"/proc/{c}/cmdline").read_bytes()}
        except FileNotFoundError:
            continue
    return pids


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def small_latencies(server: ExampleServer, seconds: float, until: threading.Event | None = None) -> list[float]:
    """One-row predictions back to back for ``seconds`` (or until ``until`` is set): their
    latencies in seconds; every answer must be right."""
    latencies = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not (until is not None and until.is_set()):
        started = time.monotonic()
        response = server.rest.post(SMALL_URL, json={"instances": [FRAUD_ROW]})
        latencies.append(time.monotonic() - started)
        assert response.status_code == 200 and len(response.json()["predictions"]) == 1, response.text
    return latencies


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExampleServer]:
    flag = f"--rest_api_max_body_bytes={MAX_BODY_BYTES}"
    with running_example_server(tmp_path_factory.mktemp("json-processes"), flag) as running:
        yield running


def test_a_client_keeps_its_latency_while_another_posts_large_bodies(
    server: ExampleServer, tmp_path: Path
) -> None:
    body, rows = predict_body(NEIGHBOUR_BODY_BYTES)
    path = tmp_path / "largest.json"
    path.write_bytes(body)
    for _ in range(3):  # warm both paths
        assert server.rest.post(SMALL_URL, content=body).status_code == 200
    small_latencies(server, 0.5)
    quiet = small_latencies(server, 3.0)
    (worker,) = worker_pids(server)
    worker_cpu, server_cpu = cpu_seconds(worker), cpu_seconds(server.pid)
    neighbour = subprocess.Popen(
        [sys.executable, "-c", _NEIGHBOUR, f"http://127.0.0.1:{server.rest_port}{SMALL_URL}", str(path),
         str(NEIGHBOUR_REQUESTS), str(NEIGHBOUR_BOUND_S)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert neighbour.stdout is not None and neighbour.stdout.readline().strip() == "started"
        done = threading.Event()
        threading.Thread(target=lambda: (neighbour.wait(NEIGHBOUR_BOUND_S + 30), done.set()), daemon=True).start()
        beside = small_latencies(server, NEIGHBOUR_BOUND_S, until=done)
        out, _ = neighbour.communicate(timeout=60)
    finally:
        neighbour.kill()
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    answered = result["statuses"].get("200", 0)
    assert result["statuses"] == {"200": answered} and answered >= 5, result
    assert len(result["sizes"]) == 1  # the same answer each time: rows predictions
    # The large bodies were decoded in the worker (~20 ms of CPU each there).
    worker_spent = cpu_seconds(worker) - worker_cpu
    server_spent = cpu_seconds(server.pid) - server_cpu
    assert worker_spent > 0.005 * answered, (worker_spent, answered)
    quiet_p99, beside_p99 = np.percentile(quiet, 99), np.percentile(beside, 99)
    summary = (f"quiet p99 {quiet_p99 * 1000:.1f} ms ({len(quiet)}), beside {beside_p99 * 1000:.1f} ms "
               f"({len(beside)}); {answered} x {rows} rows; worker CPU {worker_spent:.2f} s, "
               f"server CPU {server_spent:.2f} s")
    assert len(beside) >= 50, summary
    # Within 2x the quiet p99 as the benchmark's goal, with 10 ms of slack for a shared machine.
    assert beside_p99 <= max(2 * quiet_p99, quiet_p99 + 0.010), summary


def test_a_worker_killed_mid_request_fails_that_request_and_is_replaced(server: ExampleServer) -> None:
    body = deep_body()  # seconds of work in the worker: time enough to kill it in the middle
    (worker,) = worker_pids(server)
    before = cpu_seconds(worker)
    answer: dict[str, httpx.Response] = {}

    def send() -> None:
        with httpx.Client(timeout=60) as client:
            answer["response"] = client.post(
                f"http://127.0.0.1:{server.rest_port}{SMALL_URL}", content=body
            )

    sender = threading.Thread(target=send)
    sender.start()
    wait_until(lambda: cpu_seconds(worker) - before > 0.2, 20.0, "the worker busy with the deep body")
    os.kill(worker, signal.SIGKILL)
    sender.join(30)
    response = answer["response"]
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert "worker process died" in error and "SIGKILL" in error, error
    wait_until(lambda: len(worker_pids(server) - {worker}) == 1, 20.0, "a new worker")
    # Others are served all along, and the next large body goes to the new worker.
    assert server.rest.post(SMALL_URL, json={"instances": [FRAUD_ROW]}).status_code == 200
    body, rows = predict_body(1 << 20)
    response = server.rest.post(SMALL_URL, content=body)
    assert response.status_code == 200 and len(response.json()["predictions"]) == rows


def deep_body() -> bytes:
    """A body only the pure-Python parser takes (4 MB nested a million deep under a key nobody
    reads, valid for TF Serving): seconds of work in a worker."""
    depth = 1_000_000
    return (b'{"instances": [' + json.dumps(FRAUD_ROW).encode() + b'], "x":' + b"[1," * depth
            + b"1" + b"]" * depth + b"}")


def test_shutdown_answers_the_large_request_in_flight_and_ends_the_workers(tmp_path: Path) -> None:
    flag = f"--rest_api_max_body_bytes={MAX_BODY_BYTES}"
    with running_example_server(tmp_path, flag) as server:
        (worker,) = worker_pids(server)
        before = cpu_seconds(worker)
        answer: dict[str, httpx.Response] = {}

        def send() -> None:
            with httpx.Client(timeout=60) as client:
                answer["response"] = client.post(
                    f"http://127.0.0.1:{server.rest_port}{SMALL_URL}", content=deep_body()
                )

        sender = threading.Thread(target=send)
        sender.start()
        wait_until(lambda: cpu_seconds(worker) - before > 0.2, 20.0, "the worker busy with the deep body")
        server.proc.popen.send_signal(signal.SIGTERM)
        sender.join(60)
        assert server.proc.popen.wait(60) == 0, server.proc.log()
    response = answer["response"]
    assert response.status_code == 200 and len(response.json()["predictions"]) == 1, response.text
    wait_until(lambda: not Path(f"/proc/{worker}").exists(), 10.0, "the worker gone")
