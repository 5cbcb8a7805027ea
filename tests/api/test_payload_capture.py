"""Payload capture: sampled requests and responses, fields redacted, as KServe's inference logger's CloudEvents.

The end-to-end test runs the API as a real process against the example model server, with a real
HTTP sink started here; each event it receives is read back with the CloudEvents SDK, as a
consumer of KServe's logger would read it. The other tests hold the parts: redaction, the
encoding, and the bounded queue with its drop counter.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from cloudevents.core.bindings.http import HTTPMessage, from_http_event

from api.config.payload_capture_settings import PayloadCaptureSettings
from api.model_routes import PayloadCapture, Upload
from api.observability.metrics import ApiMetrics
from api.observability.payload_capture import (
    REDACTED,
    REQUEST_TYPE,
    RESPONSE_TYPE,
    CapturedPayload,
    PayloadCapturer,
    encode,
    redact,
)
from examples.fraud.route import route as fraud_route
from tests.support import REPO, Serving, free_port, http_ok, start_api, wait_until

EXAMPLE = json.loads((REPO / "examples" / "transaction.json").read_text())


class Sink:
    """An HTTP server on loopback keeping every request it gets: (headers, body); answers `status(headers)`."""

    def __init__(self, status: Callable[[dict[str, str]], int] = lambda headers: 202) -> None:
        self.received: list[tuple[dict[str, str], bytes]] = []
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                headers = {k.lower(): v for k, v in self.headers.items()}
                sink.received.append((headers, body))
                self.send_response(status(headers))
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def events(self) -> list[Any]:
        return [from_http_event(HTTPMessage(headers, body)) for headers, body in list(self.received)]


@pytest.fixture
def sink() -> Iterator[Sink]:
    s = Sink()
    try:
        yield s
    finally:
        s.server.shutdown()
        s.server.server_close()


def test_captured_pairs_reach_a_real_sink_redacted(example_serving: Serving, sink: Sink, tmp_path: Path) -> None:
    port = free_port()
    api = start_api(
        port,
        example_serving.rest_url,
        tmp_path / "api.log",
        PAYLOAD_CAPTURE__URL=sink.url,
        PAYLOAD_CAPTURE__SOURCE="http://fraud-api.test/",
        PAYLOAD_CAPTURE__NAMESPACE="risk",
        MODELS__FRAUD__CAPTURE_SAMPLE_RATE="1",
    )
    try:
        api.wait_ready(lambda: http_ok(f"http://127.0.0.1:{port}/readyz"), 60, "/readyz")
        answer = httpx.post(
            f"http://127.0.0.1:{port}/v1/fraud/score", json=EXAMPLE, headers={"x-request-id": "cap-1"}, timeout=10
        )
        assert answer.status_code == 200, answer.text
        # The digits route captures nothing: its rate is the declaration's default, 0.
        digits = (REPO / "examples" / "digit-3.png").read_bytes()
        r = httpx.post(f"http://127.0.0.1:{port}/v1/digits/classify", files={"image": ("d.png", digits, "image/png")})
        assert r.status_code == 200
        wait_until(lambda: len(sink.received) >= 2, 30, "two captured events at the sink", watch=[api])
        by_type = {event.get_type(): event for event in sink.events()}
        assert set(by_type) == {REQUEST_TYPE, RESPONSE_TYPE}
        request, response = by_type[REQUEST_TYPE], by_type[RESPONSE_TYPE]
        for event in (request, response):
            assert event.get_id() == "cap-1"  # pairs request and response, as KServe's ce-id does
            assert event.get_source() == "http://fraud-api.test/v1/fraud/score"
            assert event.get_specversion() == "1.0"
            assert event.get_extension("inferenceservicename") == "fraud"
            assert event.get_extension("namespace") == "risk"
            assert event.get_extension("component") == "transformer"
            assert event.get_extension("endpoint") == "default"
            assert event.get_datacontenttype() == "application/json"
        sent = request.get_data()
        assert sent["user_id"] == REDACTED and EXAMPLE["user_id"] not in json.dumps(sent)
        assert sent["transaction_id"] == "t-0001" and sent["amount"] == EXAMPLE["amount"]
        assert response.get_data() == answer.json()
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        assert 'api_payload_capture_events_total{outcome="written"} 2.0' in metrics
    finally:
        api.stop()
    assert len(sink.received) == 2  # and nothing from the digits route, drained at shutdown too


def test_redaction_follows_dotted_paths_through_lists_and_leaves_the_input_alone() -> None:
    body = {"user_id": "u-1", "device": {"id": "d-9", "os": "ios"}, "items": [{"sku": 1, "card": "4111"}, {"sku": 2}]}
    out = redact(body, ["user_id", "device.id", "items.card", "absent", "device.os.deeper"])
    assert out == {
        "user_id": REDACTED,
        "device": {"id": REDACTED, "os": "ios"},
        "items": [{"sku": 1, "card": REDACTED}, {"sku": 2}],
    }
    assert body["user_id"] == "u-1" and body["device"]["id"] == "d-9"  # type: ignore[index]


def test_a_route_declares_what_is_redacted_and_a_sane_rate() -> None:
    assert fraud_route.capture.redact == ("user_id",)
    with pytest.raises(ValueError, match="between 0 and 1"):
        PayloadCapture(sample_rate=1.5)
    with pytest.raises(ValueError, match="dotted path"):
        PayloadCapture(redact=("device..id",))


def test_an_upload_is_captured_as_its_bytes_and_headers_are_percent_encoded() -> None:
    settings = PayloadCaptureSettings(url="http://sink/", source="urn:a b")  # type: ignore[arg-type]
    upload = Upload(b"\x89PNG...", "d.png", "image/png")
    headers, body = encode(CapturedPayload(REQUEST_TYPE, "id%1", "digits", "/v1/digits", 0.0, upload, ()), settings)
    assert body == b"\x89PNG..." and headers["content-type"] == "image/png"
    assert headers["ce-id"] == "id%251" and headers["ce-source"] == "urn:a%20b/v1/digits"
    event = from_http_event(HTTPMessage(headers, body))
    assert (event.get_id(), event.get_source(), event.get_data()) == ("id%1", "urn:a b/v1/digits", b"\x89PNG...")


def test_a_full_queue_drops_and_counts_never_blocking() -> None:
    metrics = ApiMetrics()
    registry = metrics.registry
    # A sink URL nothing listens on; the writer task is never started, so the queue only fills.
    capturer = PayloadCapturer(PayloadCaptureSettings(url="http://127.0.0.1:9/", max_queue=3), metrics)  # type: ignore[arg-type]

    async def fill() -> None:
        for i in range(4):  # 8 events into a queue of 3
            capturer.capture(
                request_id=str(i), route="r", path="/p", request={}, response={}, redact_paths=(), ts=0.0
            )
        await capturer.publisher.sink.aclose()  # type: ignore[attr-defined]

    asyncio.run(fill())
    assert registry.get_sample_value("api_payload_capture_events_total", {"outcome": "dropped_queue_full"}) == 5


def test_a_refused_event_is_dropped_and_counted_alone_after_its_retries() -> None:
    # A real sink that refuses every request event (500, retried) and takes every response event.
    sink = Sink(lambda headers: 500 if headers["ce-type"] == REQUEST_TYPE else 202)
    metrics = ApiMetrics()
    capturer = PayloadCapturer(PayloadCaptureSettings(url=sink.url), metrics)  # type: ignore[arg-type]

    async def one_pair() -> None:
        capturer.start()
        capturer.capture(
            request_id="r-1", route="fraud", path="/v1/fraud/score", request={"a": 1}, response={"b": 2},
            redact_paths=(), ts=0.0,
        )  # fmt: skip
        await capturer.aclose()  # sends what is queued: both events, in one batch

    try:
        asyncio.run(one_pair())
    finally:
        sink.server.shutdown()
        sink.server.server_close()
    count = metrics.registry.get_sample_value
    assert count("api_payload_capture_events_total", {"outcome": "written"}) == 1
    assert count("api_payload_capture_events_total", {"outcome": "dropped_sink_error"}) == 1
    types = [headers["ce-type"] for headers, _ in sink.received]
    assert types.count(REQUEST_TYPE) == 3 and types.count(RESPONSE_TYPE) == 1  # three tries, then dropped
