"""Request instrumentation: Server-Timing, X-Request-ID, X-Model-Version, /metrics, access log.

The app under test is the real one (`create_app`) with a few extra routes that record
stages through the per-request seam (`api.request.context`), so these tests need no
serving tier. The fraud route's stages against a real serving tier are checked in
tests/api/test_gunicorn.py.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from api.app import create_app
from api.config.settings import Settings
from api.request.context import current_request
from api.serving_client import ServingTimeout
from tests.api.fake_serving import signature_def_json
from tests.support import EXAMPLE_ROUTES, REPO

STAGE_ROUTE = "/test/stages/{item}"


def sample(metrics_text: str, name: str, **labels: str) -> float:
    """The value of one sample in a text exposition; 0.0 when it is absent."""
    for family in text_string_to_metric_families(metrics_text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return 0.0


def build_app(tmp_path: Path) -> FastAPI:
    """The real app plus test routes that use the stage seam; serving is never called."""
    settings = Settings(
        model_routes=EXAMPLE_ROUTES.split(","),
        serving_url="http://127.0.0.1:9",
        events_jsonl_path=tmp_path / "events.jsonl",
    )
    app = create_app(settings)
    release = asyncio.Event()
    app.state.release = release

    @app.get(STAGE_ROUTE)
    async def stages(item: str) -> dict[str, str]:
        ctx = current_request()
        assert ctx is not None
        ctx.stage_since_start("validate")
        with ctx.stage("features"):
            sum(range(1000))
        with ctx.stage("serving"):
            await asyncio.sleep(0.001)
        ctx.set_model("test-model", 7)
        return {"item": item, "request_id": ctx.request_id}

    @app.get("/test/serving-timeout")
    async def serving_timeout() -> None:
        ctx = current_request()
        assert ctx is not None
        with ctx.stage("serving"):
            raise ServingTimeout("serving did not answer in time")

    @app.get("/test/wait")
    async def wait() -> dict[str, bool]:
        await release.wait()
        return {"released": True}

    return app


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(build_app(tmp_path)) as c:
        yield c


def server_timing(header: str) -> dict[str, float]:
    """Parse `name;dur=ms, ...` into {name: ms}, checking each entry's syntax."""
    out = {}
    for part in header.split(", "):
        m = re.fullmatch(r"([a-z]+);dur=(\d+\.\d{3})", part)
        assert m, f"bad Server-Timing entry {part!r} in {header!r}"
        out[m.group(1)] = float(m.group(2))
    return out


def test_server_timing_lists_the_stages_in_order_then_total(client: TestClient) -> None:
    r = client.get("/test/stages/a")
    assert r.status_code == 200
    timing = server_timing(r.headers["server-timing"])
    assert list(timing) == ["validate", "features", "serving", "total"]
    assert timing["serving"] >= 1.0  # awaited asyncio.sleep(0.001): a lower bound only
    # Stages run one after another inside the request, so they fit in the total
    # (each is rounded to a microsecond).
    assert timing["validate"] + timing["features"] + timing["serving"] <= timing["total"] + 0.003


def test_model_version_header_when_a_model_answered_only(client: TestClient) -> None:
    assert client.get("/test/stages/a").headers["x-model-version"] == "7"
    health = client.get("/healthz")
    assert "x-model-version" not in health.headers
    assert server_timing(health.headers["server-timing"]).keys() == {"total"}


@pytest.mark.parametrize("incoming", ["abc-123", "req.1:2_3", "A" * 128])
def test_acceptable_request_id_is_echoed_and_seen_by_the_route(
    client: TestClient, incoming: str
) -> None:
    r = client.get("/test/stages/a", headers={"X-Request-ID": incoming})
    assert r.headers["x-request-id"] == incoming
    assert r.json()["request_id"] == incoming


@pytest.mark.parametrize("incoming", [None, b"", b"has space", b"A" * 129, b"semi;colon", b"\xe9"])
def test_missing_or_unsafe_request_id_is_replaced(
    client: TestClient, incoming: bytes | None
) -> None:
    headers = {} if incoming is None else {"X-Request-ID": incoming}
    r = client.get("/test/stages/a", headers=headers)
    assert re.fullmatch(r"[0-9a-f]{32}", r.headers["x-request-id"])
    assert r.json()["request_id"] == r.headers["x-request-id"]


def test_request_ids_are_unique(client: TestClient) -> None:
    ids = {client.get("/healthz").headers["x-request-id"] for _ in range(20)}
    assert len(ids) == 20


def test_metrics_count_by_route_template_method_and_status(client: TestClient) -> None:
    for item in ("a", "b", "c"):
        assert client.get(f"/test/stages/{item}").status_code == 200
    assert client.get("/no/such/path").status_code == 404
    assert client.post("/v1/fraud/score", json={}).status_code == 422
    # Answered by middleware before routing: still counted under the route it was for.
    too_big = client.post("/v1/fraud/score", content=b"x" * 70_000, headers={"content-type": "application/json"})
    assert too_big.status_code == 413
    bad_header = client.post("/v1/fraud/score", json={}, headers={"X-Request-Timeout-Ms": "soon"})
    assert bad_header.status_code == 422
    text = client.get("/metrics").text

    def count(**labels: str) -> float:
        return sample(text, "api_request_duration_seconds_count", **labels)

    assert count(method="GET", route=STAGE_ROUTE, status="200") == 3
    assert count(method="GET", route="<unmatched>", status="404") == 1
    assert count(method="POST", route="/v1/fraud/score", status="422") == 2
    assert count(method="POST", route="/v1/fraud/score", status="413") == 1
    for stage in ("validate", "features", "serving", "total"):
        assert (
            sample(text, "api_request_stage_duration_seconds_count", route=STAGE_ROUTE, stage=stage)
            == 3
        )
    # A raw path never becomes a label value.
    assert "/test/stages/a" not in text


def test_unknown_methods_share_one_label(client: TestClient) -> None:
    for method in ("FOO", "BAR", "PROPFIND"):
        client.request(method, "/healthz")
    text = client.get("/metrics").text
    assert sample(text, "api_request_duration_seconds_count", method="OTHER", route="/healthz") == 3
    assert "FOO" not in text and "PROPFIND" not in text


def test_serving_errors_are_counted_by_canonical_code(client: TestClient) -> None:
    r = client.get("/test/serving-timeout")
    assert r.status_code == 504  # the serving-error handler's answer, seen by the middleware
    assert "serving" in server_timing(r.headers["server-timing"])
    text = client.get("/metrics").text
    assert sample(text, "api_serving_errors_total", code="DEADLINE_EXCEEDED") == 1
    assert (
        sample(
            text, "api_request_duration_seconds_count", route="/test/serving-timeout", status="504"
        )
        == 1
    )


def test_metrics_exposition_is_prometheus_text(client: TestClient) -> None:
    r = client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain; version=")
    names = {f.name for f in text_string_to_metric_families(r.text)}
    assert {
        "api_request_duration_seconds",
        "api_request_stage_duration_seconds",
        "api_requests_in_flight",
        "api_serving_errors",
        "api_event_loop_lag_seconds",
        "api_event_loop_blocks",
        "api_score_events",
        "process_resident_memory_bytes",
    } <= names


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_in_flight_gauge_follows_open_requests(tmp_path: Path) -> None:
    app = build_app(tmp_path)
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://api") as c,
    ):
        waiting = [asyncio.create_task(c.get("/test/wait")) for _ in range(3)]
        # Each open request is counted as soon as the middleware has seen it; poll
        # /metrics (which counts itself) until all three are in.
        for _ in range(200):
            in_flight = sample((await c.get("/metrics")).text, "api_requests_in_flight")
            if in_flight == 4:
                break
            await asyncio.sleep(0.005)
        assert in_flight == 4
        app.state.release.set()
        assert all(r.status_code == 200 for r in await asyncio.gather(*waiting))
        assert sample((await c.get("/metrics")).text, "api_requests_in_flight") == 1


def test_access_log_is_one_json_object_per_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with TestClient(build_app(tmp_path)) as c:
        c.get("/test/stages/x", headers={"X-Request-ID": "log-me-1"})
        c.get("/healthz", headers={"X-Request-ID": "log-me-2"})
    lines = [
        json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")
    ]
    access = {e["request_id"]: e for e in lines if e["logger"] == "api.access"}
    entry = access["log-me-1"]
    assert entry["level"] == "INFO"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", entry["ts"])
    assert entry["method"] == "GET"
    assert entry["path"] == "/test/stages/x"
    assert entry["route"] == STAGE_ROUTE
    assert entry["status"] == 200
    assert entry["duration_ms"] > 0
    assert entry["model_version"] == 7
    assert entry["client"].startswith("testclient:")
    assert access["log-me-2"]["model_version"] is None


def test_access_log_can_be_turned_off(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = Settings(
        model_routes=EXAMPLE_ROUTES.split(","),
        serving_url="http://127.0.0.1:9",
        access_log=False,
        events_jsonl_path=tmp_path / "e.jsonl",
    )
    with TestClient(create_app(settings)) as c:
        assert c.get("/healthz").status_code == 200
    assert '"api.access"' not in capsys.readouterr().err


class _RecordingServing(http.server.BaseHTTPRequestHandler):
    """Answers TF Serving's model status and metadata calls and records the request headers it got."""

    seen: ClassVar[list[dict[str, str]]] = []

    def do_GET(self) -> None:
        type(self).seen.append({k.lower(): v for k, v in self.headers.items()})
        if self.path.endswith("/metadata"):  # /v1/models/<name>/versions/1/metadata
            name = self.path.split("/")[3]
            answer: dict = {"metadata": {"signature_def": signature_def_json(name)}}
        else:
            answer = {"model_version_status": [{"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK"}}]}
        body = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_request_id_is_forwarded_to_serving(tmp_path: Path) -> None:
    """The id the middleware put in the context reaches serving as `x-request-id` (REST)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RecordingServing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        settings = Settings(
            model_routes=EXAMPLE_ROUTES.split(","),
            serving_url=f"http://127.0.0.1:{server.server_address[1]}",
            events_jsonl_path=tmp_path / "events.jsonl",
        )
        with TestClient(create_app(settings)) as c:
            r = c.get("/readyz", headers={"X-Request-ID": "trace-to-serving-1"})
    finally:
        server.shutdown()
        server.server_close()
    assert r.status_code == 200, r.text
    assert r.headers["x-request-id"] == "trace-to-serving-1"
    assert {"x-request-id": "trace-to-serving-1"}.items() <= _RecordingServing.seen[-1].items()


def test_log_level_setting_is_checked() -> None:
    assert Settings(log_level="debug").log_level == "DEBUG"
    with pytest.raises(ValueError):
        Settings(log_level="loud")


def test_a_multiprocess_directory_set_after_the_import_stops_the_app(tmp_path: Path) -> None:
    """prometheus-client picks file-backed values at its first import only: a directory
    named later would give empty scrapes, so the app refuses to build (clean process)."""
    probe = (
        "import os, prometheus_client\n"
        f"os.environ['PROMETHEUS_MULTIPROC_DIR'] = {str(tmp_path)!r}\n"
        "from api.app import create_app\n"
        "create_app()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"} | {"MODEL_ROUTES": EXAMPLE_ROUTES}
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "PROMETHEUS_MULTIPROC_DIR was set after prometheus_client was imported" in out.stderr
