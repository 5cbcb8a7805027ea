"""Payload capture: a sampled copy of a route's requests and responses, as KServe's inference logger sends them.

A model route that samples a request (`ModelRoute.capture`, `MODELS__<ROUTE>__CAPTURE_SAMPLE_RATE`)
hands its validated request and its response to `PayloadCapturer.capture` once it has answered.
That only queues two `CapturedPayload`s on the bounded queue of an
`api.observability.events.EventPublisher` (never awaits; a full queue drops them, counted in
`api_payload_capture_events_total{outcome="dropped_queue_full"}`); its writer task encodes them
(JSON, the route's redacted fields replaced) and `CloudEventSink` POSTs each one, off the request
path, with at most `PAYLOAD_CAPTURE__CONCURRENCY` POSTs in flight; an event the sink still refuses
after its retries is `dropped_sink_error`, each event counted on its own. Nothing is captured
while `PAYLOAD_CAPTURE__URL` is unset.

The format is KServe's inference logger's (its `pkg/logger`: one CloudEvent per POST, binary
content mode, https://github.com/cloudevents/spec http-protocol-binding), so the consumers
written for it (a Knative broker, KServe's message dumpers, Kafka sinks) take ours:

=================================  ===========================================================
header                             value
=================================  ===========================================================
``ce-specversion``                 ``1.0``
``ce-id``                          the request id (``X-Request-ID``): the same for the request
                                   and its response, as KServe pairs them
``ce-type``                        ``org.kubeflow.serving.inference.request`` / ``.response``
``ce-source``                      ``PAYLOAD_CAPTURE__SOURCE`` + the route's path
``ce-time``                        when the answer was produced (RFC 3339, UTC)
``ce-inferenceservicename``        the route's name (KServe's InferenceService)
``ce-component``                   ``PAYLOAD_CAPTURE__COMPONENT`` (``transformer``)
``ce-endpoint``                    ``default`` (KServe's default/canary)
``ce-namespace``                   ``PAYLOAD_CAPTURE__NAMESPACE`` when set
``ce-metadata``                    ``{}`` (KServe's logged request headers: none are, keys and
                                   tokens among them)
``ce-traceparent``                 the request's trace context when tracing (CloudEvents'
                                   distributed-tracing extension)
``content-type``                   ``application/json`` (an upload: the file's type)
=================================  ===========================================================

The data is the request body as the route validated it and the response it returned, as JSON
(an upload route's request: the file's bytes); only answered requests are captured (KServe logs
a response only for a 200). The headers are written here rather than through the CloudEvents
SDK: ten fixed header names, and the API image stays without another dependency; the test reads
them back with the SDK (`tests/api/test_payload_capture.py`).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final
from urllib.parse import quote

import httpx
import orjson
from pydantic import BaseModel
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, stop_after_delay, wait_random_exponential

from api.config.payload_capture_settings import PayloadCaptureSettings
from api.model_routes import Upload
from api.observability.events import EventPublisher, PartialWrite, retryable
from api.observability.metrics import ApiMetrics

REQUEST_TYPE: Final = "org.kubeflow.serving.inference.request"
RESPONSE_TYPE: Final = "org.kubeflow.serving.inference.response"
REDACTED: Final = "[REDACTED]"
# The CloudEvents HTTP binding (3.1.3.2): printable ASCII but space, '"' and '%' goes as it is;
# those three and anything else are percent-encoded (UTF-8).
_HEADER_SAFE: Final = "".join(c for c in map(chr, range(0x21, 0x7F)) if c not in ' "%')


@dataclass(frozen=True, slots=True)
class CapturedPayload:
    """One captured request or response, encoded by the writer task (`encode`).

    Attributes:
        event_type: `REQUEST_TYPE` or `RESPONSE_TYPE`.
        request_id: the request's id (the event's `ce-id`).
        route / path: the model route's name and path.
        ts: when the answer was produced, seconds since the epoch.
        body: the validated request (a pydantic model, or the `Upload`) or the response.
        redact: the route's redacted field paths.
        traceparent: the request's W3C trace context, when tracing.
    """

    event_type: str
    request_id: str
    route: str
    path: str
    ts: float
    body: object
    redact: tuple[str, ...]
    traceparent: str | None = None


def redact(value: Any, paths: Sequence[str]) -> Any:
    """`value` (JSON-like: dicts, lists, scalars) with each dotted path's value replaced by `REDACTED`.

    A path names keys from the top ("device.id"); through a list it applies to every element.
    A path that is absent changes nothing. `value` itself is not modified.
    """
    for path in paths:
        value = _redact(value, path.split("."))
    return value


def _redact(value: Any, keys: list[str]) -> Any:
    if isinstance(value, list):
        return [_redact(item, keys) for item in value]
    if not isinstance(value, dict) or keys[0] not in value:
        return value
    out = dict(value)
    out[keys[0]] = REDACTED if len(keys) == 1 else _redact(value[keys[0]], keys[1:])
    return out


def encode(payload: CapturedPayload, settings: PayloadCaptureSettings) -> tuple[dict[str, str], bytes]:
    """The CloudEvent's HTTP headers and body (binary content mode; see the module doc)."""
    body = payload.body
    if isinstance(body, Upload):
        data, content_type = body.data, body.content_type or "application/octet-stream"
    else:
        plain = body.model_dump(mode="json") if isinstance(body, BaseModel) else body
        data, content_type = orjson.dumps(redact(plain, payload.redact), default=str), "application/json"
    headers = {
        "ce-specversion": "1.0",
        "ce-id": payload.request_id,
        "ce-type": payload.event_type,
        "ce-source": f"{settings.source.rstrip('/')}{payload.path}" if settings.source else payload.path,
        "ce-time": datetime.fromtimestamp(payload.ts, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "ce-inferenceservicename": payload.route,
        "ce-component": settings.component,
        "ce-endpoint": "default",
        "ce-metadata": "{}",
        "content-type": content_type,
    }
    if settings.namespace:
        headers["ce-namespace"] = settings.namespace
    if payload.traceparent:
        headers["ce-traceparent"] = payload.traceparent
    encoded = {name: quote(value, safe=_HEADER_SAFE) for name, value in headers.items() if name != "content-type"}
    return {**encoded, "content-type": content_type}, data


class CloudEventSink:
    """POSTs each captured payload as one CloudEvent (`encode`), a few at a time.

    Args:
        client: the `httpx.AsyncClient` (timeouts, pool); closed by `aclose`.
        settings: the URL, concurrency and the events' fixed attributes.
        attempts: tries per event; transport errors, 429 and 5xx are retried.
    """

    def __init__(self, client: httpx.AsyncClient, settings: PayloadCaptureSettings, *, attempts: int = 3) -> None:
        assert settings.url is not None, "a sink needs PAYLOAD_CAPTURE__URL"
        self._client = client
        self._settings = settings
        self._url = str(settings.url)
        self._attempts = attempts
        self._slots = asyncio.Semaphore(settings.concurrency)

    async def write(self, events: Sequence[CapturedPayload]) -> None:
        """POST every event of the batch.

        Raises:
            PartialWrite: some events could not be delivered within their attempts (the others
                were), so the publisher counts each event's own outcome; its cause is the first
                failure (an `httpx.HTTPError`).
        """
        results = await asyncio.gather(*(self._post(event) for event in events), return_exceptions=True)
        failures = [result for result in results if isinstance(result, BaseException)]
        if failures:
            raise PartialWrite(len(results) - len(failures), len(failures)) from failures[0]

    async def _post(self, event: CapturedPayload) -> None:
        headers, data = encode(event, self._settings)
        async with self._slots:
            retrying = AsyncRetrying(
                retry=retry_if_exception(retryable),
                stop=stop_after_attempt(self._attempts) | stop_after_delay(3 * self._settings.timeout_s),
                wait=wait_random_exponential(multiplier=0.1, max=1.0),
                reraise=True,
            )
            async for attempt in retrying:
                with attempt:
                    response = await self._client.post(self._url, content=data, headers=headers)
                    response.raise_for_status()

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self._client.aclose()


class PayloadCapturer:
    """Samples and queues a route's request/response pairs (see the module doc).

    Args:
        settings: the sink and bounds (`PAYLOAD_CAPTURE__*`; `url` must be set).
        metrics: `api_payload_capture_events_total` is recorded here.
    """

    def __init__(self, settings: PayloadCaptureSettings, metrics: ApiMetrics) -> None:
        client = httpx.AsyncClient(
            timeout=httpx.Timeout(settings.timeout_s),
            limits=httpx.Limits(max_connections=settings.concurrency, max_keepalive_connections=settings.concurrency),
        )
        self.publisher: EventPublisher[CapturedPayload] = EventPublisher(
            CloudEventSink(client, settings),
            metrics,
            max_queue=settings.max_queue,
            batch_size=settings.concurrency,
            linger_s=0.0,
            counter=metrics.payload_capture_events,
            what="payload capture",
        )

    @staticmethod
    def sampled(rate: float) -> bool:
        """Whether to capture this request, with probability `rate`."""
        return rate > 0.0 and (rate >= 1.0 or random.random() < rate)

    def capture(
        self,
        *,
        request_id: str,
        route: str,
        path: str,
        request: object,
        response: object,
        redact_paths: tuple[str, ...],
        traceparent: str | None = None,
        ts: float,
    ) -> None:
        """Queue the request and its response (two events; never blocks, may drop)."""
        for event_type, body in ((REQUEST_TYPE, request), (RESPONSE_TYPE, response)):
            payload = CapturedPayload(event_type, request_id, route, path, ts, body, redact_paths, traceparent)
            self.publisher.publish(payload)

    def start(self) -> None:
        """Start the writer task (in the lifespan)."""
        self.publisher.start()

    async def aclose(self) -> None:
        """Send what is queued, close the sink."""
        await self.publisher.aclose()

