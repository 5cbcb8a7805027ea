"""Request coalescing: concurrent Predicts merged into one call of N rows, split back.

Concurrent predicts for the same servable, signature, version and input layout go to
serving as one Predict whose inputs are the callers' inputs concatenated along the batch
dimension; each caller gets its own rows of every output back. This is the product's one
batching layer (`COALESCING_ENABLED`, on by default): serving's own `--enable_batching`
stays off. A batch leaves at the first of:

- fewer than `COALESCING_EAGER_BATCHES` batches of its key per serving replica are in
  flight: it leaves at the end of the current event-loop iteration, so requests that
  arrived together still merge, but a lone request waits for nothing (no timer on this
  path);
- a batch of its key comes back and leaves room below that limit: what queued while
  serving worked goes at once, so under load a batch holds what arrived during one
  serving round trip and grows with the load by itself;
- it holds `COALESCING_MAX_BATCH_ROWS` rows;
- its window, `COALESCING_WINDOW_MS` after its first request, ends: only a bound for
  when the batches in flight do not come back (a hung replica, until its attempt
  timeout), well above a round trip under load.

So a request waits only for the batch in flight before it, during which serving's CPU is
busy with that batch anyway. Why here and not in serving: one call per batch saves the
HTTP exchange, the JSON codec and the Session run per request on both tiers, where
serving-side batching saves only the Session run (measured on one core, the fraud MLP at
1,500 requests/s: serving's CPU per request 0.14 ms coalesced against 0.20 ms without;
the transformer at 300 requests/s: 2.1 ms against 3.5 ms, with p99 35 ms against
over 400 ms).

Why the window is not the trigger: with serving's round trip longer than the window, a
window-sent batch goes beside the one in flight, serving runs smaller batches, its round
trip grows, and more batches go by the window: with a 2 ms window the transformer (about
2 ms of fixed cost per Session run) fell to 200 answers/s at 300 offered, p99 700 ms, where
a window that never fired served 300 at p99 35 ms (one core, the same run). The window
only bounds a stalled batch; it is kept well above serving's fixed cost per call.

The merge and split are pure functions (`batch_key`, `merge_requests`,
`split_response`); `CoalescingClient` only queues, times and hands out results. It is
a wrapper with the same interface as the client it wraps (`ServingClient`).

Deadlines and cancellation: the batch's call gets the latest of its callers'
deadlines; each caller still waits no longer than its own and then gets
`ServingTimeout`, and a caller that is cancelled or times out leaves the batch running
for the others (its result is dropped). Timers use the loop's monotonic clock through
relative delays only.
"""

from __future__ import annotations

import asyncio
import copy
import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

from api.serving_client._deadline import Deadline
from api.serving_client._errors import (
    DEADLINE_PASSED,
    ServingBadResponse,
    ServingError,
    ServingTimeout,
    ServingUnavailable,
)
from api.serving_client._tracing import ClientTracer, request_attributes
from api.serving_client._types import (
    ModelMetadata,
    ModelStatus,
    PredictRequest,
    PredictResponse,
    Scalar,
    ServingClient,
    Tensor,
)


def batch_key(request: PredictRequest) -> Hashable | None:
    """What requests must share to be merged, or None if `request` cannot be.

    Mergeable requests have the same model spec and output filter, and the same input
    names, dtypes and per-row shapes (every dimension but the first). A request is not
    mergeable when an input is a scalar or its inputs disagree on the batch size.
    """
    if not request.inputs:
        return None
    sizes = {t.shape[0] if t.shape else None for t in request.inputs.values()}
    if None in sizes or len(sizes) != 1:
        return None
    layout = tuple(sorted((name, t.dtype, t.shape[1:]) for name, t in request.inputs.items()))
    return (request.model_spec, request.output_filter, layout)


def batch_rows(request: PredictRequest) -> int:
    """Rows (first dimension) of a mergeable request."""
    return next(iter(request.inputs.values())).shape[0]


def merge_requests(requests: Sequence[PredictRequest]) -> PredictRequest:
    """One request whose inputs are the given ones' concatenated along dimension 0.

    Args:
        requests: one or more requests with equal `batch_key`, in caller order.

    Raises:
        ValueError: the requests do not share a batch key.
    """
    first = requests[0]
    key = batch_key(first)
    if key is None or any(batch_key(r) != key for r in requests[1:]):
        raise ValueError("only requests with the same batch_key can be merged")
    inputs: dict[str, Tensor] = {}
    for name, tensor in first.inputs.items():
        values: list[Scalar] = []
        rows = 0
        for request in requests:
            part = request.inputs[name]
            values.extend(part.values)
            rows += part.shape[0]
        inputs[name] = Tensor((rows, *tensor.shape[1:]), values, tensor.dtype)
    return PredictRequest(first.model_spec, inputs, first.output_filter)


def split_response(response: PredictResponse, sizes: Sequence[int]) -> list[PredictResponse]:
    """Split a merged answer back into one answer per request, `sizes[i]` rows each.

    Raises:
        ServingBadResponse: an output's first dimension is not `sum(sizes)`, so it
            cannot be told apart per request.
    """
    total = sum(sizes)
    parts: list[dict[str, Tensor]] = [{} for _ in sizes]
    for name, tensor in response.outputs.items():
        if not tensor.shape or tensor.shape[0] != total:
            raise ServingBadResponse(
                f"cannot split output '{name}' of shape {list(tensor.shape)} into "
                f"{len(sizes)} requests of {total} rows"
            )
        row = math.prod(tensor.shape[1:])
        start = 0
        for i, rows in enumerate(sizes):
            end = start + rows * row
            parts[i][name] = Tensor((rows, *tensor.shape[1:]), tensor.values[start:end], tensor.dtype)
            start = end
    return [PredictResponse(outputs, response.model_version) for outputs in parts]


@dataclass(eq=False)
class _Member:
    request: PredictRequest
    deadline: Deadline
    future: asyncio.Future[PredictResponse]
    abandoned: bool = False  # the caller stopped waiting; drop its result
    caller: object = None  # the caller's trace position (`ClientTracer.caller`), when traced


@dataclass(eq=False)
class _Batch:
    key: Hashable
    members: list[_Member] = field(default_factory=list)
    rows: int = 0
    timer: asyncio.Handle | None = None  # call_soon (eager) or call_later (window)


class CoalescingClient:
    """A `ServingClient` that merges concurrent predicts into batches (see module doc).

    Args:
        inner: the client batches are sent through (e.g. `ReplicatedClient`).
        window_s: the longest a batch waits after its first request while the eager limit
            holds it back (or always, with `eager_batches` 0), seconds.
        max_batch_rows: rows at which a batch leaves at once; a request with more
            rows than this goes alone.
        eager_batches: a batch leaves without waiting for its window while fewer than
            this many batches of its key per replica are in flight; 0 always waits the
            window.
        replicas: how many serving replicas calls are spread over now (read per batch;
            the in-flight limit is `eager_batches` times this).
        tracer: opens one span per coalesced call, for all its callers (`_tracing`); None: none.

    Raises:
        ValueError: `window_s` < 0, `max_batch_rows` < 1 or `eager_batches` < 0.
    """

    def __init__(
        self,
        inner: ServingClient,
        *,
        window_s: float,
        max_batch_rows: int,
        eager_batches: int = 1,
        replicas: Callable[[], int] = lambda: 1,
        tracer: ClientTracer | None = None,
    ) -> None:
        if window_s < 0 or max_batch_rows < 1 or eager_batches < 0:
            raise ValueError("window_s must be >= 0, max_batch_rows >= 1 and eager_batches >= 0")
        self._inner = inner
        self._window_s = window_s
        self._max_rows = max_batch_rows
        self._eager = eager_batches
        self._replicas = replicas
        self._tracer = tracer
        self._open: dict[Hashable, _Batch] = {}
        self._in_flight: dict[Hashable, int] = {}  # batches sent and not back, per key
        self._running: set[asyncio.Task[None]] = set()

    def _room(self, key: Hashable) -> bool:
        """True while fewer batches of `key` are in flight than the eager limit allows."""
        return self._in_flight.get(key, 0) < self._eager * max(1, self._replicas())

    async def predict(self, request: PredictRequest, deadline: Deadline) -> PredictResponse:
        """Predict, possibly as part of a batch; the same contract as the inner client."""
        key = batch_key(request)
        rows = batch_rows(request) if key is not None else 0
        if key is None or rows > self._max_rows:
            return await self._inner.predict(request, deadline)
        batch = self._open.get(key)
        if batch is not None and batch.rows + rows > self._max_rows:
            self._dispatch(batch)
            batch = None
        loop = asyncio.get_running_loop()
        if batch is None:
            batch = _Batch(key)
            self._open[key] = batch
            if self._room(key):
                # Nothing to wait for: leave once the requests already runnable have joined.
                batch.timer = loop.call_soon(self._dispatch, batch)
            else:
                batch.timer = loop.call_later(self._window_s, self._dispatch, batch)
        member = _Member(request, deadline, loop.create_future())
        if self._tracer is not None:
            member.caller = self._tracer.caller()
        batch.members.append(member)
        batch.rows += rows
        if batch.rows >= self._max_rows:
            self._dispatch(batch)
        try:
            # No shield: if this caller gives up, its future is cancelled, and the batch
            # skips a member whose future is done (`_settle`).
            async with deadline.timeout():
                return await member.future
        except TimeoutError:
            member.abandoned = True
            raise ServingTimeout(DEADLINE_PASSED) from None
        except BaseException:
            member.abandoned = True
            raise

    async def model_status(self, model_name: str, deadline: Deadline) -> ModelStatus:
        """Passed through: status calls are not batched."""
        return await self._inner.model_status(model_name, deadline)

    async def model_metadata(
        self, model_name: str, version: int | str | None, deadline: Deadline, *, label: str | None = None
    ) -> ModelMetadata:
        """Passed through: metadata calls are not batched."""
        return await self._inner.model_metadata(model_name, version, deadline, label=label)

    async def aclose(self) -> None:
        """Send what is queued, wait for batches in flight, then close the inner client."""
        for batch in list(self._open.values()):
            self._dispatch(batch)
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)
        await self._inner.aclose()

    def _dispatch(self, batch: _Batch) -> None:
        """Close `batch` to newcomers and send it (no-op if already sent)."""
        if self._open.get(batch.key) is batch:
            del self._open[batch.key]
        if batch.timer is not None:
            batch.timer.cancel()
            batch.timer = None
        members = [m for m in batch.members if not m.abandoned]
        batch.members = []
        if not members:
            return
        self._in_flight[batch.key] = self._in_flight.get(batch.key, 0) + 1
        task = asyncio.get_running_loop().create_task(self._run(batch.key, members))
        self._running.add(task)  # keep a reference until done (the loop holds weak ones)
        task.add_done_callback(self._running.discard)

    def _returned(self, key: Hashable) -> None:
        """A batch of `key` is back: below the eager limit, what queued meanwhile goes now."""
        left = self._in_flight[key] - 1
        if left:
            self._in_flight[key] = left
        else:
            del self._in_flight[key]
        waiting = self._open.get(key)
        if waiting is not None and self._room(key):
            self._dispatch(waiting)

    async def _run(self, key: Hashable, members: list[_Member]) -> None:
        """One Predict for the batch; every live member gets its part or the error."""
        try:
            await self._predict_batch(members)
        finally:
            self._returned(key)

    async def _predict_batch(self, members: list[_Member]) -> None:
        deadline = max((m.deadline for m in members), key=lambda d: d.expires_at)
        try:
            merged = merge_requests([m.request for m in members])
            if self._tracer is None:
                response = await self._inner.predict(merged, deadline)
            else:
                attributes = {**request_attributes(merged), "tfserving.coalesced_requests": len(members)}
                with self._tracer.coalesced_call([m.caller for m in members], attributes) as annotate:
                    response = await self._inner.predict(merged, deadline)
                    if response.model_version is not None:
                        annotate("tfserving.model_spec.version", response.model_version)
            parts = split_response(response, [batch_rows(m.request) for m in members])
        except ServingError as exc:
            for m in members:
                _settle(m, _copy(exc))
            return
        except BaseException as exc:
            # Cancelled (shutdown) or a bug: no member may wait forever.
            for m in members:
                _settle(m, ServingUnavailable(f"batch failed ({type(exc).__name__})"))
            if not isinstance(exc, Exception):
                raise
            return
        for m, part in zip(members, parts, strict=True):
            _settle(m, part)


def _settle(member: _Member, outcome: PredictResponse | BaseException) -> None:
    """Give the member its answer, or the exception it raises."""
    if member.abandoned or member.future.done():
        return  # nobody will read it; setting an error here would log "never retrieved"
    if isinstance(outcome, BaseException):
        member.future.set_exception(outcome)
    else:
        member.future.set_result(outcome)


def _copy(exc: ServingError) -> ServingError:
    """A fresh exception per caller, so concurrent raises do not share a traceback."""
    return copy.copy(exc)
