"""Shadow traffic: a sample of answered requests mirrored to another target, off the critical path.

`ShadowMirror` (one per API worker) takes a `ShadowCall` once the primary's answer is ready,
before it is sent (`submit`: a non-blocking put on a bounded queue, microseconds), and runs it
in the background on at most `concurrency` tasks:

- **never delays or fails the primary**: nothing about the primary waits for the shadow, and
  every failure of the shadow (serving errors, a missing model, a hung replica, a bug in the
  route's postprocess on the shadow's outputs) is caught here, logged at most once a minute per
  route and counted;
- **shares the request's deadline**: the shadow call runs on what is left of the request's
  budget, so a hung shadow costs at most that, and a call whose budget is below its model's
  median latency is dropped before it is sent;
- **dropped and counted, never queued without bound**: when the queue is full
  (`dropped_queue_full`), when serving was found saturated within the last
  `SATURATION_HOLD_S` (a shadow or primary call answered UNAVAILABLE / RESOURCE_EXHAUSTED or ran
  out of time: `dropped_saturated`), when too little budget is left (`dropped_deadline`), or
  when submitted during shutdown (`dropped_shutdown`). At shutdown, once the server has
  finished its requests, the calls already queued still run, each within what is left of its
  request's deadline, so shutdown waits at most about `REQUEST_TIMEOUT_S` for them;
- **compared**: the shadow's outputs go through the route's own postprocess, and the two answers
  are compared field by field (`api.rollouts.compare`): `api_shadow_difference` (numbers) and
  `api_shadow_agreements_total` (classes) by route and `model:version` pair, and a score event
  with `arm: "shadow"` and `compared_with` (the primary's model, version, arm and the
  comparison).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from api.inference.served_model import ServedModel
from api.observability.events import EventPublisher, ScoreEvent
from api.observability.metrics import ApiMetrics
from api.rollouts.compare import compare_answers
from api.serving_client import (
    Deadline,
    DeadlineExceeded,
    ServingError,
    ServingTimeout,
    ServingUnavailable,
    Tensor,
)

logger = logging.getLogger("api.rollouts.shadow")

#: After serving was found saturated, shadow calls are dropped this long, seconds.
SATURATION_HOLD_S = 1.0
#: The longest shutdown waits for queued shadow calls, seconds: a bound above any request budget
#: (their deadlines end them sooner).
DRAIN_LIMIT_S = 30.0
#: A route's shadow failures are logged at most once per this, seconds (they are all counted).
LOG_EVERY_S = 60.0

#: The shadow's outputs and model -> (output alias -> value, the route's answer).
ShadowAnswer = Callable[[Mapping[str, Tensor], str, int], tuple[Mapping[str, Any], BaseModel]]


@dataclass(frozen=True, slots=True)
class ShadowCall:
    """One mirrored request.

    Attributes:
        route: the route's name.
        served: the shadow target's model (its own `ServedModel`, apart from the primary's).
        version / label: the shadow target (`model_spec.version` / `version_label`; neither: latest).
        inputs: the request's model inputs, as sent to the primary.
        outputs: the output names the route reads.
        deadline: the request's deadline.
        answer: makes the route's answer from the shadow's outputs (`ShadowAnswer`).
        primary: the answer the caller got.
        primary_model / primary_version / primary_arm: what answered it.
        request_id / input_id: for the score event.
    """

    route: str
    served: ServedModel
    version: int | None
    label: str | None
    inputs: Mapping[str, Tensor]
    outputs: tuple[str, ...]
    deadline: Deadline
    answer: ShadowAnswer
    primary: BaseModel
    primary_model: str
    primary_version: int
    primary_arm: str
    request_id: str
    input_id: str | None


class ShadowMirror:
    """The worker's shadow calls: a bounded queue and at most `concurrency` running (module doc).

    Args:
        metrics: the app's metrics (`ApiMetrics.rollouts` is recorded).
        events: where the shadow's score events go; None: none are written.
        max_queue: calls waiting at most.
        concurrency: calls running at most.
    """

    def __init__(
        self, metrics: ApiMetrics, events: EventPublisher[ScoreEvent] | None, *, max_queue: int, concurrency: int
    ) -> None:
        self._metrics = metrics
        self._events = events
        self._queue: asyncio.Queue[ShadowCall] = asyncio.Queue(maxsize=max_queue)
        self._concurrency = concurrency
        self._tasks: list[asyncio.Task[None]] = []
        self._saturated_until = float("-inf")
        self._logged_at: dict[str, float] = {}
        self._closed = False

    @property
    def queued(self) -> int:
        """Calls waiting now."""
        return self._queue.qsize()

    def saturated(self) -> bool:
        """True while serving counts as saturated (see `note`)."""
        return time.monotonic() < self._saturated_until

    def note(self, exc: BaseException) -> None:
        """A call to serving failed with `exc`: UNAVAILABLE (down, overloaded) or out of time
        marks serving saturated for `SATURATION_HOLD_S`."""
        if isinstance(exc, (ServingUnavailable, ServingTimeout, DeadlineExceeded)):
            self._saturated_until = time.monotonic() + SATURATION_HOLD_S

    def submit(self, call: ShadowCall) -> bool:
        """Queue `call` without waiting; False (and counted) when it is dropped."""
        if self._closed:
            self._count(call.route, "dropped_shutdown")
            return False
        if self.saturated():
            self._count(call.route, "dropped_saturated")
            return False
        try:
            self._queue.put_nowait(call)
        except asyncio.QueueFull:
            self._count(call.route, "dropped_queue_full")
            return False
        return True

    def start(self) -> None:
        """Start the tasks that run the calls (in the worker's lifespan)."""
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._work(), name=f"shadow-{i}") for i in range(self._concurrency)]

    async def aclose(self) -> None:
        """Take no more calls, run those queued (each within its request's deadline, so this
        ends within about the longest request budget), then stop the tasks."""
        self._closed = True
        if self._tasks:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(DRAIN_LIMIT_S):
                    await self._queue.join()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _work(self) -> None:
        while True:
            call = await self._queue.get()
            try:
                await self._run(call)
            except Exception:  # a bug here must not end the task
                logger.exception("shadow call of route %s failed unexpectedly", call.route)
            finally:
                self._queue.task_done()

    async def _run(self, call: ShadowCall) -> None:
        typical = call.served.latency.median()
        left = call.deadline.remaining()
        if left <= 0 or (typical is not None and left < typical):
            self._count(call.route, "dropped_deadline")
            return
        if self.saturated():
            self._count(call.route, "dropped_saturated")
            return
        started = time.monotonic()
        try:
            response = await call.served.predict(
                call.inputs, call.deadline, outputs=call.outputs, version=call.version, label=call.label
            )
            assert response.model_version is not None, "ServedModel.predict names the version that ran"
            values, answer = call.answer(response.outputs, call.served.model_name, response.model_version)
        except ServingError as exc:
            self.note(exc)
            self._failed(call, f"{exc.code.name}: {exc.message}")
            return
        except DeadlineExceeded as exc:
            self.note(exc)
            self._count(call.route, "dropped_deadline")
            return
        except Exception as exc:  # the route's checks or postprocess refused the shadow's outputs
            self._failed(call, f"{type(exc).__name__}: {exc}")
            return
        self._compared(call, response.model_version, values, answer, time.monotonic() - started)

    def _compared(
        self, call: ShadowCall, version: int, values: Mapping[str, Any], answer: BaseModel, seconds: float
    ) -> None:
        metrics = self._metrics
        rollouts = metrics.rollouts
        primary = f"{call.primary_model}:{call.primary_version}"
        shadow = f"{call.served.model_name}:{version}"
        comparison = compare_answers(call.primary, answer)
        for field_name, difference in comparison.differences.items():
            metrics.child(rollouts.shadow_difference, call.route, field_name, primary, shadow).observe(difference)
        for field_name, agree in comparison.agreements.items():
            label = "true" if agree else "false"
            metrics.child(rollouts.shadow_agreements, call.route, field_name, primary, shadow, label).inc()
        self._count(call.route, "compared")
        if self._events is not None:
            self._events.publish(
                ScoreEvent(
                    ts=time.time(),
                    request_id=call.request_id,
                    route=call.route,
                    model_name=call.served.model_name,
                    model_version=version,
                    input_id=call.input_id,
                    outputs=values,
                    latency_ms=seconds * 1000,
                    fields={},
                    arm="shadow",
                    compared_with={
                        "model_name": call.primary_model,
                        "model_version": call.primary_version,
                        "arm": call.primary_arm,
                        **comparison.as_json(),
                    },
                )
            )

    def _failed(self, call: ShadowCall, why: str) -> None:
        self._count(call.route, "failed")
        now = time.monotonic()
        if now - self._logged_at.get(call.route, float("-inf")) >= LOG_EVERY_S:
            self._logged_at[call.route] = now
            logger.warning(
                "shadow call of route %s to model %s failed (the primary answer is unaffected; "
                "every failure is counted in api_shadow_requests_total): %s",
                call.route, call.served.model_name, why,
            )  # fmt: skip

    def _count(self, route: str, outcome: str) -> None:
        metrics = self._metrics
        metrics.child(metrics.rollouts.shadow_requests, route, outcome).inc()
