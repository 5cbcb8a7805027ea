"""The request limits end to end: ``python -m serving`` on the example models with small limits.

Each limit is hit over a real socket and must be answered with TF Serving's error body and the
limit's status (413, 431, 408; gRPC RESOURCE_EXHAUSTED), counted in
``request_limit_exceeded_count{entrypoint, reason}``, while a well-behaved client on its own
connection keeps getting its predictions the whole time.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import grpc
import httpx
import numpy as np
import orjson
import pytest
import tensorflow as tf
from google.protobuf import wrappers_pb2
from starlette.types import ASGIApp, Receive, Scope, Send
from tensorflow_serving.apis import predict_pb2

from serving.model_servers.http_limits import LimitCallback
from serving.model_servers.http_server import RestServer, bind
from serving.util.errors import LimitExceeded
from serving.util.request_limits import MAX_URI_BYTES, RequestLimits
from tests.serving.example_server import FRAUD_ROW, ExampleServer, running_example_server
from tests.support import wait_until

pytestmark = pytest.mark.http_hardening  # on uvicorn's internals: .ci/run runs these on its newest release too

MAX_BODY = 64 * 1024
MAX_HEAD = 8 * 1024
READ_TIMEOUT_S = 1.0
MAX_ELEMENTS = 11 * 100  # 100 fraud rows
PREDICT = "/v1/models/fraud:predict"


class WellBehavedClient:
    """Predicts one fraud row after another on its own connection, recording every answer."""

    def __init__(self, base_url: str) -> None:
        self._client = httpx.Client(base_url=base_url, timeout=30.0)
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        body = orjson.dumps({"instances": [FRAUD_ROW]})
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                response = self._client.post(PREDICT, content=body)
            except httpx.HTTPError as exc:
                self.failures.append(repr(exc))
                continue
            self.latencies.append(time.monotonic() - started)
            if response.status_code != 200:
                self.failures.append(f"{response.status_code} {response.text}")
            time.sleep(0.01)

    def __enter__(self) -> WellBehavedClient:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        self._client.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExampleServer]:
    with running_example_server(
        tmp_path_factory.mktemp("limits"),
        rest_api_max_body_bytes=MAX_BODY,
        rest_api_max_header_bytes=MAX_HEAD,
        rest_api_body_read_timeout_in_ms=int(READ_TIMEOUT_S * 1000),
        max_request_elements=MAX_ELEMENTS,
    ) as running:
        yield running


def _raw_exchange(port: int, data: bytes, *, pause_s: float = 0.0) -> tuple[bytes, float]:
    """Send ``data`` (then wait ``pause_s`` without closing); return the answer and its time."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        started = time.monotonic()
        try:
            sock.sendall(data)
        except OSError:
            pass  # the server answered and stopped reading: the answer is still there
        time.sleep(pause_s)
        answer = b""
        while b"\r\n\r\n" not in answer or not _complete(answer):
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
        return answer, time.monotonic() - started


def _complete(answer: bytes) -> bool:
    head, _, body = answer.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return False


def _status_and_error(answer: bytes) -> tuple[int, str]:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"connection: close" in head.lower(), head
    return int(head.split(b" ")[1]), orjson.loads(body)["error"]


def test_limits_answered_counted_and_others_served(server: ExampleServer) -> None:
    port = server.rest_port
    before = server.limit_counts()
    with WellBehavedClient(f"http://127.0.0.1:{port}") as neighbour:
        time.sleep(0.3)
        # A body over the limit, announced by Content-Length: refused before it is read.
        body = b'{"instances": [' + b"1," * MAX_BODY + b"1]}"
        response = httpx.post(f"http://127.0.0.1:{port}{PREDICT}", content=body, timeout=30)
        assert response.status_code == 413
        assert response.json() == {
            "error": f"Request body of {len(body)} bytes exceeds the limit of {MAX_BODY} bytes "
            "(--rest_api_max_body_bytes)"
        }
        # The same body chunked (no length): refused once it grows past the limit.
        response = httpx.post(
            f"http://127.0.0.1:{port}{PREDICT}", content=iter([body[:40000], body[40000:]]), timeout=30
        )
        assert response.status_code == 413
        assert "exceeds the limit of 65536 bytes" in response.json()["error"]

        # A head over the limit: 431, before the parser sees much of it.
        head = b"POST " + PREDICT.encode() + b" HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (MAX_HEAD * 4)
        status, error = _status_and_error(_raw_exchange(port, head + b"\r\n\r\n")[0])
        assert (status, error) == (
            431,
            f"Request header fields exceed the limit of {MAX_HEAD} bytes (--rest_api_max_header_bytes)",
        )
        # ... and a 64 MB one is answered as fast: its cost is bounded by the limit.
        answer, seconds = _raw_exchange(port, head + b"a" * (64 << 20) + b"\r\n\r\n")
        assert _status_and_error(answer)[0] == 431
        assert seconds < 10.0

        # A body that stops arriving: 408 after the read timeout.
        stalled = b"POST " + PREDICT.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"
        answer, seconds = _raw_exchange(port, stalled)
        assert _status_and_error(answer) == (
            408,
            "Request body not received within 1000 ms (--rest_api_body_read_timeout_in_ms)",
        )
        assert READ_TIMEOUT_S * 0.9 <= seconds < READ_TIMEOUT_S + 5.0
        # A head that stops arriving: the same.
        answer, seconds = _raw_exchange(port, b"POST " + PREDICT.encode() + b" HTTP/1.1\r\nHo")
        assert _status_and_error(answer)[0] == 408

        # More elements than allowed, in a body under the size limit.
        rows = {"instances": [FRAUD_ROW] * (MAX_ELEMENTS // 11 + 1)}
        response = httpx.post(f"http://127.0.0.1:{port}{PREDICT}", json=rows, timeout=30)
        assert response.status_code == 413
        assert response.json() == {
            "error": f"Request has {MAX_ELEMENTS + 11} tensor elements, more than the limit of "
            f"{MAX_ELEMENTS} (--max_request_elements)"
        }
        # Over gRPC, checked on the declared shape before anything is allocated: a typed field's
        # one value would otherwise fill all 2**31 x 11 floats.
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "fraud"
        request.inputs["features"].CopyFrom(tf.make_tensor_proto([1.0], shape=[1, 11]))
        request.inputs["features"].tensor_shape.dim[0].size = 2**31
        with pytest.raises(grpc.RpcError) as caught:
            server.stub.Predict(request, timeout=10)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert caught.value.details() == (
            f"Request has {2**31 * 11} tensor elements, more than the limit of {MAX_ELEMENTS} "
            "(--max_request_elements)"
        )
        time.sleep(0.3)
    assert neighbour.failures == []
    assert len(neighbour.latencies) >= 10
    # Generous: the machine is shared; the point is that nobody was stalled for seconds.
    assert max(neighbour.latencies) < 3.0, max(neighbour.latencies)

    after = server.limit_counts()
    increase = {key: after.get(key, 0) - before.get(key, 0) for key in after}
    assert increase == {
        ("REST", "body_bytes"): 2,
        ("REST", "header_bytes"): 2,
        ("REST", "read_timeout"): 2,
        ("REST", "elements"): 1,
        ("GRPC", "elements"): 1,
    }


def test_slow_body_is_refused_at_the_flags_timeout(server: ExampleServer) -> None:
    # A body that keeps coming, a byte every 0.1 s (it would take 20 s): refused once the flag's
    # 1 s has passed since the head, not after a fixed 30 s, while the neighbour is served.
    port = server.rest_port
    with WellBehavedClient(f"http://127.0.0.1:{port}") as neighbour:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(b"POST " + PREDICT.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 200\r\n\r\n")
            started = time.monotonic()
            sock.setblocking(False)
            answer = b""
            while not _complete(answer) and time.monotonic() - started < 10:
                with contextlib.suppress(OSError):  # a full buffer, or the server done reading
                    sock.send(b" ")
                time.sleep(0.1)
                with contextlib.suppress(BlockingIOError):
                    answer += sock.recv(65536)
            seconds = time.monotonic() - started
        assert _status_and_error(answer) == (
            408,
            "Request body not received within 1000 ms (--rest_api_body_read_timeout_in_ms)",
        )
        assert READ_TIMEOUT_S * 0.9 <= seconds < READ_TIMEOUT_S + 3.0
    assert neighbour.failures == []
    assert server.rest.post(PREDICT, json={"instances": [FRAUD_ROW]}).status_code == 200


def test_a_head_over_the_limit_is_431_json_however_it_arrives(server: ExampleServer) -> None:
    # A request line just over the limit, in one read: refused by its size, in TF Serving's
    # error body -- not uvicorn's plain-text 400, which a URL over 65,535 bytes used to get
    # (httptools cannot split it).
    expected = (431, f"Request header fields exceed the limit of {MAX_HEAD} bytes (--rest_api_max_header_bytes)")
    for url_bytes in (MAX_HEAD, 70_000):
        url = PREDICT.encode() + b"?" + b"a" * (url_bytes - len(PREDICT) - 1)
        head = b"POST " + url + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
        assert _status_and_error(_raw_exchange(server.rest_port, head)[0]) == expected
    # Headers just over the limit, in one read, after a request served on the same connection.
    small = b"GET /v1/models/fraud HTTP/1.1\r\nHost: x\r\n\r\n"
    big = b"POST " + PREDICT.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nX-Big: "
    big += b"a" * MAX_HEAD + b"\r\n\r\n{}"
    with socket.create_connection(("127.0.0.1", server.rest_port), timeout=30) as sock:
        sock.sendall(small)
        first = b""
        while not _complete(first):
            first += sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200 "), first
        sock.sendall(big)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert _status_and_error(answer) == expected


def test_a_url_the_parser_cannot_split_is_414_json() -> None:
    # Only a head limit above 65,535 bytes lets such a URL through to the parser.
    limits = RequestLimits(max_header_bytes=256 * 1024)
    refused: list[LimitExceeded] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    with _rest_server(app, limits, refused.append) as port:
        url = b"/" + b"a" * (MAX_URI_BYTES - 1)
        assert _raw_exchange(port, b"GET " + url + b" HTTP/1.1\r\nHost: x\r\n\r\n")[0].startswith(b"HTTP/1.1 200 ")
        answer, _ = _raw_exchange(port, b"GET " + url + b"a HTTP/1.1\r\nHost: x\r\n\r\n")
    assert _status_and_error(answer) == (414, f"Request URI exceeds the limit of {MAX_URI_BYTES} bytes")
    assert [error.reason for error in refused] == ["header_bytes"]


@contextlib.contextmanager
def _rest_server(app: ASGIApp, limits: RequestLimits, on_limit: LimitCallback) -> Iterator[int]:
    """:class:`RestServer` (uvicorn with the head-limited protocol) serving ``app`` on a free
    loopback port, on its own event loop thread; yields the port."""
    sock = bind("127.0.0.1", 0)
    server = RestServer(app, sock, limits, on_limit)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(server.start(), loop).result(timeout=30)
        yield sock.getsockname()[1]
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
        loop.close()


def test_client_gone_mid_body_is_one_quiet_line(server: ExampleServer) -> None:
    logged = server.proc.log_path.stat().st_size
    with socket.create_connection(("127.0.0.1", server.rest_port), timeout=30) as sock:
        sock.sendall(b"POST " + PREDICT.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
        time.sleep(0.2)
    wait_until(
        lambda: b"disconnected" in server.proc.log_path.read_bytes()[logged:], 10, "the disconnect's log line"
    )
    time.sleep(0.3)
    written = server.proc.log_path.read_bytes()[logged:].decode(errors="replace")
    assert "Traceback" not in written and "ClientDisconnect" not in written, written
    assert " I serving.model_servers.http_server] POST /v1/models/fraud:predict: the client disconnected" in written
    assert server.rest.post(PREDICT, json={"instances": [FRAUD_ROW]}).status_code == 200


def _predict_bytes(tensors: list[tuple[bytes, bytes]]) -> bytes:
    """A serialized ``PredictRequest`` for model ``fraud`` with ``(alias, serialized TensorProto)``
    inputs, framed directly in the wire format (the protobuf library would take seconds and
    hundreds of MB to build the hostile ones)."""
    head = predict_pb2.PredictRequest()
    head.model_spec.name = "fraud"
    parts = [head.SerializeToString()]
    for alias, tensor in tensors:
        parts.append(_field(2, _field(1, alias) + _field(2, tensor)))  # inputs: map entry {key, value}
    return b"".join(parts)


def _field(number: int, payload: bytes) -> bytes:
    """Length-delimited field ``number`` (< 16) holding ``payload``; protobuf writes the length."""
    framed = wrappers_pb2.BytesValue(value=payload).SerializeToString()  # b"\x0a" + length + payload
    return bytes([number << 3 | 2]) + framed[1:]


def _raw_predict(server: ExampleServer, data: bytes) -> grpc.RpcError:
    predict = server.channel.unary_unary(
        "/tensorflow.serving.PredictionService/Predict",
        request_serializer=lambda raw: raw,
        response_deserializer=lambda raw: raw,
    )
    with pytest.raises(grpc.RpcError) as caught:
        predict(data, timeout=60)
    return caught.value


def test_refused_string_tensors_leave_no_memory_behind(server: ExampleServer) -> None:
    # 17M empty strings: 34 MB on the wire, ~800 MB once parsed. Each such request, refused for
    # its elements, used to stay in memory (+800 MB RSS per request).
    count = 17_000_000
    tensor = tf.make_tensor_proto(np.array([b""]), dtype=tf.string)
    tensor.ClearField("string_val")
    tensor.tensor_shape.dim[0].size = count
    data = _predict_bytes([(b"features", tensor.SerializeToString() + b"\x42\x00" * count)])  # string_val, field 8
    before = server.rss_bytes()
    for _ in range(5):
        error = _raw_predict(server, data)
        assert (error.code(), error.details()) == (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"Request has {count} tensor elements, more than the limit of {MAX_ELEMENTS} (--max_request_elements)",
        )
    # The heap is trimmed 1 s after a large request; a slower or busier CPU may take longer to
    # get there, so wait for the trim rather than for a fixed time.
    limit = 150 * 2**20
    with contextlib.suppress(TimeoutError):
        wait_until(lambda: server.rss_bytes() - before < limit, 15, "the heap trimmed")
    grown = server.rss_bytes() - before
    assert grown < limit, f"RSS grew {grown / 2**20:.0f} MB"


def test_many_unknown_inputs_are_refused_by_count(server: ExampleServer) -> None:
    # TF Serving's VerifyRequestInputsSize, checked before any tensor is decoded: 200,000
    # aliases took ~2 s of the event loop (the REST port's too) when every tensor was decoded.
    tensor = tf.make_tensor_proto([1.0]).SerializeToString()
    data = _predict_bytes([(b"in%d" % i, tensor) for i in range(200_000)])
    started = time.monotonic()
    error = _raw_predict(server, data)
    seconds = time.monotonic() - started
    assert (error.code(), error.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "input size does not match signature: 200000!=1 len({<200000 aliases>}) != len({features}). "
        "Sent extra: {<200000 aliases>}. Missing but required: {features}.",
    )
    assert seconds < 1.5, seconds
    # Fewer aliases are listed, in TF Serving's words.
    error = _raw_predict(server, _predict_bytes([(b"features", tensor), (b"extra", tensor)]))
    assert (error.code(), error.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "input size does not match signature: 2!=1 len({extra,features}) != len({features}). "
        "Sent extra: {extra}. Missing but required: {}.",
    )


def test_within_the_limits_is_served(server: ExampleServer) -> None:
    rows = {"instances": [FRAUD_ROW] * (MAX_ELEMENTS // 11)}
    with httpx.Client(base_url=f"http://127.0.0.1:{server.rest_port}", timeout=30) as client:
        response = client.post(PREDICT, json=rows)
        assert response.status_code == 200
        assert np.array(response.json()["predictions"]).shape == (MAX_ELEMENTS // 11, 1)
        # A keep-alive connection idle for longer than the read timeout is not refused: the
        # timeout runs only while a request is arriving (idle ones are uvicorn's, 5 s).
        time.sleep(READ_TIMEOUT_S * 1.5)
        assert client.post(PREDICT, json={"instances": [FRAUD_ROW]}).status_code == 200
        assert client.get("/v1/models/fraud").status_code == 200


def test_grpc_garbage_is_internal_not_unknown(server: ExampleServer) -> None:
    # gRPC C++ answers bytes that do not parse as the request message with INTERNAL
    # (GenericDeserialize); grpc.aio's default would be UNKNOWN with a Python class name.
    predict = server.channel.unary_unary(
        "/tensorflow.serving.PredictionService/Predict",
        request_serializer=lambda data: data,
        response_deserializer=lambda data: data,
    )
    with pytest.raises(grpc.RpcError) as caught:
        predict(b"\xff\xfe garbage \x00\x01", timeout=10)
    assert caught.value.code() == grpc.StatusCode.INTERNAL
    assert caught.value.details() == "Failed to parse request: not a tensorflow.serving.PredictRequest"


def test_help_describes_every_flag() -> None:
    from serving.model_servers import flags

    parser = flags._build_parser()
    undocumented = [a.dest for a in parser._actions if a.dest != "help" and not a.help]
    assert undocumented == []
    text = parser.format_help()
    # TF Serving's own words where the flag is TF Serving's (main.cc).
    assert "Interval in seconds between each poll of the filesystem for new model version." in " ".join(
        text.split()
    )


def test_flags_refuse_negative_limits() -> None:
    from serving.model_servers import flags

    with pytest.raises(flags.FlagError, match="--rest_api_max_body_bytes must be >= 0"):
        flags.parse_flags(["--model_base_path=/m", "--rest_api_max_body_bytes=-1"])
    limits = flags.request_limits(
        flags.parse_flags(["--model_base_path=/m", "--max_request_elements=0"])
    )
    assert limits.max_elements is None
    # 0 turns the read timeout off (no timer on heads or bodies); any other value is used as is.
    parsed = flags.parse_flags(["--model_base_path=/m", "--rest_api_body_read_timeout_in_ms=0"])
    assert flags.request_limits(parsed).read_timeout_s is None
    parsed = flags.parse_flags(["--model_base_path=/m", "--rest_api_body_read_timeout_in_ms", "250"])
    assert flags.request_limits(parsed).read_timeout_s == 0.25


def test_flags_of_the_buffered_bodies_and_the_shutdown() -> None:
    from serving.model_servers import flags

    limits = flags.request_limits(flags.parse_flags(["--model_base_path=/m"]))
    assert (limits.max_buffered_body_bytes, limits.shutdown_read_timeout_s) == (64 * 1024 * 1024, 5.0)
    parsed = flags.parse_flags(
        [
            "--model_base_path=/m",
            "--rest_api_max_buffered_body_bytes=0",
            "--rest_api_shutdown_body_read_timeout_in_ms=0",
        ]
    )
    limits = flags.request_limits(parsed)
    assert (limits.max_buffered_body_bytes, limits.shutdown_read_timeout_s) == (None, 0.0)
    with pytest.raises(flags.FlagError, match="must be at least --rest_api_max_body_bytes"):
        flags.parse_flags(["--model_base_path=/m", "--rest_api_max_buffered_body_bytes=1000"])
    with pytest.raises(flags.FlagError, match="--rest_api_shutdown_body_read_timeout_in_ms must be >= 0"):
        flags.parse_flags(["--model_base_path=/m", "--rest_api_shutdown_body_read_timeout_in_ms=-1"])


def test_urllib_reads_the_413_of_a_200_mb_content_length(server: ExampleServer) -> None:
    """urllib sends its whole body before it reads the answer: the model server discards what
    the request announced (up to 256 MiB, `http_hardening.limits.LINGER_DECLARED_MAX_BYTES`)
    after answering 413, so the client reads the 413 instead of a reset while it sends."""
    size = 200 * 1000 * 1000

    def body() -> Iterator[bytes]:
        chunk = b"1" * (1 << 20)
        for _ in range(size // len(chunk)):
            yield chunk
        yield b"1" * (size % len(chunk))

    request = urllib.request.Request(
        f"http://127.0.0.1:{server.rest_port}{PREDICT}",
        data=body(),
        headers={"Content-Type": "application/json", "Content-Length": str(size)},
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=60)
    assert caught.value.code == 413
    assert "exceeds the limit" in caught.value.read().decode()


def test_an_http11_request_without_host_is_400_in_tf_servings_shape(server: ExampleServer) -> None:
    answer, _ = _raw_exchange(server.rest_port, b"GET /v1/models/fraud HTTP/1.1\r\n\r\n")
    status, error = _status_and_error(answer)
    assert status == 400
    assert "Host" in error
