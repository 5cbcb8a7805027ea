"""Lifecycle of ``python -m serving``: SIGTERM under load, and start-up errors.

SIGTERM must stop accepting connections, finish every request already in flight, and exit 0.
To make "in flight" certain rather than likely, the test exports a "gate" SavedModel built on two
TensorFlow queues: its ``wait`` signature records its arrival, then blocks inside ``Session.run``
until a ``release`` request feeds the second queue. So the test knows a request is inside the
model when the signal is sent, and decides when it may finish -- after the server has stopped
accepting. The ``release`` request travels on a connection whose request was already started
before the signal (HTTP/1.1 pipelining: a status request and the release request's headers in one
write; the server parses both at once and keeps the connection until the release is answered).
"""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.serving.serving_testlib import models_config, start_test_serving
from tests.support import Serving, free_port, wait_until
from tools.processes import run_to_exit, serving_command

LOAD_CLIENTS = 4
MAX_LOAD_REQUESTS = 2000
WAIT_S = 60.0


def export_gate(path: Path) -> None:
    """Signatures over ``x`` float32 [-1]: ``wait`` (arrive, then block until released; ``y`` =
    x), ``release`` (let ``len(x)`` waiters go) and ``arrivals`` (waiters that arrived so far)."""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, shape=[None], name="x")
        arrivals = tf.queue.FIFOQueue(1000, [tf.float32], shapes=[[]], name="arrivals")
        releases = tf.queue.FIFOQueue(1000, [tf.float32], shapes=[[]], name="releases")
        with tf.control_dependencies([arrivals.enqueue(1.0)]):
            token = releases.dequeue()
        waited = tf.identity(x + 0.0 * token, name="waited")
        with tf.control_dependencies([releases.enqueue_many([tf.ones_like(x)])]):
            released = tf.identity(tf.ones_like(x), name="released")
        arrived = tf.fill(tf.shape(x), arrivals.size(), name="arrived")
        build = tf.compat.v1.saved_model.signature_def_utils.predict_signature_def
        with tf.compat.v1.Session(graph=graph) as session:
            builder = tf.compat.v1.saved_model.builder.SavedModelBuilder(str(path))
            builder.add_meta_graph_and_variables(
                session,
                ["serve"],
                signature_def_map={
                    "wait": build(inputs={"x": x}, outputs={"y": waited}),
                    "release": build(inputs={"x": x}, outputs={"released": released}),
                    "arrivals": build(inputs={"x": x}, outputs={"arrived": arrived}),
                },
            )
            builder.save()


@pytest.fixture(scope="module")
def models(serving_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lifecycle_models")
    export_gate(root / "gate" / "1")
    (root / "models.config").write_text(
        models_config(
            [
                ("gate", root / "gate", ""),
                ("half_plus_two", serving_model_dir / "half_plus_two", ""),
            ]
        )
    )
    return root


@pytest.fixture
def server(models: Path, tmp_path: Path) -> Iterator[Serving]:
    process = start_test_serving(models / "models.config", tmp_path / "server.log", rest_api_num_threads=8)
    try:
        process.wait_for_states("gate", {1: "AVAILABLE"})
        process.wait_for_states("half_plus_two", {1: "AVAILABLE"})
        yield process
    finally:
        process.process.kill()


def http_request(method: str, path: str, body: bytes = b"") -> tuple[bytes, bytes]:
    """An HTTP/1.1 request's head and body, by hand (for pipelining on a raw socket)."""
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    return head, body


def read_response(sock: socket.socket, buffer: bytearray) -> tuple[int, bytes]:
    """Read one HTTP response (with Content-Length) from ``sock``; returns (status, body)."""
    while b"\r\n\r\n" not in buffer:
        chunk = sock.recv(65536)
        assert chunk, "connection closed before a response"
        buffer += chunk
    head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = next(
        int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:")
    )
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed inside a response body"
        rest += chunk
    del buffer[: len(head) + 4 + length]
    return int(lines[0].split()[1]), rest[:length]


def block_in_gate(server: Serving) -> tuple[threading.Thread, list[httpx.Response]]:
    """A REST request to ``gate``'s ``wait`` signature, on its own thread, returned once it is
    blocked inside ``Session.run``; its response is appended to the list when released."""
    waited: list[httpx.Response] = []

    def wait_request() -> None:
        with httpx.Client(base_url=server.rest_url, timeout=WAIT_S) as http:
            body = {"signature_name": "wait", "instances": [7.0]}
            waited.append(http.post("/v1/models/gate:predict", json=body))

    waiter = threading.Thread(target=wait_request)
    waiter.start()

    def arrivals() -> int:
        body = {"signature_name": "arrivals", "instances": [0.0]}
        response = httpx.post(f"{server.rest_url}/v1/models/gate:predict", json=body, timeout=10.0)
        return int(response.json()["predictions"][0])

    wait_until(lambda: arrivals() == 1, WAIT_S, "the wait request inside the model")
    return waiter, waited


@pytest.mark.http_hardening  # the shutdown of its REST connections
def test_sigterm_finishes_in_flight_requests_and_exits_zero(server: Serving) -> None:
    # 1. Load on another model, bounded in count and time; each outcome is kept.
    stop_load = threading.Event()
    outcomes: list[list[str]] = [[] for _ in range(LOAD_CLIENTS)]

    def load(outcome: list[str]) -> None:
        deadline = time.monotonic() + WAIT_S
        with httpx.Client(base_url=server.rest_url, timeout=10.0) as http:
            for _ in range(MAX_LOAD_REQUESTS):
                if stop_load.is_set() or time.monotonic() > deadline:
                    return
                try:
                    response = http.post(
                        "/v1/models/half_plus_two:predict", json={"instances": [1.0]}
                    )
                except httpx.TransportError as exc:  # refused or closed once shutting down
                    outcome.append(type(exc).__name__)
                    return
                outcome.append(str(response.status_code))

    loaders = [threading.Thread(target=load, args=(outcome,)) for outcome in outcomes]
    for thread in loaders:
        thread.start()
    wait_until(lambda: all(len(o) >= 10 for o in outcomes), WAIT_S, "load")

    # 2. A request blocked inside Session.run.
    waiter, waited = block_in_gate(server)

    # 3. A connection whose next request (the release) has started: status + release headers.
    release_body = json.dumps({"signature_name": "release", "instances": [1.0]}).encode()
    status_head, _ = http_request("GET", "/v1/models/gate")
    release_head, _ = http_request("POST", "/v1/models/gate:predict", release_body)
    pending = socket.create_connection(("127.0.0.1", server.rest_port), timeout=WAIT_S)
    buffer = bytearray()
    try:
        pending.sendall(status_head + release_head)
        status, _ = read_response(pending, buffer)
        assert status == 200

        # 4. SIGTERM: new connections are refused while the wait request is still blocked.
        server.process.send_signal(signal.SIGTERM)

        def refused() -> bool:
            try:
                socket.create_connection(("127.0.0.1", server.rest_port), timeout=1.0).close()
            except OSError:
                return True
            return False

        wait_until(refused, WAIT_S, "the listener to close")
        assert server.process.alive() and not waited  # still draining

        # 5. Release: both in-flight requests finish, then the process exits 0.
        pending.sendall(release_body)
        status, body = read_response(pending, buffer)
        assert (status, json.loads(body)) == (200, {"predictions": [1.0]})
    finally:
        pending.close()
    waiter.join(WAIT_S)
    assert len(waited) == 1
    assert (waited[0].status_code, waited[0].json()) == (200, {"predictions": [7.0]})
    assert server.process.wait(WAIT_S) == 0, server.log()
    stop_load.set()
    for thread in loaders:
        thread.join(WAIT_S)

    # Every load request was answered 200 until the server refused or closed connections.
    for outcome in outcomes:
        answered = [o for o in outcome if o.isdigit()]
        assert set(answered) == {"200"}, outcome
    log = server.log()
    assert "Shutting down: draining in-flight requests" in log
    assert "Server stopped" in log


SHUTDOWN_BODY_S = 1.0  # --rest_api_shutdown_body_read_timeout_in_ms in the test below


@pytest.mark.http_hardening  # the shutdown of its REST connections
def test_sigterm_closes_a_trickling_body_and_finishes_the_request_in_flight(
    models: Path, tmp_path: Path
) -> None:
    """With no body read timeout, a client trickling a body does not hold the shutdown: it is
    answered 503 once the shutdown's body timeout is over, while a request inside the model at
    SIGTERM, past that timeout, still gets its answer."""
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    grpc_port = free_port()
    server = start_test_serving(
        models / "models.config",
        tmp_path / "server.log",
        port=grpc_port,
        rest_api_body_read_timeout_in_ms=0,
        rest_api_shutdown_body_read_timeout_in_ms=int(SHUTDOWN_BODY_S * 1000),
    )
    channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
    trickler = socket.socket()
    trickler.settimeout(WAIT_S)
    stop_trickling = threading.Event()
    try:
        server.wait_for_states("gate", {1: "AVAILABLE"})
        trickler.connect(("127.0.0.1", server.rest_port))
        # 1. A request blocked inside Session.run (it has its whole body).
        waiter, waited = block_in_gate(server)

        # 2. A client trickling a body, one byte every 0.2 s (bounded), for as long as it may.
        head, _ = http_request("POST", "/v1/models/gate:predict", b" " * 1000)
        trickler.sendall(head)

        def trickle() -> None:
            for _ in range(int(WAIT_S / 0.2)):
                if stop_trickling.wait(0.2):
                    return
                try:
                    trickler.sendall(b" ")
                except OSError:
                    return

        trickling = threading.Thread(target=trickle)
        trickling.start()
        time.sleep(0.5)

        # 3. SIGTERM: the trickling body is answered 503 once the timeout is over.
        signalled = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        status, body = read_response(trickler, bytearray())
        answered_after = time.monotonic() - signalled
        assert status == 503
        assert json.loads(body) == {
            "error": f"Server is shutting down: request body not received within "
            f"{SHUTDOWN_BODY_S * 1000:.0f} ms of it (--rest_api_shutdown_body_read_timeout_in_ms)"
        }
        assert SHUTDOWN_BODY_S - 0.2 <= answered_after < SHUTDOWN_BODY_S + 5.0

        # 4. The request in the model is still being waited for, past that timeout. REST drains
        # before gRPC stops (server.run), so gRPC can release it.
        time.sleep(0.5)
        assert server.process.alive() and not waited
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "gate"
        request.model_spec.signature_name = "release"
        request.inputs["x"].CopyFrom(tf.make_tensor_proto([1.0], dtype=tf.float32))
        prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=WAIT_S)
        waiter.join(WAIT_S)
        assert len(waited) == 1
        assert (waited[0].status_code, waited[0].json()) == (200, {"predictions": [7.0]})
        assert server.process.wait(WAIT_S) == 0, server.log()
    finally:
        stop_trickling.set()
        trickler.close()
        channel.close()
        server.process.kill()


def test_labels_on_unloaded_versions_fail_start_up_without_the_flag(
    serving_model_dir: Path, tmp_path: Path
) -> None:
    config = tmp_path / "models.config"
    config.write_text(
        models_config(
            [("multi", serving_model_dir / "multi", 'version_labels { key: "stable" value: 1 }')]
        )
    )
    result = run_to_exit(serving_command(rest_api_port=free_port(), model_config_file=config))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "python -m serving: error: Request to assign label to version 1 of model multi, which "
        "is not currently available for inference"
    ]


@pytest.mark.parametrize(
    "flag",
    [
        "--file_system_poll_wait_seconds=often",
        "--num_request_iterations_for_warmup=1.5",
        "--enable_model_warmup=maybe",
    ],
)
def test_bad_lifecycle_flags_fail_with_one_line(flag: str) -> None:
    result = run_to_exit(serving_command(model_base_path="/models/x", extra=[flag]))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and flag.split("=")[0] in lines[0], result.stderr
