"""``python -m serving``'s JSON worker processes (``--rest_api_num_json_processes``), for real:
large bodies are decoded in the worker while small ones are answered in the server, a worker
killed in the middle of a request, and a shutdown with a large request in flight.

Real processes on 127.0.0.1 (the server and its worker), bounded in count and time. Nothing here
measures speed: what a large neighbour costs the others' latency is the hostile-neighbour row of
``make bench-serving`` (``bench/serving_tier/neighbour.py``). The tests observe where the work is
done instead: the worker is a child process of the server, whose CPU time grows while it decodes,
and a worker stopped with SIGSTOP holds the large requests sent to it, and only those.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from serving.model_servers.http_rest_api_handler import CODEC_OFFLOAD_BODY_BYTES, CODEC_OFFLOAD_OUTPUT_ELEMENTS
from tests.serving.example_server import FRAUD_ROW, ExampleServer, running_example_server
from tests.support import children_running, wait_until

WORKER_MODULE = "serving.util.process_executor"
MAX_BODY_BYTES = 8 << 20
SMALL_URL = "/v1/models/fraud:predict"
#: Generous bounds (a loaded 2-core machine), not targets: one small request, a large one.
SMALL_TIMEOUT_S = 10.0
LARGE_TIMEOUT_S = 60.0
#: How long a large body stays unanswered while its worker is stopped, before it is let go: a
#: body decoded in the server would be answered in ~10 ms per MiB.
HELD_S = 0.5


def predict_body(size: int) -> tuple[bytes, int]:
    """The largest fraud ``:predict`` body of at most ``size`` bytes, and its row count."""
    row = orjson.dumps(FRAUD_ROW)
    rows = (size - len(b'{"instances":[]}')) // (len(row) + 1)
    body = b'{"instances":[' + b",".join([row] * rows) + b"]}"
    assert len(body) <= size
    return body, rows


def worker_pids(server: ExampleServer) -> set[int]:
    """The server's JSON worker processes (its children running :data:`WORKER_MODULE`)."""
    return children_running(server.pid, WORKER_MODULE)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Post:
    """One POST in a thread of its own; :attr:`response` once answered."""

    def __init__(self, server: ExampleServer, body: bytes) -> None:
        self.response: httpx.Response | None = None
        self._url = f"http://127.0.0.1:{server.rest_port}{SMALL_URL}"
        self._body = body
        self._thread = threading.Thread(target=self._send)
        self._thread.start()

    def _send(self) -> None:
        with httpx.Client(timeout=LARGE_TIMEOUT_S) as client:
            self.response = client.post(self._url, content=self._body)

    def answer(self) -> httpx.Response:
        self._thread.join(LARGE_TIMEOUT_S)
        assert self.response is not None, "no answer within the bound"
        return self.response


def assert_small_requests_answered(server: ExampleServer, count: int) -> None:
    """``count`` one-row predictions, one after another, each right and within its bound."""
    for _ in range(count):
        response = server.rest.post(SMALL_URL, json={"instances": [FRAUD_ROW]}, timeout=SMALL_TIMEOUT_S)
        assert response.status_code == 200 and len(response.json()["predictions"]) == 1, response.text


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExampleServer]:
    workdir = tmp_path_factory.mktemp("json-processes")
    with running_example_server(workdir, rest_api_max_body_bytes=MAX_BODY_BYTES) as running:
        yield running


def test_large_bodies_are_decoded_in_the_worker_while_small_ones_are_answered(server: ExampleServer) -> None:
    (worker,) = worker_pids(server)
    deep = post_deep_body_and_wait_for_its_decoding(server, worker)
    os.kill(worker, signal.SIGSTOP)  # in the middle of its decoding
    try:
        # Queued for the (one) worker: the largest body the default limit allows (decoded and
        # its answer encoded there), and one just large enough to be decoded there, whose
        # answer is encoded in the server.
        bodies = [predict_body(1 << 20), predict_body(128 << 10)]
        assert len(bodies[1][0]) >= CODEC_OFFLOAD_BODY_BYTES and bodies[1][1] < CODEC_OFFLOAD_OUTPUT_ELEMENTS
        held = [Post(server, body) for body, _ in bodies]
        assert_small_requests_answered(server, 20)
        time.sleep(HELD_S)
        # No large body was answered while the worker was stopped: they are decoded there.
        assert [post.response for post in (deep, *held)] == [None, None, None]
        assert_small_requests_answered(server, 5)
    finally:
        os.kill(worker, signal.SIGCONT)
    response = deep.answer()
    assert response.status_code == 200 and len(response.json()["predictions"]) == 1, response.text
    for post, (_, rows) in zip(held, bodies, strict=True):
        response = post.answer()
        assert response.status_code == 200 and len(response.json()["predictions"]) == rows, response.text
    assert worker_pids(server) == {worker}


def test_a_worker_killed_mid_request_fails_that_request_and_is_replaced(server: ExampleServer) -> None:
    (worker,) = worker_pids(server)
    deep = post_deep_body_and_wait_for_its_decoding(server, worker)
    os.kill(worker, signal.SIGKILL)
    response = deep.answer()
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert "worker process died" in error and "SIGKILL" in error, error
    wait_until(lambda: len(worker_pids(server) - {worker}) == 1, 20.0, "a new worker")
    # Others are served all along, and the next large body goes to the new worker.
    assert_small_requests_answered(server, 1)
    body, rows = predict_body(1 << 20)
    response = server.rest.post(SMALL_URL, content=body, timeout=LARGE_TIMEOUT_S)
    assert response.status_code == 200 and len(response.json()["predictions"]) == rows


def test_shutdown_answers_the_large_request_in_flight_and_ends_the_workers(tmp_path: Path) -> None:
    with running_example_server(tmp_path, rest_api_max_body_bytes=MAX_BODY_BYTES) as server:
        (worker,) = worker_pids(server)
        deep = post_deep_body_and_wait_for_its_decoding(server, worker)
        server.proc.send_signal(signal.SIGTERM)
        response = deep.answer()
        assert server.proc.wait(LARGE_TIMEOUT_S) == 0, server.proc.log()
    assert response.status_code == 200 and len(response.json()["predictions"]) == 1, response.text
    wait_until(lambda: not Path(f"/proc/{worker}").exists(), 10.0, "the worker gone")


def deep_body() -> bytes:
    """A body only the pure-Python parser takes (4 MB nested a million deep under a key nobody
    reads, valid for TF Serving): seconds of work in a worker."""
    depth = 1_000_000
    return (b'{"instances": [' + json.dumps(FRAUD_ROW).encode() + b'], "x":' + b"[1," * depth
            + b"1" + b"]" * depth + b"}")


def post_deep_body_and_wait_for_its_decoding(server: ExampleServer, worker: int) -> Post:
    """:func:`deep_body` posted, once ``worker`` has spent 0.2 s of CPU on it: it is in the
    middle of decoding it."""
    before = cpu_seconds(worker)
    deep = Post(server, deep_body())
    wait_until(lambda: cpu_seconds(worker) - before > 0.2, LARGE_TIMEOUT_S, "the worker decoding the deep body")
    return deep


JOB_BOUND_MS = 500


def test_a_large_body_whose_worker_gets_no_cpu_is_answered_503_within_its_bound(tmp_path: Path) -> None:
    # A SIGSTOPped worker stands for one at SCHED_IDLE while normal-priority processes keep
    # every core busy: it gets no CPU. The request must not wait for it past the bound.
    with running_example_server(tmp_path, rest_api_json_process_timeout_in_ms=JOB_BOUND_MS) as server:
        (worker,) = worker_pids(server)
        os.kill(worker, signal.SIGSTOP)
        try:
            body, _ = predict_body(1 << 20)
            started = time.monotonic()
            response = server.rest.post(SMALL_URL, content=body, timeout=LARGE_TIMEOUT_S)
            took_s = time.monotonic() - started
            assert response.status_code == 503, response.text
            error = response.json()["error"]
            assert f"no answer within {JOB_BOUND_MS} ms" in error and "retry later" in error, error
            assert took_s >= JOB_BOUND_MS / 1000, took_s  # it did wait for the worker first
            assert_small_requests_answered(server, 1)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker, signal.SIGCONT)
        # The starved worker was replaced (its answer would be out of step) and large bodies are
        # served again (retried: on a busy machine the new worker, at SCHED_IDLE, may itself
        # miss the short bound this test sets).
        wait_until(lambda: len(worker_pids(server) - {worker}) == 1, 20.0, "a new worker")
        assert worker not in worker_pids(server)
        small_body, small_rows = predict_body(128 << 10)
        answers: list[httpx.Response] = []

        def served() -> bool:
            answers.append(server.rest.post(SMALL_URL, content=small_body, timeout=LARGE_TIMEOUT_S))
            assert answers[-1].status_code in (200, 503), answers[-1].text
            return answers[-1].status_code == 200

        wait_until(served, LARGE_TIMEOUT_S, "a large body served by the new worker")
        assert len(answers[-1].json()["predictions"]) == small_rows
