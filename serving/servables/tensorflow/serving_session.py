"""How a request's tensors are computed: a *Session*, batched or not.

TF Serving runs every Predict, Classify and Regress call as ``Session::Run`` on graph tensor
names, and ``--enable_batching`` swaps the servable's Session for a ``BatchingSession`` with the
same interface (``servables/tensorflow/bundle_factory_util.cc``: ``WrapSessionForBatching``).
This module is that seam, asynchronous:

* :class:`Session` -- the interface: ``await session.run_tensors(handle, feeds, fetches,
  timeout_ms)`` for the servable version a :class:`~serving.core.manager.ServableHandle` pins;
* :class:`DirectSession` -- one ``Session.run`` per call on the request thread pool (no batching);
* :class:`serving.batching.batching_session.BatchingSession` -- the batching wrapper, same interface.

The servable (:class:`serving.servables.tensorflow.servable.Servable`, or anything with a blocking ``run_tensors``:
:class:`TensorRunner`) does the TensorFlow work; a Session only decides when and on which thread.
Wrappers with the same interface add behaviour around any Session (batching; the
``runtime_latency`` metric in :mod:`serving.util.metrics`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np

from serving.core.servable_handle import ServableHandle
from serving.util.executor import BlockingExecutor

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
    """One ``Session.run`` per request, on the request :class:`BlockingExecutor`."""

    def __init__(self, executor: BlockingExecutor) -> None:
        self._executor = executor

    async def run_tensors(
        self,
        handle: ServableHandle,
        feeds: Mapping[str, np.ndarray],
        fetches: Sequence[str],
        timeout_ms: int | None,
    ) -> list[np.ndarray]:
        """See :meth:`Session.run_tensors`."""
        servable: TensorRunner = handle.servable
        return await self._executor.run(servable.run_tensors, feeds, fetches, timeout_ms)
