"""Score events: one per answered model request, published in the background.

Every model route publishes `EventPublisher.publish(ScoreEvent(...))` once it has an
answer (`api.routes.model_endpoint`). That only
puts the event on a bounded in-memory queue (microseconds; never awaits, never blocks):
when the queue is full the event is dropped and counted in
`api_score_events_total{outcome="dropped_queue_full"}`. One background task, started
and stopped by the app's lifespan, takes events off the queue in batches (up to
`batch_size`, after lingering `linger_s` for more) and writes each batch to a sink:

* `JsonlFileSink` (default): appends JSON Lines to a file, one `write(2)` per batch on
  an `O_APPEND` descriptor under an exclusive `flock`, so several workers can share one
  file without interleaving lines; the write runs in a thread, off the event loop. A
  batch is written whole or not at all: a write cut short (a full disk, a file-size
  limit) is truncated back off, so the file never holds a partial line and
  `api_score_events_total{outcome="written"}` counts exactly the lines it holds. A file
  renamed or removed (log rotation) is noticed before the next batch, which goes to a
  new file at the configured path, as `logging.handlers.WatchedFileHandler` does.
* `HttpSink`: POSTs each batch as JSON Lines (`application/x-ndjson`) to a URL, through
  an `httpx.AsyncClient` made like the one to serving; transport errors, 429 and 5xx
  are retried (tenacity, bounded in attempts and time).

A batch the sink fails to take is logged and counted as `dropped_sink_error` (a sink that
sends each event on its own raises `PartialWrite`, so only the events it lost are). At
shutdown (`aclose`) every event queued so far is written before the sink is closed:
uvicorn has finished the in-flight requests by the time the lifespan ends, so an API
that answered N scores and got SIGTERM has written N events.

An event line: the generic part, the same for every route, then the route's own `fields`
(`ModelRoute.event_fields`), e.g. for the fraud example:

    {"ts": "2026-11-29T14:03:00.123Z", "request_id": "…", "route": "fraud",
     "model_name": "fraud", "model_version": 1, "input_id": "t-0001",
     "outputs": {"fraud_score": [0.93]}, "latency_ms": 3.4, "fields": {"is_fraud": true},
     "arm": "stable"}

A shadow call's event (`api.rollouts.shadow`) has `"arm": "shadow"`, the shadow's model, version
and outputs, and `compared_with`: the primary's model, version and arm, and how the answers
compared (`{"differences": {"fraud_score": 0.0012}, "agreements": {"is_fraud": true}}`).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import fcntl
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, Generic, Protocol, TypeVar

import httpx
import orjson
from prometheus_client import Counter
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_random_exponential,
)

from api.observability.metrics import ApiMetrics

logger = logging.getLogger("api.observability.events")
_T = TypeVar("_T")
# What a publisher carries: `ScoreEvent`s, or the captured payloads of
# `api.observability.payload_capture`, each to its own sink.
_E = TypeVar("_E")
_E_contra = TypeVar("_E_contra", contravariant=True)

class _Stop(enum.Enum):
    """Queued by aclose: everything before it is written, then the task ends."""

    STOP = enum.auto()


_STOP: Final = _Stop.STOP


@dataclass(frozen=True, slots=True)
class ScoreEvent:
    """What one model request produced.

    Attributes:
        ts: when the answer was produced, seconds since the epoch (UTC; written as ISO
            8601 with milliseconds).
        request_id: the request's id (`X-Request-ID`).
        route: the model route's name.
        model_name / model_version: the servable that answered.
        input_id: the request's own id (`ModelRoute.input_id`, e.g. a transaction id), if any.
        outputs: the model's outputs for the request: output alias -> value.
        latency_ms: time from the request's arrival to the answer, milliseconds.
        fields: the route's own fields (`ModelRoute.event_fields`).
        arm: the rollout arm that answered (`stable`, `canary`, `pinned`), or `shadow` for a
            shadow call's event (`api.rollouts`); None (written as null) outside a rollout.
        compared_with: a shadow event's primary, `{"model_name", "model_version", "arm",
            "differences", "agreements"}`: the version pair and how the answers compared;
            None: not written.
    """

    ts: float
    request_id: str
    route: str
    model_name: str
    model_version: int
    input_id: str | None
    outputs: Mapping[str, object]
    latency_ms: float
    fields: Mapping[str, object]
    arm: str | None = None
    compared_with: Mapping[str, object] | None = None


def encode_jsonl(events: Sequence[ScoreEvent]) -> bytes:
    """The events as JSON Lines (UTF-8, one object per line, each line ending in \\n)."""
    lines = []
    for event in events:
        record = {
            "ts": datetime.fromtimestamp(event.ts, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "request_id": event.request_id,
            "route": event.route,
            "model_name": event.model_name,
            "model_version": event.model_version,
            "input_id": event.input_id,
            "outputs": event.outputs,
            "latency_ms": round(event.latency_ms, 3),
            "fields": event.fields,
            "arm": event.arm,
        }
        if event.compared_with is not None:
            record["compared_with"] = event.compared_with
        lines.append(orjson.dumps(record, default=str))
    return b"\n".join(lines) + b"\n" if lines else b""


class EventSink(Protocol[_E_contra]):
    """Where batches of events go. `write` raises on failure; the publisher counts it."""

    async def write(self, events: Sequence[_E_contra]) -> None: ...

    async def aclose(self) -> None: ...


class JsonlFileSink:
    """Appends JSON Lines to `path` (created with its parent directories on first write).

    Each batch is all or nothing, and a renamed or removed file is replaced by a new one
    at `path` (see the module doc).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def _current_fd(self) -> int:
        """The descriptor of the file now at `path`: reopened when it was renamed or removed."""
        if self._fd is not None:
            try:
                at_path = os.stat(self.path)
            except FileNotFoundError:
                at_path = None
            held = os.fstat(self._fd)
            if at_path is None or (at_path.st_ino, at_path.st_dev) != (held.st_ino, held.st_dev):
                os.close(self._fd)
                self._fd = None
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        return self._fd

    def _append(self, data: bytes) -> None:
        fd = self._current_fd()
        # The lock keeps other workers from appending while this batch is written, so on a
        # failure the file can be cut back to where the batch began.
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            start = os.fstat(fd).st_size
            try:
                view = memoryview(data)
                while view:  # a short write (disk full) is followed by one that raises
                    view = view[os.write(fd, view) :]
            except OSError:
                os.ftruncate(fd, start)  # no partial line, no event counted twice
                raise
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    async def write(self, events: Sequence[ScoreEvent]) -> None:
        """Append the whole batch or none of it, in a worker thread.

        Raises:
            OSError: the file cannot be created or written (nothing of the batch is in it).
        """
        await asyncio.to_thread(self._append, encode_jsonl(events))

    async def aclose(self) -> None:
        """Close the file."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class PartialWrite(Exception):
    """A sink delivered `written` events of a batch and lost the others (`__cause__`: the first failure)."""

    def __init__(self, written: int, lost: int) -> None:
        super().__init__(f"{lost} of {written + lost} events not delivered")
        self.written = written
        self.lost = lost


def retryable(exc: BaseException) -> bool:
    """Transport failures, 429 and 5xx answers are worth another try; other 4xx are not."""
    if isinstance(exc, httpx.HTTPStatusError):
        return exc.response.status_code == 429 or exc.response.status_code >= 500
    return isinstance(exc, httpx.TransportError)


class HttpSink:
    """POSTs each batch as JSON Lines to `url`.

    Args:
        client: the `httpx.AsyncClient` to use (timeouts and pool set by its maker);
            closed by `aclose`.
        url: absolute URL to POST to.
        attempts: tries per batch, >= 1.
        retry_budget_s: give up on a batch after this long, seconds.
    """

    def __init__(
        self, client: httpx.AsyncClient, url: str, *, attempts: int = 3, retry_budget_s: float = 5.0
    ) -> None:
        self._client = client
        self._url = url
        self._attempts = attempts
        self._budget_s = retry_budget_s

    async def write(self, events: Sequence[ScoreEvent]) -> None:
        """POST the batch; retried on transport errors, 429 and 5xx.

        Raises:
            httpx.HTTPError: the last failure once the attempts or the time are used up.
        """
        body = encode_jsonl(events)
        retrying = AsyncRetrying(
            retry=retry_if_exception(retryable),
            stop=stop_after_attempt(self._attempts) | stop_after_delay(self._budget_s),
            wait=wait_random_exponential(multiplier=0.1, max=1.0),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                response = await self._client.post(
                    self._url, content=body, headers={"content-type": "application/x-ndjson"}
                )
                response.raise_for_status()

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self._client.aclose()


class EventPublisher(Generic[_E]):
    """A bounded queue of events and the task that writes them to a sink.

    Args:
        sink: where batches go.
        metrics: `api_score_events_total` (or `counter`) is recorded here.
        max_queue: events held at most; more are dropped (>= 1).
        batch_size: events per sink write at most (>= 1).
        linger_s: after the first event of a batch, how long to wait for more, seconds.
        counter: the counter of outcomes (label `outcome`); None: `metrics.score_events`.
        what: the events' name in log lines.
    """

    def __init__(
        self,
        sink: EventSink[_E],
        metrics: ApiMetrics,
        *,
        max_queue: int,
        batch_size: int,
        linger_s: float,
        counter: Counter | None = None,
        what: str = "score event",
    ) -> None:
        if max_queue < 1 or batch_size < 1 or linger_s < 0:
            raise ValueError("max_queue and batch_size must be >= 1, linger_s >= 0")
        self.sink = sink
        self._what = what
        self._max_queue = max_queue
        self._batch_size = batch_size
        self._linger_s = linger_s
        # Unbounded underneath, bounded by `publish`: so the stop marker always fits.
        self._queue: asyncio.Queue[_E | _Stop] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        # Ends a batch's linger early: set when a full batch is queued or at close.
        self._wake = asyncio.Event()
        outcomes = counter if counter is not None else metrics.score_events
        self._written = metrics.child(outcomes, "written")
        self._dropped_full = metrics.child(outcomes, "dropped_queue_full")
        self._dropped_sink = metrics.child(outcomes, "dropped_sink_error")

    def publish(self, event: _E) -> bool:
        """Queue `event` for writing; never blocks.

        Returns:
            False when the event was dropped (queue full, or the publisher is closed).
        """
        if self._closed or self._queue.qsize() >= self._max_queue:
            self._dropped_full.inc()
            return False
        self._queue.put_nowait(event)
        if self._queue.qsize() >= self._batch_size:
            self._wake.set()
        return True

    def start(self) -> None:
        """Start the writer task on the running loop."""
        self._task = asyncio.create_task(self._run(), name="score-event-writer")

    async def aclose(self) -> None:
        """Write every event queued so far, then close the sink. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._task is not None:
            self._queue.put_nowait(_STOP)
            self._wake.set()
            await self._task
        await self.sink.aclose()

    async def _run(self) -> None:
        stopping = False
        while not stopping:
            batch: list[_E] = []
            item = await self._queue.get()
            if item is _STOP:
                break
            batch.append(item)
            if self._linger_s and not self._closed and self._queue.qsize() < self._batch_size - 1:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self._linger_s)
            while len(batch) < self._batch_size and not self._queue.empty():
                item = self._queue.get_nowait()
                if item is _STOP:
                    stopping = True
                    break
                batch.append(item)
            await self._write(batch)
        # Anything queued after the stop marker (nothing, once requests are done) is
        # written too rather than lost.
        rest = [e for e in _drain(self._queue) if not isinstance(e, _Stop)]
        for i in range(0, len(rest), self._batch_size):
            await self._write(rest[i : i + self._batch_size])

    async def _write(self, batch: list[_E]) -> None:
        try:
            await self.sink.write(batch)
        except PartialWrite as exc:
            self._written.inc(exc.written)
            self._dropped_sink.inc(exc.lost)
            logger.warning("%s sink failed, %d events dropped: %r", self._what, exc.lost, exc.__cause__)
        except Exception as exc:  # a failing sink must not stop the writer
            self._dropped_sink.inc(len(batch))
            logger.warning("%s sink failed, %d events dropped: %r", self._what, len(batch), exc)
        else:
            self._written.inc(len(batch))


def _drain(queue: asyncio.Queue[_T]) -> list[_T]:
    items = []
    while not queue.empty():
        items.append(queue.get_nowait())
    return items
