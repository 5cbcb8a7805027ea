"""The core of Classify, Regress and MultiInference, shared by every front end.

TF Serving's ``TensorflowClassificationServiceImpl`` (``classification_service.cc``),
``TensorflowRegressionServiceImpl`` (``regression_service.cc``) and ``RunMultiInference``
(``multi_inference_helper.cc``): look the servable up, check the request
(:func:`~serving.servables.tensorflow.classifier.prepare_classify`,
:func:`~serving.servables.tensorflow.regressor.prepare_regress`,
:func:`~serving.servables.tensorflow.multi_inference.prepare_multi_inference`), run it through the
same :class:`~serving.servables.tensorflow.serving_session.Session` as Predict, post-process. The
requests and results are :mod:`serving.apis` types; the REST codec
(:mod:`serving.util.json_example`) and the gRPC codec (:mod:`serving.util.proto_codec`) translate.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from serving.apis import (
    ClassificationResponse,
    ExampleRequest,
    ModelSpec,
    MultiInferenceRequest,
    MultiInferenceResponse,
    RegressionResponse,
)
from serving.core.manager import ServableManager
from serving.core.servable_handle import ServableHandle
from serving.servables.tensorflow.classifier import prepare_classify
from serving.servables.tensorflow.inference_call import INFERENCE_APIS, InferenceCall
from serving.servables.tensorflow.multi_inference import prepare_multi_inference
from serving.servables.tensorflow.regressor import prepare_regress
from serving.servables.tensorflow.serving_session import DirectSession, Session
from serving.util.executor import BlockingExecutor

__all__ = ["InferenceRunner", "InferenceService"]


class InferenceService(Protocol):
    """What the front ends call for Classify, Regress and MultiInference: an
    :class:`InferenceRunner` or a wrapper with its interface
    (:class:`serving.servables.tensorflow.monitored.MonitoredInference`)."""

    async def classify(
        self, request: ExampleRequest, *, timeout_ms: int | None = None
    ) -> ClassificationResponse:
        """See :meth:`InferenceRunner.classify`."""
        ...

    async def regress(
        self, request: ExampleRequest, *, timeout_ms: int | None = None
    ) -> RegressionResponse:
        """See :meth:`InferenceRunner.regress`."""
        ...

    async def multi_inference(
        self, request: MultiInferenceRequest, *, timeout_ms: int | None = None
    ) -> MultiInferenceResponse:
        """See :meth:`InferenceRunner.multi_inference`."""
        ...


class InferenceRunner:
    """Runs Classify, Regress and MultiInference on the manager's servables.

    The Examples go through a :class:`~serving.servables.tensorflow.serving_session.Session` (default: a
    :class:`~serving.servables.tensorflow.serving_session.DirectSession` on ``executor``), the same seam as Predict, so
    ``--enable_batching`` merges concurrent classify or regress calls too (TF Serving batches at
    its ``Session``, whatever the API). ``session_for(api)``, when given, is called once per API
    of :data:`INFERENCE_APIS` with its name and returns the Session that API runs through (the
    server wraps ``session`` per API in :class:`serving.servables.tensorflow.monitored.MonitoredSession`, which records
    what TF Serving records per API); without it every API uses ``session``.
    ``method_name_check`` is ``--enable_signature_method_name_check``.
    """

    def __init__(
        self,
        manager: ServableManager,
        executor: BlockingExecutor,
        *,
        session: Session | None = None,
        session_for: Callable[[str], Session] | None = None,
        method_name_check: bool = False,
    ) -> None:
        self._manager = manager
        default: Session = session if session is not None else DirectSession(executor)
        self._sessions: dict[str, Session] = {
            api: session_for(api) if session_for is not None else default
            for api in INFERENCE_APIS
        }
        self._method_name_check = method_name_check

    async def classify(
        self, request: ExampleRequest, *, timeout_ms: int | None = None
    ) -> ClassificationResponse:
        """``TensorflowClassificationServiceImpl::Classify``: look the servable up, then
        :func:`prepare_classify`, one Session run, post-processing. Raises
        :class:`~serving.util.errors.ServingError` (the lookup errors of :meth:`ServableManager.acquire`, then those of
        :func:`prepare_classify`, the run's, the post-processing checks').

        ``timeout_ms`` bounds the ``Session`` run (``RunOptions.timeout_in_ms``; ``None``: none).
        """
        with self._manager.acquire(request.model_spec) as handle:
            call = prepare_classify(
                handle.servable.signature_defs, request, handle.version, self._method_name_check
            )
            outputs = await self._run(handle, call, timeout_ms)
        return call.finish(outputs)

    async def regress(
        self, request: ExampleRequest, *, timeout_ms: int | None = None
    ) -> RegressionResponse:
        """``TensorflowRegressionServiceImpl::Regress``; see :meth:`classify`."""
        with self._manager.acquire(request.model_spec) as handle:
            call = prepare_regress(
                handle.servable.signature_defs, request, handle.version, self._method_name_check
            )
            outputs = await self._run(handle, call, timeout_ms)
        return call.finish(outputs)

    async def multi_inference(
        self, request: MultiInferenceRequest, *, timeout_ms: int | None = None
    ) -> MultiInferenceResponse:
        """``RunMultiInference``: the first task's spec picks the servable, then
        :func:`prepare_multi_inference` checks every task, one run fetches the union of their
        outputs, and each task is post-processed. Raises :class:`~serving.util.errors.ServingError`.
        """
        first = request.tasks[0].model_spec if request.tasks else ModelSpec("")
        with self._manager.acquire(first) as handle:
            call = prepare_multi_inference(
                handle.servable.signature_defs, request, handle.version, self._method_name_check
            )
            outputs = await self._run(handle, call, timeout_ms)
        return call.finish(outputs)

    async def _run(
        self, handle: ServableHandle, call: InferenceCall[Any], timeout_ms: int | None
    ) -> list[np.ndarray]:
        """``PerformOneShotTensorComputation``: feed the Examples, fetch the outputs.

        If the caller is cancelled (a gRPC deadline, a client gone) the run is still awaited
        before the cancellation goes on, so the version stays referenced -- and cannot be
        unloaded -- while its ``Session`` is in use.
        """
        session = self._sessions[call.api]
        run = asyncio.ensure_future(
            session.run_tensors(handle, call.feeds, call.fetches, timeout_ms)
        )
        try:
            return await asyncio.shield(run)
        except asyncio.CancelledError:
            await asyncio.wait([run])
            raise
