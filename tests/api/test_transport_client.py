"""The serving client's codecs, error tables, REST transport, replicas and retries.

The REST transport is driven through its HTTP/1.1 client's `MockClient` (the
transport's own seam) and, for connection handling, a real asyncio server on loopback
(the pool itself is tested in test_http1_pool.py); replicas and retries through fake
`ServingClient`s (the client's own seam). No mocking library.
"""

from __future__ import annotations

import array
import asyncio
import math
import time
from collections.abc import Callable
from typing import Any

import orjson
import pytest
import tenacity

from api.request.admission.rules import parse_timeout_header
from api.serving_client import (
    Code,
    DataType,
    Deadline,
    DeadlineExceeded,
    ModelSpec,
    ModelStatus,
    PredictRequest,
    PredictResponse,
    ServingBadResponse,
    ServingError,
    ServingInternalError,
    ServingMisconfigured,
    ServingNotFound,
    ServingRejected,
    ServingTimeout,
    ServingUnavailable,
    Tensor,
    TensorInfo,
)
from api.serving_client._errors import code_for_http_status, error_for_code, is_retryable
from api.serving_client._http1 import (
    ConnectError,
    ConnectTimeout,
    Http1Client,
    MockClient,
    PoolTimeout,
    ReadError,
    RemoteProtocolError,
    Request,
    Response,
    ServerDisconnected,
    WriteError,
)
from api.serving_client._json import loads, predict_body, predict_path, tensor_from_json
from api.serving_client._replicas import ReplicatedClient, RoundRobin
from api.serving_client._rest import RestTransport
from api.serving_client._types import nest

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


FEATURES = Tensor.from_rows([[1.0, 2.0], [3.0, 4.5]])
REQUEST = PredictRequest(ModelSpec("fraud", "serving_default", 2), {"features": FEATURES})


# --- tensors and the REST JSON codec ---------------------------------------------------


def test_tensor_checks_its_shape() -> None:
    assert Tensor((2, 3), list(range(6))).row_size == 3
    with pytest.raises(ValueError, match="needs 6 values"):
        Tensor((2, 3), [1.0])
    with pytest.raises(ValueError, match="different lengths"):
        Tensor.from_rows([[1.0], [1.0, 2.0]])
    assert Tensor((2, 1, 2), [1, 2, 3, 4]).to_nested() == [[[1, 2]], [[3, 4]]]
    assert Tensor((), [5]).to_nested() == 5


def test_predict_body_and_path() -> None:
    assert orjson.loads(predict_body(REQUEST)) == {
        "signature_name": "serving_default",
        "inputs": {"features": [[1.0, 2.0], [3.0, 4.5]]},
    }
    assert predict_path(REQUEST) == "/v1/models/fraud/versions/2:predict"
    latest = PredictRequest(ModelSpec("a/b c"), {})
    assert predict_path(latest) == "/v1/models/a%2Fb%20c:predict"
    # TF Serving's REST label path; the label is URL-decoded by serving (ParseModelInfo).
    labelled = PredictRequest(ModelSpec("fraud", version_label="v2.canary"), {})
    assert predict_path(labelled) == "/v1/models/fraud/labels/v2.canary:predict"


def test_tf_servings_non_finite_tokens_parse() -> None:
    body = b'{"outputs": [[NaN], [Infinity], [-Infinity], [0.5]]}'
    parsed = loads(body)
    tensor = tensor_from_json("x", parsed["outputs"])
    assert tensor.shape == (4, 1)
    assert math.isnan(tensor.values[0]) and tensor.values[1] == math.inf and tensor.values[2] == -math.inf


def test_json_tensors_must_be_rectangular() -> None:
    assert tensor_from_json("x", [[1, 2], [3, 4]]).shape == (2, 2)
    assert tensor_from_json("x", [["a"], [{"b64": "AAE="}]]).values == [b"a", b"\x00\x01"]
    assert tensor_from_json("x", []).shape == (0,)
    for ragged in ([[1, 2], [3]], [[1], 2], [{"x": 1}]):
        with pytest.raises(ServingBadResponse):
            tensor_from_json("x", ragged)


# --- the error tables ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "message", "code", "cls"),
    [
        (400, "Expects arg[0] to be float but double is provided", Code.INVALID_ARGUMENT, ServingRejected),
        (400, 'Serving signature key "nope" not found.', Code.FAILED_PRECONDITION, ServingMisconfigured),
        (
            400,
            'Serving signature name: "nope" not found in signature def',
            Code.FAILED_PRECONDITION,
            ServingMisconfigured,
        ),
        (404, "Servable not found for request: Latest(fraud)", Code.NOT_FOUND, ServingNotFound),
        (429, "queue full", Code.RESOURCE_EXHAUSTED, ServingUnavailable),
        (500, "boom", Code.INTERNAL, ServingInternalError),
        (501, "nope", Code.UNIMPLEMENTED, ServingMisconfigured),
        (503, "loading", Code.UNAVAILABLE, ServingUnavailable),
        (504, "slow", Code.DEADLINE_EXCEEDED, ServingTimeout),
        (418, "teapot", Code.INVALID_ARGUMENT, ServingRejected),
        (599, "odd", Code.INTERNAL, ServingInternalError),
    ],
)
def test_rest_status_to_code_to_class(status: int, message: str, code: Code, cls: type) -> None:
    assert code_for_http_status(status, message) is code
    error = error_for_code(code, message, status_code=status)
    assert type(error) is cls and error.code is code and error.status_code == status


def test_only_unavailable_is_retried_and_messages_are_bounded() -> None:
    assert is_retryable(ServingUnavailable("down"))
    assert not is_retryable(ServingUnavailable("full", Code.RESOURCE_EXHAUSTED))
    assert not is_retryable(ServingTimeout("slow"))
    assert not is_retryable(ValueError())
    assert len(ServingRejected("x" * 10_000).message) == 500


# --- the REST transport, through MockClient -----------------------------------------------


def answer(status: int, *, json: object = None, text: str | None = None, content: bytes = b"") -> Response:
    """A response as serving would send it."""
    if json is not None:
        content = orjson.dumps(json)
    elif text is not None:
        content = text.encode()
    return Response(status, "", {"content-length": str(len(content))}, content)


def rest(handler: Callable[[Request], Response]) -> RestTransport:
    return RestTransport(MockClient(handler), "http://serving:8501/", call_timeout_s=5, connect_timeout_s=1)


async def test_rest_predict_round_trip() -> None:
    seen: list[Request] = []

    def handler(request: Request) -> Response:
        seen.append(request)
        return answer(200, content=b'{"outputs": [[0.25], [NaN]]}')

    transport = rest(handler)
    response = await transport.predict(REQUEST, Deadline.after(5))
    assert seen[0].url == "http://serving:8501/v1/models/fraud/versions/2:predict"
    assert seen[0].method == "POST" and seen[0].headers["host"] == "serving:8501"
    assert seen[0].headers["content-type"] == "application/json"
    assert seen[0].headers["content-length"] == str(len(seen[0].body))
    assert orjson.loads(seen[0].body)["inputs"] == {"features": [[1.0, 2.0], [3.0, 4.5]]}
    tensor = response.outputs[""]
    assert tensor.shape == (2, 1) and tensor.values[0] == 0.25 and math.isnan(tensor.values[1])
    assert response.model_version is None  # REST does not say


async def test_rest_named_outputs_are_filtered() -> None:
    body = {"outputs": {"a": [1, 2], "b": [[3], [4]]}}
    transport = rest(lambda r: answer(200, json=body))
    request = PredictRequest(REQUEST.model_spec, REQUEST.inputs, output_filter=("b",))
    response = await transport.predict(request, Deadline.after(5))
    assert set(response.outputs) == {"b"} and response.outputs["b"].values == [3, 4]


METADATA = {  # TF Serving's REST answer (the example fraud export's)
    "model_spec": {"name": "fraud", "signature_name": "", "version": "2"},
    "metadata": {
        "signature_def": {
            "signature_def": {
                "serving_default": {
                    "inputs": {
                        "features": {
                            "dtype": "DT_FLOAT",
                            "tensor_shape": {"dim": [{"size": "-1", "name": ""}, {"size": "11", "name": ""}],
                                             "unknown_rank": False},
                            "name": "serving_default_features:0",
                        }
                    },
                    "outputs": {
                        "fraud_score": {"dtype": "DT_COMPLEX64", "tensor_shape": {"unknown_rank": True},
                                        "name": "out:0"}
                    },
                    "method_name": "tensorflow/serving/predict",
                }
            }
        }
    },
}  # fmt: skip


async def test_rest_model_metadata() -> None:
    seen: list[Request] = []

    def handler(request: Request) -> Response:
        seen.append(request)
        return answer(200, json=METADATA)

    metadata = await rest(handler).model_metadata("fraud", 2, Deadline.after(5))
    assert seen[0].url == "http://serving:8501/v1/models/fraud/versions/2/metadata" and seen[0].method == "GET"
    signature = metadata.signatures["serving_default"]
    assert metadata.version == 2 and signature.method_name == "tensorflow/serving/predict"
    assert signature.inputs["features"] == TensorInfo(DataType.DT_FLOAT, (-1, 11), "serving_default_features:0")
    # A dtype the client has no member for, and an unknown rank:
    assert signature.outputs["fraud_score"] == TensorInfo(DataType.DT_INVALID, None, "out:0")
    with pytest.raises(ServingBadResponse, match="metadata answer is malformed"):
        await rest(lambda r: answer(200, json={"metadata": {}})).model_metadata("fraud", 2, Deadline.after(5))


async def test_rest_model_metadata_by_label_names_the_version_serving_resolved() -> None:
    seen: list[Request] = []

    def handler(request: Request) -> Response:
        seen.append(request)
        spec = {"name": "fraud", "signature_name": "", "version": "3"}  # int64: a JSON string
        return answer(200, json={**METADATA, "model_spec": spec})

    metadata = await rest(handler).model_metadata("fraud", None, Deadline.after(5), label="stable")
    assert seen[0].url == "http://serving:8501/v1/models/fraud/labels/stable/metadata"
    assert metadata.version == 3
    await rest(handler).model_metadata("fraud", None, Deadline.after(5))
    assert seen[1].url == "http://serving:8501/v1/models/fraud/metadata"


@pytest.mark.parametrize(
    ("response", "cls"),
    [
        (answer(404, json={"error": "Servable not found for request: Specific(fraud, 2)"}), ServingNotFound),
        (answer(400, json={"error": "Expects arg[0] to be float"}), ServingRejected),
        (answer(503, text="<html>proxy</html>"), ServingUnavailable),
        (answer(200, text="not json"), ServingBadResponse),
        (answer(200, json={"predictions": []}), ServingBadResponse),
    ],
)
async def test_rest_failures_are_serving_errors(response: Response, cls: type) -> None:
    transport = rest(lambda r: response)
    with pytest.raises(cls) as caught:
        await transport.predict(REQUEST, Deadline.after(5))
    assert caught.value.target == "http://serving:8501"
    assert "serving:8501" not in caught.value.message  # callers never see the topology


@pytest.mark.parametrize(
    ("exc", "cls", "down"),
    [
        (ConnectError("refused"), ServingUnavailable, True),
        (ConnectTimeout("slow connect"), ServingUnavailable, True),
        (ServerDisconnected("server disconnected without sending a response"), ServingUnavailable, False),
        (ReadError("reset"), ServingUnavailable, False),
        (WriteError("broken pipe"), ServingUnavailable, False),
        (RemoteProtocolError("invalid HTTP response"), ServingUnavailable, False),
        (PoolTimeout("busy"), ServingTimeout, False),
    ],
)
async def test_rest_transport_errors_are_translated(exc: Exception, cls: type, down: bool) -> None:
    def handler(request: Request) -> Response:
        raise exc

    transport = rest(handler)
    with pytest.raises(cls) as caught:
        await transport.predict(REQUEST, Deadline.after(5))
    assert caught.value.replica_down is down
    assert caught.value.__cause__ is exc
    assert type(exc).__name__ in caught.value.message


async def test_rest_stale_failure_is_sent_again_once_and_only_once() -> None:
    calls = 0

    def handler(request: Request) -> Response:
        nonlocal calls
        calls += 1
        raise ServerDisconnected("server disconnected without sending a response", stale=True)

    transport = rest(handler)
    with pytest.raises(ServingUnavailable):
        await transport.predict(REQUEST, Deadline.after(5))
    assert calls == 2


async def test_rest_a_slow_answer_is_cut_at_the_deadline() -> None:
    server_gate = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{")  # then nothing more
        await writer.drain()
        await server_gate.wait()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    http = Http1Client(max_connections=2, keepalive_expiry_s=5)
    async with server:
        transport = RestTransport(http, f"http://127.0.0.1:{port}", call_timeout_s=5, connect_timeout_s=1)
        with pytest.raises(ServingTimeout, match="within the request deadline"):
            await transport.predict(REQUEST, Deadline.after(0.3))
        server_gate.set()
        await http.aclose()


async def test_rest_call_past_its_deadline_is_not_sent() -> None:
    sent: list[Request] = []
    transport = rest(lambda r: sent.append(r) or answer(200, json={"outputs": [[1]]}))
    with pytest.raises(ServingTimeout):
        await transport.predict(REQUEST, Deadline.after(-0.001))
    assert sent == []


async def test_rest_model_status() -> None:
    body = {
        "model_version_status": [
            {"version": "2", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}},
            {"version": "3", "state": "LOADING", "status": {"error_code": "OK", "error_message": ""}},
        ]
    }
    seen: list[Request] = []
    transport = rest(lambda r: seen.append(r) or answer(200, json=body))
    status = await transport.model_status("fraud", Deadline.after(5))
    assert seen[0].method == "GET" and seen[0].url == "http://serving:8501/v1/models/fraud"
    assert "content-length" not in seen[0].headers and seen[0].body == b""
    assert status.latest_available() == 2 and [v.state for v in status.versions] == ["AVAILABLE", "LOADING"]


async def test_a_dead_pooled_connection_is_retried_on_a_fresh_one() -> None:
    """Serving closes a keep-alive connection just as a request goes out on it."""
    connections = 0
    answered = 0
    closed = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections, answered, closed
        connections += 1
        first_connection = connections == 1
        requests_here = 0
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:  # the client closed its connection
                writer.close()
                closed += 1
                return
            length = next(
                (
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                ),
                0,
            )
            await reader.readexactly(length)
            requests_here += 1
            if first_connection and requests_here == 2:
                writer.close()  # the second request on the pooled connection dies unanswered
                closed += 1
                return
            body = b'{"outputs": [[0.5], [0.5]]}'
            head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body)
            writer.write(head + body)
            await writer.drain()
            answered += 1

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    http = Http1Client(max_connections=4, keepalive_expiry_s=5)
    async with server:
        transport = RestTransport(http, f"http://127.0.0.1:{port}", call_timeout_s=5, connect_timeout_s=1)
        # One attempt only: the transport itself sends a request that died unanswered on
        # a reused connection again, on a fresh one, without costing a replica attempt.
        client = ReplicatedClient([transport], max_attempts=1)
        first = await client.predict(REQUEST, Deadline.after(5))
        second = await client.predict(REQUEST, Deadline.after(5))
        await http.aclose()
        for _ in range(200):  # let the server see the close before the loop ends
            if closed == connections:
                break
            await asyncio.sleep(0.01)
    assert first.outputs[""].values == second.outputs[""].values == [0.5, 0.5]
    assert (connections, answered) == (2, 2)


# --- replicas: rotation, ejection, retries -----------------------------------------------


def test_round_robin_rotates_and_skips_ejected_and_tried() -> None:
    rr = RoundRobin(3, eject_s=1.0)
    assert [rr.pick(0.0) for _ in range(4)] == [0, 1, 2, 0]
    rr.mark_down(2, now=0.0)
    assert [rr.pick(0.5) for _ in range(4)] == [1, 0, 1, 0]
    # Every replica that is up was tried: another go at one of them beats an ejected one.
    assert rr.pick(0.5, tried={0, 1}) in (0, 1)
    assert rr.pick(1.5) == 2  # ejection over
    rr.mark_down(0, now=2.0)
    rr.mark_down(1, now=2.0)
    rr.mark_down(2, now=2.0)
    assert rr.pick(2.1, tried={0, 2}) == 1  # all ejected: an untried one first
    assert rr.pick(2.1, tried={0, 1, 2}) in (0, 1, 2)  # still an answer
    assert not rr.untried_up(2.1, set())
    rr.mark_up(1)
    assert rr.untried_up(2.1, set()) and not rr.untried_up(2.1, {1})


class FakeReplica:
    """A `ServingClient` that fails its first `failures` calls with `error`."""

    def __init__(self, name: str, error: ServingError | None = None, failures: int = 10**9) -> None:
        self.name = name
        self.error = error
        self.failures = failures
        self.calls = 0

    async def predict(self, request: PredictRequest, deadline: Deadline) -> PredictResponse:
        self.calls += 1
        if self.error is not None and self.calls <= self.failures:
            raise self.error
        return PredictResponse({"who": Tensor((1,), [self.name.encode()])}, model_version=1)

    async def model_status(self, model_name: str, deadline: Deadline) -> ModelStatus:
        raise NotImplementedError

    async def aclose(self) -> None:
        pass


async def test_unavailable_moves_to_another_replica_and_down_ones_are_skipped() -> None:
    dead = FakeReplica("dead", ServingUnavailable("refused", replica_down=True))
    a, b = FakeReplica("a"), FakeReplica("b")
    client = ReplicatedClient([dead, a, b], max_attempts=3, eject_s=60)
    answers = [(await client.predict(REQUEST, Deadline.after(5))).outputs["who"].values[0] for _ in range(6)]
    assert answers.count(b"a") == answers.count(b"b") == 3
    assert dead.calls == 1  # ejected after its first refusal


async def test_other_errors_are_not_retried() -> None:
    for error in (ServingRejected("bad input"), ServingTimeout("slow"), ServingNotFound("no model")):
        first, second = FakeReplica("1", error), FakeReplica("2")
        with pytest.raises(type(error)):
            await ReplicatedClient([first, second], max_attempts=3).predict(REQUEST, Deadline.after(5))
        assert (first.calls, second.calls) == (1, 0)


async def test_a_call_whose_first_attempt_succeeds_builds_no_retry_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    # tenacity's retry object costs CPU on every call that builds it; only a retry needs it.
    built: list[int] = []
    real = tenacity.AsyncRetrying

    def counted(*args: Any, **kwargs: Any) -> tenacity.AsyncRetrying:
        built.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(tenacity, "AsyncRetrying", counted)
    ok, flaky = FakeReplica("ok"), FakeReplica("flaky", ServingUnavailable("refused"), failures=1)
    client = ReplicatedClient([ok, flaky], max_attempts=3)
    assert (await client.predict(REQUEST, Deadline.after(5))).outputs["who"].values == [b"ok"]
    assert built == []
    # The next call's first attempt (flaky's turn) fails UNAVAILABLE: retried on the other.
    assert (await client.predict(REQUEST, Deadline.after(5))).outputs["who"].values == [b"ok"]
    assert built == [1] and (ok.calls, flaky.calls) == (2, 1)


class HungReplica(FakeReplica):
    """Accepts every call and never answers: times out at the deadline it is given."""

    async def predict(self, request: PredictRequest, deadline: Deadline) -> PredictResponse:
        self.calls += 1
        try:
            async with deadline.timeout():
                await asyncio.Event().wait()
        except TimeoutError:
            raise ServingTimeout("no answer within the request deadline", target=self.name) from None
        raise AssertionError("unreachable")


async def test_a_hung_replica_costs_one_attempt_timeout_and_is_ejected() -> None:
    hung, a, b = HungReplica("hung"), FakeReplica("a"), FakeReplica("b")
    client = ReplicatedClient([hung, a, b], max_attempts=3, eject_s=60, attempt_timeout_s=0.1)
    started = time.monotonic()
    first = await client.predict(REQUEST, Deadline.after(2))
    assert first.outputs["who"].values == [b"a"]
    assert 0.1 <= time.monotonic() - started < 0.5  # one attempt timeout, not the 2 s budget
    answers = [(await client.predict(REQUEST, Deadline.after(2))).outputs["who"].values[0] for _ in range(6)]
    assert sorted(set(answers)) == [b"a", b"b"]
    assert hung.calls == 1  # ejected after its timeout, like a replica that refuses


async def test_the_last_possible_attempt_gets_the_whole_remaining_budget() -> None:
    # One replica: no other to move on to, so the attempt timeout does not apply.
    only = HungReplica("only")
    started = time.monotonic()
    with pytest.raises(ServingTimeout):
        await ReplicatedClient([only], max_attempts=3, attempt_timeout_s=0.05).predict(REQUEST, Deadline.after(0.3))
    assert 0.3 <= time.monotonic() - started < 0.6 and only.calls == 1
    # Every replica hung: the first attempts are cut short, the last runs to the deadline
    # and its timeout is the answer (504).
    hung = [HungReplica(str(i)) for i in range(3)]
    started = time.monotonic()
    with pytest.raises(ServingTimeout) as caught:
        await ReplicatedClient(hung, max_attempts=3, attempt_timeout_s=0.05).predict(REQUEST, Deadline.after(0.5))
    assert 0.5 <= time.monotonic() - started < 0.8
    assert [r.calls for r in hung] == [1, 1, 1]
    assert "request deadline" in caught.value.message


async def test_attempts_are_bounded_by_count_and_deadline() -> None:
    down = ServingUnavailable("503 from serving")
    only = FakeReplica("only", down)
    with pytest.raises(ServingUnavailable):
        await ReplicatedClient([only], max_attempts=4, backoff_initial_s=0.001).predict(REQUEST, Deadline.after(5))
    assert only.calls == 4

    slow_backoff = FakeReplica("slow", down)
    client = ReplicatedClient([slow_backoff], max_attempts=1000, backoff_initial_s=0.05, backoff_max_s=0.05)
    with pytest.raises(ServingUnavailable):
        await client.predict(REQUEST, Deadline.after(0.3))
    assert 1 < slow_backoff.calls < 1000  # the deadline, not the count, stopped it

    recovering = FakeReplica("r", down, failures=2)
    answer = await ReplicatedClient([recovering], max_attempts=3, backoff_initial_s=0.001).predict(
        REQUEST, Deadline.after(5)
    )
    assert answer.outputs["who"].values == [b"r"] and recovering.calls == 3


# --- deadlines -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "budget"),
    [
        (None, 2.0), ("500", 0.5), (" 1500 ", 1.5), ("999999", 2.0), ("2000", 2.0),
        # Any positive integer is accepted and clamped, however many digits it has.
        ("99999999999999999999", 2.0), ("9" * 5000, 2.0), ("0000000000000000000250", 0.25),
    ],
)  # fmt: skip
def test_timeout_header_only_lowers_the_budget(header: str | None, budget: float) -> None:
    assert parse_timeout_header(header, 2.0) == budget


@pytest.mark.parametrize("header", ["0", "-5", "1.5", "abc", "", "１２", "0" * 20, "1e3"])
def test_bad_timeout_headers_are_refused(header: str) -> None:
    with pytest.raises(ValueError):
        parse_timeout_header(header, 2.0)


def test_deadline_arithmetic() -> None:
    deadline = Deadline.after(2.0, now=100.0)
    assert deadline.remaining(now=99.0) == 3.0 and not deadline.expired(now=101.9)
    assert deadline.expired(now=102.0)
    with pytest.raises(DeadlineExceeded, match="before calling serving"):
        Deadline.after(-1).check("calling serving")
    assert DataType.DT_FLOAT == 1



def _nest_by_definition(flat: list[int], shape: tuple[int, ...]) -> object:
    """Row-major nesting as the columnar JSON format defines it, one dimension at a time."""
    if not shape:
        return flat[0]
    step = math.prod(shape[1:])
    if len(shape) == 1:
        return list(flat)
    return [_nest_by_definition(flat[i * step : (i + 1) * step], shape[1:]) for i in range(shape[0])]


@pytest.mark.parametrize("shape", [(5,), (4, 1), (3, 2), (2, 0), (2, 3, 2), (1, 1, 1, 4), ()])
def test_nest_is_row_major_for_every_rank(shape: tuple[int, ...]) -> None:
    flat = list(range(math.prod(shape)))
    assert nest(flat, shape) == _nest_by_definition(flat, shape)


def test_nest_of_a_large_tensor_is_row_major_and_leaves_the_collector_on() -> None:
    import gc

    flat = array.array("f", range(100_000))
    assert nest(flat, (100_000, 1)) == [[float(v)] for v in range(100_000)]
    assert nest(flat, (50_000, 2))[-1] == [99_998.0, 99_999.0]  # type: ignore[index]
    assert gc.isenabled()
