"""How a request's tensors are computed: a *Session*, batched or not.

TF Serving runs every Predict, Classify and Regress call as ``Session::Run`` on graph tensor
names, and ``--enable_batching`` swaps the servable's Session for a ``BatchingSession`` with the
same interface (``servables/tensorflow/bundle_factory_util.cc``: ``WrapSessionForBatching``).
This module is that seam, asynchronous:

* :class:`Session` -- the interface: ``await session.run_tensors(handle, feeds, fetches,
  timeout_ms)`` for the servable version a :class:`~serving.core.manager.ServableHandle` pins;
* :class:`DirectSession` -- one ``Session.run`` per call on the request thread pool (no batching),
  or on the event loop itself for runs measured shorter than ``--session_run_inline_below_us``;
* :class:`serving.batching.batching_session.BatchingSession` -- the batching wrapper, same interface.

The servable (:class:`serving.servables.tensorflow.servable.Servable`, or anything with a blocking ``run_tensors``:
:class:`TensorRunner`) does the TensorFlow work; a Session only decides when and on which thread.
Wrappers with the same interface add behaviour around any Session (batching; the
``runtime_latency`` metric in :mod:`serving.util.metrics`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np

from serving.core.servable_handle import ServableHandle
from serving.util.executor import BlockingExecutor

if TYPE_CHECKING:
    from serving.util.tracing import ServingTracing

__all__ = ["DirectSession", "Session", "TensorRunner"]


class TensorRunner(Protocol):
    """A loaded servable version's blocking ``Session::Run`` on graph tensor names."""

    def run_tensors(
        self,
        feeds: Mapping[str, np.ndarray],
        fetches: Sequence[str],
        timeout_ms: int | None = None,
    ) -> list[np.ndarray]:
        """Feed ``{tensor name: array}``, return the ``fetches`` values in order; may raise."""
        ...


class Session(Protocol):
    """Runs a servable's tensors off the event loop: :class:`DirectSession` or a batching one."""

    async def run_tensors(
        self,
        handle: ServableHandle,
        feeds: Mapping[str, np.ndarray],
        fetches: Sequence[str],
        timeout_ms: int | None,
    ) -> list[np.ndarray]:
        """``handle.servable.run_tensors(feeds, fetches, timeout_ms)``, awaited.

        ``handle.servable`` is a :class:`TensorRunner`; the caller holds the handle (and so the
        version) until this returns. ``feeds`` are one request's tensors, ``{graph tensor name:
        array}``, batched along dimension 0 where the model expects it; the result is that
        request's fetched arrays, in ``fetches`` order. Raises
        :class:`~serving.util.errors.ServingError`.
        """
        ...


class DirectSession:
    """One ``Session.run`` per request, on the request :class:`BlockingExecutor`.

    With ``inline_below_s`` > 0, a run whose recent duration (an exponentially weighted mean of
    the runs of that servable version and batch size, measured on the thread that ran them) is
    below it runs on the event loop instead: handing a run of a tenth of a millisecond to a
    thread and its answer back to the loop costs two thread wake-ups and two hand-overs of the
    GIL, more than the run itself for a small model (`python -m bench --hop` counts them). A
    run that turns out longer raises the mean and goes back to the threads; the loop is held at
    most about ``inline_below_s`` per inline run. Every 64th run of an inlined key goes to the
    threads anyway, so a servable that became slower is noticed.

    With ``tracing``, each run is a ``Session run`` span (:mod:`serving.util.tracing`), the
    request's child: model, version and rows.
    """

    #: Weight of the newest run in the mean.
    ALPHA = 0.2
    #: Of the runs of an inlined key, one in this many is measured on the threads.
    RECHECK_EVERY = 64

    def __init__(
        self, executor: BlockingExecutor, *, inline_below_s: float = 0.0, tracing: ServingTracing | None = None
    ) -> None:
        self._executor = executor
        self._tracing = tracing
        self._inline_below_s = inline_below_s
        self._mean_s: dict[tuple[str, int, int], float] = {}
        self._inlined: dict[tuple[str, int, int], int] = {}

    async def run_tensors(
        self,
        handle: ServableHandle,
        feeds: Mapping[str, np.ndarray],
        fetches: Sequence[str],
        timeout_ms: int | None,
    ) -> list[np.ndarray]:
        """See :meth:`Session.run_tensors`."""
        if self._tracing is None:
            return await self._run(handle, feeds, fetches, timeout_ms)
        first = next(iter(feeds.values()), None)
        attributes: dict[str, str | int | bool] = {
            "tfserving.model_spec.name": handle.name,
            "tfserving.model_spec.version": handle.version,
            "tfserving.batch_size": int(first.shape[0]) if first is not None and first.ndim else 0,
        }
        with self._tracing.session_run(attributes):
            return await self._run(handle, feeds, fetches, timeout_ms)

    async def _run(
        self,
        handle: ServableHandle,
        feeds: Mapping[str, np.ndarray],
        fetches: Sequence[str],
        timeout_ms: int | None,
    ) -> list[np.ndarray]:
        servable: TensorRunner = handle.servable
        if self._inline_below_s <= 0:
            return await self._executor.run(servable.run_tensors, feeds, fetches, timeout_ms)
        first = next(iter(feeds.values()), None)
        rows = int(first.shape[0]) if first is not None and first.ndim else 0
        key = (handle.name, handle.version, rows)
        mean = self._mean_s.get(key)
        if mean is not None and mean < self._inline_below_s:
            count = self._inlined.get(key, 0) + 1
            self._inlined[key] = count
            if count % self.RECHECK_EVERY:
                started = time.perf_counter()
                try:
                    return servable.run_tensors(feeds, fetches, timeout_ms)
                finally:
                    self._record(key, time.perf_counter() - started)
        values, took = await self._executor.run(_timed, servable, feeds, fetches, timeout_ms)
        self._record(key, took)
        return values

    def _record(self, key: tuple[str, int, int], seconds: float) -> None:
        mean = self._mean_s.get(key)
        self._mean_s[key] = seconds if mean is None else mean + self.ALPHA * (seconds - mean)


def _timed(
    servable: TensorRunner, feeds: Mapping[str, np.ndarray], fetches: Sequence[str], timeout_ms: int | None
) -> tuple[list[np.ndarray], float]:
    """``servable.run_tensors(...)`` and how long it took on this thread, seconds."""
    started = time.perf_counter()
    values = servable.run_tensors(feeds, fetches, timeout_ms)
    return values, time.perf_counter() - started
