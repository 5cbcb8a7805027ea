"""Tracing's switch (`otel_tracing`), shared by both tiers: off by default, nothing loaded when off."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from otel_tracing import TracingConfigError, check_config, tracer_provider, tracing_enabled
from tests.support import REPO


@pytest.mark.parametrize(
    ("environ", "enabled"),
    [
        ({}, False),
        ({"OTEL_SERVICE_NAME": "api", "OTEL_TRACES_SAMPLER": "always_on"}, False),  # no exporter asked for
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, False),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, False),
        ({"OTEL_SDK_DISABLED": "false", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ""}, False),
    ],
)
def test_tracing_is_on_only_when_an_exporter_is_asked_for(environ: dict[str, str], enabled: bool) -> None:
    assert tracing_enabled(environ) is enabled


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"OTEL_TRACES_EXPORTER": "jaeger"}, "OTEL_TRACES_EXPORTER='jaeger': one of otlp, console, none"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "OTLP protocol 'http/json'"),
    ],
)
def test_an_exporter_we_cannot_serve_fails_start_up(environ: dict[str, str], message: str) -> None:
    with pytest.raises(TracingConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_config(environ)
    with pytest.raises(TracingConfigError):
        tracer_provider("x", environ)


def test_the_service_name_is_the_tiers_unless_the_environment_names_one() -> None:
    for environ, expected in [
        ({"OTEL_TRACES_EXPORTER": "console"}, "tier"),
        ({"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "fraud-api"}, "fraud-api"),
        ({"OTEL_TRACES_EXPORTER": "console", "OTEL_RESOURCE_ATTRIBUTES": "service.name=edge"}, "edge"),
    ]:
        saved = {key: os.environ.pop(key, None) for key in ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES")}
        os.environ.update({k: v for k, v in environ.items() if k != "OTEL_TRACES_EXPORTER"})
        try:
            provider = tracer_provider("tier", environ)
            assert provider.resource.attributes["service.name"] == expected
            provider.shutdown()
        finally:
            for key, value in saved.items():
                os.environ.pop(key, None)
                if value is not None:
                    os.environ[key] = value


OFF_PROBE = """
import sys
from fastapi.testclient import TestClient
from api.app import create_app
from api.config.settings import Settings
from tests.support import EXAMPLE_ROUTES

app = create_app(Settings(model_routes=EXAMPLE_ROUTES.split(","), serving_url="http://127.0.0.1:9"))
with TestClient(app) as client:
    client.post("/v1/fraud/score", json={})
    client.get("/readyz")
from serving.model_servers.server import load_tracing
assert load_tracing() is None
ours = ("opentelemetry.sdk", "opentelemetry.exporter", "api.observability.tracing", "serving.util.tracing")
print("LOADED:" + ",".join(sorted(m for m in sys.modules if m.startswith(ours))))
"""


def test_off_neither_tier_loads_the_sdk_or_its_tracing() -> None:
    # FastAPI itself imports opentelemetry-api when it is installed (its native telemetry, inert
    # without a global tracer provider, which we never set); the SDK, the exporters and our
    # tracing modules are what costs, and they stay out.
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run(
        [sys.executable, "-c", OFF_PROBE], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "LOADED:", out.stdout


def test_rest_routes_name_spans_without_model_names() -> None:
    from serving.util.tracing import rest_route

    assert rest_route("/v1/models/fraud:predict") == "/v1/models/{model_name}:predict"
    assert rest_route("/v1/models/fraud/versions/3:PREDICT") == "/v1/models/{model_name}/versions/{version}:predict"
    assert rest_route("/v1/models/fraud/labels/canary:classify") == "/v1/models/{model_name}/labels/{label}:classify"
    assert rest_route("/v1/models/fraud") == "/v1/models/{model_name}"
    assert rest_route("/v1/models/fraud/versions/1/metadata") == "/v1/models/{model_name}/versions/{version}/metadata"
    assert rest_route("/monitoring/prometheus/metrics") == "other"


@pytest.mark.parametrize("sampled", [False, True])
def test_serving_gets_the_attempts_context_or_an_unsampled_requests_own(
    sampled: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Below an unsampled request (parentbased sampler) no child span is made: what goes to
    # serving is the request's own context, not sampled, so serving does not sample it either.
    from api.observability.tracing import Tracing, trace_ids

    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_always_on" if sampled else "parentbased_always_off")
    tracing = Tracing()
    tracing.start()
    try:
        request = tracing.start_server_span("POST", {}, {"url.path": "/v1/fraud/score"})
        ids = trace_ids(request)
        assert ids is not None  # an unsampled request has ids too (the access log names them)
        token = tracing.activate(request)
        try:
            with tracing.span("preprocess") as annotate:
                annotate("tfserving.batch_size", 1)
            with tracing.client.coalesced_call([tracing.client.caller()], {}), tracing.client.attempt("Predict", {}):
                sent = tracing.with_trace_context(lambda: {"x-request-id": "r-1"})()
        finally:
            tracing.deactivate(token)
        tracing.end_server_span(request, 200, "/v1/fraud/score", {})
    finally:
        tracing.shutdown()
    version, trace_id, span_id, flags = sent["traceparent"].split("-")
    assert (version, trace_id, sent["x-request-id"]) == ("00", ids[0], "r-1")
    assert int(flags, 16) & 1 == sampled  # W3C's sampled bit (the SDK also sets level 2's random bit)
    if sampled:
        assert span_id != ids[1]  # the attempt's own span
    else:
        assert span_id == ids[1]


@pytest.mark.parametrize("sampled", [False, True])
def test_serving_makes_no_span_under_an_unsampled_caller(sampled: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # The default sampler follows the caller: under its unsampled traceparent serving keeps the
    # caller's context current and makes neither the request's span nor the Session run's.
    import asyncio

    from opentelemetry import trace

    from serving.util.tracing import ServingTracing

    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    monkeypatch.delenv("OTEL_TRACES_SAMPLER", raising=False)
    tracing = ServingTracing()
    caller_trace, caller_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    seen: list[tuple[str, bool]] = []

    async def app(scope: object, receive: object, send: object) -> None:
        current = trace.get_current_span().get_span_context()
        with tracing.session_run({"tfserving.batch_size": 1}) as run:
            seen.append((format(current.span_id, "016x"), run.is_recording()))

    scope = {
        "type": "http", "method": "POST", "path": "/v1/models/fraud:predict",
        "headers": [(b"traceparent", f"00-{caller_trace}-{caller_span}-{'01' if sampled else '00'}".encode())],
    }  # fmt: skip
    try:
        asyncio.run(tracing.asgi(app)(scope, None, None))
    finally:
        tracing.shutdown()
    [(current_span, run_recorded)] = seen
    assert (current_span != caller_span, run_recorded) == (sampled, sampled)
