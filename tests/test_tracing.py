"""One trace across both tiers, received by a real OTLP receiver: serving + API as real processes.

Each tier exports its spans to `tools.otlp_receiver.OtlpReceiver` (OTLP/HTTP; serving over
OTLP/gRPC in the gRPC case, so both exporters are exercised), which decodes the
`ExportTraceServiceRequest` messages. Over each transport to serving (REST, gRPC) a request with
a caller's `traceparent` must give one trace whose spans chain parent to child from the caller
through the API (request, preprocess, the coalesced call, the attempt, postprocess) into serving
(its HTTP or gRPC handling, the batch queue when batching, the Session run), with the model,
version, batch size, attempt and replica as attributes, and the access log line must carry the
request id and the trace id together.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import pytest

from api.protos.inference import open_inference_grpc_pb2 as pb
from api.protos.inference import open_inference_grpc_pb2_grpc as pb_grpc
from tests.support import (
    REPO,
    Process,
    Serving,
    children_running,
    free_port,
    http_ok,
    start_api,
    start_example_serving,
    start_gunicorn,
    wait_until,
)
from tools.otlp_receiver import OtlpReceiver, ReceivedSpan

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
EXAMPLE = json.loads((REPO / "examples" / "transaction.json").read_text())
# Export every 50 ms instead of the SDK's 5 s, so spans arrive while the test waits for them.
FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "50"}


@dataclass
class Traced:
    receiver: OtlpReceiver
    serving: Serving
    api: Process
    api_url: str
    protocol: str


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver(with_grpc=True) as r:
        yield r


def _start(tmp: Path, receiver: OtlpReceiver, protocol: str, **api_env: str) -> Traced:
    """Serving and the API, both exporting to `receiver`; serving batches in the gRPC case."""
    if protocol == "grpc":
        serving_env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.grpc_target, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
        flags = {"enable_batching": True}
    else:
        serving_env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_url}
        flags = {}
    serving = start_example_serving(tmp, f"serving-{protocol}.log", env={**serving_env, **FAST_EXPORT}, **flags)
    port = free_port()
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_url,
        "SERVING_PROTOCOL": protocol,
        "SERVING_GRPC_TARGETS": serving.grpc_target,
        **FAST_EXPORT,
        **api_env,
    }
    api = start_api(port, serving.rest_url, tmp / f"api-{protocol}.log", **env)
    traced = Traced(receiver, serving, api, f"http://127.0.0.1:{port}", protocol)
    try:
        serving.wait_available("fraud")
        api.wait_ready(lambda: http_ok(traced.api_url + "/readyz"), 60, "/readyz")
    except BaseException:
        api.stop()
        serving.stop()
        raise
    return traced


@pytest.fixture(scope="module", params=["rest", "grpc"])
def traced(
    request: pytest.FixtureRequest, receiver: OtlpReceiver, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Traced]:
    t = _start(tmp_path_factory.mktemp(f"tracing-{request.param}"), receiver, request.param)
    try:
        yield t
    finally:
        t.api.stop()
        t.serving.stop()


def _trace(receiver: OtlpReceiver, trace_id: str, done: Callable[[list[ReceivedSpan]], bool]) -> list[ReceivedSpan]:
    spans: list[ReceivedSpan] = []

    def arrived() -> bool:
        nonlocal spans
        spans = [s for s in receiver.spans() if s.trace_id == trace_id]
        return bool(done(spans))

    wait_until(arrived, 60, f"the spans of trace {trace_id}")
    return spans


def _one(spans: list[ReceivedSpan], service: str, name: str) -> ReceivedSpan:
    found = [s for s in spans if s.service == service and s.name == name]
    assert len(found) == 1, (service, name, [(s.service, s.name) for s in spans])
    return found[0]


def test_one_trace_spans_both_tiers_parent_to_child(traced: Traced) -> None:
    trace_id, caller_span = secrets.token_hex(16), secrets.token_hex(8)
    headers = {"traceparent": f"00-{trace_id}-{caller_span}-01", "x-request-id": f"trace-{traced.protocol}"}
    response = httpx.post(traced.api_url + "/v1/fraud/score", json=EXAMPLE, headers=headers, timeout=10)
    assert response.status_code == 200, response.text

    def complete(spans: list[ReceivedSpan]) -> bool:
        names = {(s.service, s.name) for s in spans}
        return ("tfserve-serving", "Session run") in names and ("tfserve-api", "POST /v1/fraud/score") in names

    spans = _trace(traced.receiver, trace_id, complete)
    request = _one(spans, "tfserve-api", "POST /v1/fraud/score")
    assert (request.kind, request.parent_span_id) == ("SERVER", caller_span)
    assert request.attributes["http.route"] == "/v1/fraud/score"
    assert request.attributes["http.response.status_code"] == 200
    assert request.attributes["tfserving.request_id"] == f"trace-{traced.protocol}"
    assert request.attributes["tfserving.model_spec.version"] == 1
    assert request.attributes["tfserving.rollout.arm"] == "stable"  # no canary: every request is stable's
    for step in ("preprocess", "postprocess"):
        assert _one(spans, "tfserve-api", step).parent_span_id == request.span_id
    coalesced = _one(spans, "tfserve-api", "coalesced Predict")
    assert coalesced.parent_span_id == request.span_id
    assert coalesced.attributes["tfserving.model_spec.name"] == "fraud"
    assert coalesced.attributes["tfserving.batch_size"] == 1
    assert coalesced.attributes["tfserving.coalesced_requests"] == 1
    assert coalesced.attributes["tfserving.model_spec.version"] == 1
    attempt = _one(spans, "tfserve-api", "tensorflow.serving.PredictionService/Predict")
    assert (attempt.kind, attempt.parent_span_id) == ("CLIENT", coalesced.span_id)
    assert attempt.attributes["tfserving.attempt"] == 1
    replica = traced.serving.rest_url if traced.protocol == "rest" else traced.serving.grpc_target
    assert attempt.attributes["server.address"] == replica
    # Serving continues the attempt's span: its HTTP or gRPC handling, then the Session run.
    if traced.protocol == "rest":
        handling = _one(spans, "tfserve-serving", "POST /v1/models/{model_name}/versions/{version}:predict")
        assert handling.attributes["http.response.status_code"] == 200
    else:
        handling = _one(spans, "tfserve-serving", "tensorflow.serving.PredictionService/Predict")
        assert handling.attributes["rpc.grpc.status_code"] == "OK"
        queued = _one(spans, "tfserve-serving", "batch queue")
        assert queued.parent_span_id == handling.span_id
        assert queued.start_ns <= queued.end_ns
    assert (handling.kind, handling.parent_span_id) == ("SERVER", attempt.span_id)
    run = _one(spans, "tfserve-serving", "Session run")
    assert run.parent_span_id == handling.span_id
    assert (run.attributes["tfserving.model_spec.name"], run.attributes["tfserving.model_spec.version"]) == ("fraud", 1)
    # The access log line names the request and its trace together.
    def logged() -> bool:
        return any(
            line.get("request_id") == f"trace-{traced.protocol}" and line.get("trace_id") == trace_id
            for line in _access_lines(traced.api)
        )

    wait_until(logged, 10, "the access log line with request_id and trace_id")


def test_a_request_without_traceparent_starts_a_trace(traced: Traced) -> None:
    request_id = f"fresh-{traced.protocol}"
    response = httpx.post(
        traced.api_url + "/v1/fraud/score", json=EXAMPLE, headers={"x-request-id": request_id}, timeout=10
    )
    assert response.status_code == 200
    line: dict[str, object] = {}

    def logged() -> bool:
        nonlocal line
        line = next((entry for entry in _access_lines(traced.api) if entry.get("request_id") == request_id), {})
        return bool(line)

    wait_until(logged, 10, "the access log line")
    trace_id = str(line["trace_id"])
    # Each tier exports on its own schedule: wait for the spans of both.
    names = {("tfserve-serving", "Session run"), ("tfserve-api", "POST /v1/fraud/score")}
    spans = _trace(traced.receiver, trace_id, lambda s: names <= {(x.service, x.name) for x in s})
    request = _one(spans, "tfserve-api", "POST /v1/fraud/score")
    assert request.parent_span_id == ""  # the root: the API started this trace
    assert request.span_id == line["span_id"]


def _access_lines(api: Process) -> list[dict[str, object]]:
    lines = []
    for raw in api.log(None).splitlines():
        if raw.startswith("{") and '"api.access"' in raw:
            lines.append(json.loads(raw))
    return lines


def test_a_coalesced_call_links_every_request_it_served(receiver: OtlpReceiver, tmp_path: Path) -> None:
    # Every batch waits its whole window (no eager sending), so requests sent together share one call.
    t = _start(tmp_path, receiver, "rest", COALESCING_EAGER_BATCHES="0", COALESCING_WINDOW_MS="1000")
    try:
        trace_ids = [secrets.token_hex(16) for _ in range(4)]

        async def send_together() -> list[int]:
            async with httpx.AsyncClient(base_url=t.api_url, timeout=10) as client:
                calls = [
                    client.post("/v1/fraud/score", json=EXAMPLE, headers={"traceparent": f"00-{tid}-{'ab' * 8}-01"})
                    for tid in trace_ids
                ]
                return [answer.status_code for answer in await asyncio.gather(*calls)]

        assert asyncio.run(send_together()) == [200] * 4
        requests: dict[str, ReceivedSpan] = {}
        calls: list[ReceivedSpan] = []

        def served(call: ReceivedSpan) -> int:
            return int(str(call.attributes["tfserving.coalesced_requests"]))

        def arrived() -> bool:
            ours = [s for s in receiver.spans() if s.trace_id in trace_ids and s.service == "tfserve-api"]
            requests.clear()
            requests.update({s.trace_id: s for s in ours if s.kind == "SERVER"})
            calls[:] = [s for s in ours if s.name == "coalesced Predict"]
            return len(requests) == 4 and sum(served(c) for c in calls) == 4

        wait_until(arrived, 60, "the four requests' spans and their coalesced calls")
        shared = [c for c in calls if served(c) > 1]
        assert shared, [c.attributes for c in calls]
        for call in shared:
            parent = next(r for r in requests.values() if r.span_id == call.parent_span_id)
            linked = {span_id for _, span_id in call.links}
            others = [r for r in requests.values() if r.span_id in linked]
            # A child of one request, linked to each other one it served, each linking back.
            assert len(others) == served(call) - 1
            assert parent not in others
            for other in others:
                assert (call.trace_id, call.span_id) in other.links
    finally:
        t.api.stop()
        t.serving.stop()


def test_under_gunicorn_each_worker_exports_its_own_spans(
    receiver: OtlpReceiver, example_serving: Serving, tmp_path: Path
) -> None:
    # The tracer provider and its export thread are made in each worker's lifespan, after the
    # fork: spans carry the pid of the worker that made them (the process resource detector),
    # never the master's, which has made no provider (a master's export thread would not
    # survive into its workers).
    port = free_port()
    api = start_gunicorn(
        tmp_path / "gunicorn.log",
        API_BIND=f"127.0.0.1:{port}",
        WEB_CONCURRENCY="2",
        SERVING_URL=example_serving.rest_url,
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.http_url,
        OTEL_EXPERIMENTAL_RESOURCE_DETECTORS="process",
        OTEL_SERVICE_NAME="gunicorn-api",
        **FAST_EXPORT,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        api.wait_ready(
            lambda: http_ok(url + "/readyz") and len(children_running(api.pid, "gunicorn")) == 2, 60, "2 workers"
        )
        workers = children_running(api.pid, "gunicorn")
        for _ in range(10):
            with httpx.Client() as client:  # a new connection each time: either worker may take it
                assert client.post(url + "/v1/fraud/score", json=EXAMPLE, timeout=10).status_code == 200

        def ours() -> list[ReceivedSpan]:
            return [s for s in receiver.spans() if s.service == "gunicorn-api" and s.name == "POST /v1/fraud/score"]

        wait_until(lambda: len(ours()) == 10, 30, "10 request spans from the workers", watch=[api])
        pids = {span.resource["process.pid"] for span in ours()}
        assert pids <= workers and api.pid not in pids, (pids, workers, api.pid)
    finally:
        api.stop()


def test_an_oip_grpc_model_infer_with_traceparent_metadata_continues_the_callers_trace(
    receiver: OtlpReceiver, tmp_path: Path
) -> None:
    # The OIP gRPC front's call hook (api.oip.traced): the call's SERVER span continues the
    # caller's trace from its metadata, and the call to serving and serving's own spans follow it.
    grpc_port = free_port()
    oip = {"OIP__MODELS": "fraud", "OIP__GRPC_PORT": str(grpc_port), "OIP__GRPC_HOST": "127.0.0.1"}
    t = _start(tmp_path, receiver, "rest", **oip)
    try:
        trace_id, caller_span = secrets.token_hex(16), secrets.token_hex(8)
        tensor = pb.ModelInferRequest.InferInputTensor(
            name="features", datatype="FP32", shape=[1, 11], contents=pb.InferTensorContents(fp32_contents=[0.5] * 11)
        )
        metadata = (("traceparent", f"00-{trace_id}-{caller_span}-01"), ("x-request-id", "oip-grpc-traced"))
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            reply = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(
                pb.ModelInferRequest(model_name="fraud", inputs=[tensor]), metadata=metadata, timeout=10
            )
        assert [o.name for o in reply.outputs] == ["fraud_score"]

        def complete(spans: list[ReceivedSpan]) -> bool:
            names = {(s.service, s.name) for s in spans}
            return ("tfserve-serving", "Session run") in names and (
                "tfserve-api",
                "inference.GRPCInferenceService/ModelInfer",
            ) in names

        spans = _trace(receiver, trace_id, complete)
        call = _one(spans, "tfserve-api", "inference.GRPCInferenceService/ModelInfer")
        assert (call.kind, call.parent_span_id) == ("SERVER", caller_span)
        assert call.attributes["rpc.system"] == "grpc"
        assert call.attributes["rpc.service"] == "inference.GRPCInferenceService"
        assert call.attributes["rpc.method"] == "ModelInfer"
        assert call.attributes["rpc.grpc.status_code"] == 0
        assert call.attributes["tfserving.request_id"] == "oip-grpc-traced"
        assert call.attributes["tfserving.model_spec.name"] == "fraud"
        # The call to serving is below the gRPC call's span, and serving continues its attempt.
        by_id = {s.span_id: s for s in spans}
        attempt = _one(spans, "tfserve-api", "tensorflow.serving.PredictionService/Predict")
        ancestor = attempt
        while ancestor.parent_span_id in by_id and ancestor.span_id != call.span_id:
            ancestor = by_id[ancestor.parent_span_id]
        assert ancestor.span_id == call.span_id, [(s.name, s.span_id, s.parent_span_id) for s in spans]
        handling = _one(spans, "tfserve-serving", "POST /v1/models/{model_name}/versions/{version}:predict")
        assert handling.parent_span_id == attempt.span_id
        assert _one(spans, "tfserve-serving", "Session run").parent_span_id == handling.span_id
    finally:
        t.api.stop()
        t.serving.stop()
