"""Event-loop lag and block detector.

An API worker is one event loop: a callback that does not return (a `time.sleep`, a
sync HTTP call, a heavy computation inside an `async def`) stalls every request of that
worker. This module measures that in two ways:

* Lag (a periodic task on the loop): sleeps `interval_s`, then compares the actual
  wake-up with the expected one on the monotonic clock. The difference is how long the
  loop was busy elsewhere; it goes into `api_event_loop_lag_seconds`.
* Blocks (a watchdog thread): the periodic task stamps a heartbeat each time it runs.
  When the heartbeat is older than `interval_s + threshold_s`, the loop is late, so the
  thread looks at what the loop thread is running: the current asyncio task, mapped to
  its request's route by the middleware (`track`), and the innermost frame of the loop
  thread's stack; and looks again a moment later. The same task (or, outside tasks, the
  same frame) both times is a block: one warning naming both, counted in
  `api_event_loop_blocks_total{route}`. Different work both times is an overloaded loop
  (a long queue of short callbacks, e.g. far more connections than the worker keeps up
  with): logged at INFO, not counted as a block, and visible in the lag histogram. A block the
  thread could not see while it happened (a C extension holding the GIL the whole time) is still caught by the lag
  task afterwards, counted with route `unknown`.

Cost on the request path: one dict insert and delete per request (`track`/`untrack`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import threading
import time
import traceback
from collections.abc import MutableMapping
from dataclasses import dataclass
from types import FrameType
from typing import Final

from api.observability.metrics import ApiMetrics

logger = logging.getLogger("api.observability.loop_monitor")

UNKNOWN_ROUTE: Final = "unknown"


def route_of(scope: MutableMapping[str, object]) -> str | None:
    """The matched route's path template from an ASGI scope, or None before routing."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else None


class LoopMonitor:
    """Measures one event loop's lag and reports callbacks that block it.

    Args:
        metrics: where lag and blocks are recorded.
        interval_s: period of the lag probe, seconds (> 0).
        threshold_s: a callback holding the loop longer than this is a block, seconds.

    Use: `await start()` on the loop to watch (the app's lifespan), `await stop()` at
    shutdown; the middleware calls `track(task, scope)` / `untrack(task)` around each
    request so a block can be attributed to its route.
    """

    def __init__(self, metrics: ApiMetrics, *, interval_s: float, threshold_s: float) -> None:
        if interval_s <= 0 or threshold_s <= 0:
            raise ValueError("interval_s and threshold_s must be > 0")
        self._metrics = metrics
        self._interval_s = interval_s
        self._threshold_s = threshold_s
        # Requests being handled: their task -> their ASGI scope (route filled in by the
        # router once matched). Written on the loop, read by the watchdog thread.
        self._requests: dict[asyncio.Task[object], MutableMapping[str, object]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread_id: int | None = None
        self._probe: asyncio.Task[None] | None = None
        self._watchdog: threading.Thread | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # guards _heartbeat/_reported between the two sides
        self._heartbeat = time.monotonic()
        self._reported = False  # the watchdog already reported the current block

    # The request side (event loop) ----------------------------------------------------

    def track(self, task: asyncio.Task[object] | None, scope: MutableMapping[str, object]) -> None:
        """Attribute blocks in `task` to the request whose ASGI `scope` this is."""
        if task is not None:
            self._requests[task] = scope

    def untrack(self, task: asyncio.Task[object] | None) -> None:
        """The request running in `task` has finished."""
        if task is not None:
            self._requests.pop(task, None)

    # Lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the lag probe on the running loop and the watchdog thread."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread_id = threading.get_ident()
        self._stopping.clear()
        self._heartbeat = time.monotonic()
        self._probe = asyncio.create_task(self._probe_lag(), name="loop-monitor")
        self._watchdog = threading.Thread(target=self._watch, name="loop-watchdog", daemon=True)
        self._watchdog.start()

    async def stop(self) -> None:
        """Stop both; waits for the thread (it wakes at least every `threshold_s / 4`)."""
        self._stopping.set()
        if self._probe is not None:
            self._probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe
        if self._watchdog is not None:
            await asyncio.to_thread(self._watchdog.join)

    # The lag probe (event loop) -------------------------------------------------------

    async def _probe_lag(self) -> None:
        while True:
            expected = time.monotonic() + self._interval_s
            await asyncio.sleep(self._interval_s)
            now = time.monotonic()
            lag = max(0.0, now - expected)
            self._metrics.loop_lag.observe(lag)
            with self._lock:
                missed = lag > self._threshold_s and not self._reported
                self._heartbeat = now
                self._reported = False
            if missed:
                self._report(UNKNOWN_ROUTE, lag, where="not seen while blocked")

    # The watchdog (its own thread) ----------------------------------------------------

    def _watch(self) -> None:
        poll_s = min(self._interval_s, self._threshold_s / 4)
        while not self._stopping.wait(poll_s):
            with self._lock:
                # How long past its expected wake-up the probe has not run: the loop has
                # been held that long by whatever it is running now.
                late = time.monotonic() - self._heartbeat - self._interval_s
                if self._reported or late <= self._threshold_s:
                    continue
                beat = self._heartbeat
            first = self._what_is_running()
            # Confirm a moment later: one callback holding the loop is still running then;
            # an overloaded loop (a long queue of short callbacks) is running another one.
            if self._stopping.wait(poll_s):
                break
            with self._lock:
                if self._reported or self._heartbeat != beat:
                    continue  # the probe ran meanwhile: the loop was not held
                late = time.monotonic() - beat - self._interval_s
                self._reported = True
            second = self._what_is_running()
            if first.same_work_as(second):
                self._report(first.route, late, where=first.where)
            else:
                logger.info(
                    "event loop %.0f ms late without one callback holding it: more work "
                    "queued than this worker keeps up with (overload, not a block)",
                    late * 1000,
                    extra={"lag_ms": round(late * 1000, 1)},
                )

    def _what_is_running(self) -> _Running:
        """What the loop thread is executing now: its task, route and innermost frame.

        The route is known when the running task is a request's own task (uvicorn runs
        each request in one, and the middleware tracks it). Work in other tasks or plain
        callbacks is `unknown`, never blamed on a request that merely is in flight.
        """
        task = asyncio.current_task(self._loop) if self._loop is not None else None
        scope = self._requests.get(task) if task is not None else None
        route = UNKNOWN_ROUTE
        if scope is not None:
            route = route_of(scope) or str(scope.get("path", UNKNOWN_ROUTE))
        frame = sys._current_frames().get(self._loop_thread_id or -1)
        return _Running(task, frame, route, _innermost(frame))

    def _report(self, route: str, seconds: float, *, where: str) -> None:
        self._metrics.child(self._metrics.loop_blocks, route).inc()
        logger.warning(
            "event loop blocked for more than %.0f ms (%.0f ms so far) by route %s at %s",
            self._threshold_s * 1000,
            seconds * 1000,
            route,
            where,
            extra={"route": route, "blocked_ms": round(seconds * 1000, 1), "where": where},
        )


@dataclass(frozen=True)
class _Running:
    """A look at the loop thread: the current task (None in a plain callback), its
    innermost frame, the request route it serves and `file:line in function` there."""

    task: asyncio.Task[object] | None
    frame: FrameType | None
    route: str
    where: str

    def same_work_as(self, later: _Running) -> bool:
        """Whether `later` is the same piece of work still running (a block)."""
        if self.task is not None:
            return self.task is later.task
        return self.frame is not None and self.frame is later.frame


def _innermost(frame: FrameType | None) -> str:
    """`file:line in function` of the deepest frame, or '?' when there is none."""
    if frame is None:
        return "?"
    summary = traceback.extract_stack(frame, limit=1)[-1]
    return f"{summary.filename}:{summary.lineno} in {summary.name}"
