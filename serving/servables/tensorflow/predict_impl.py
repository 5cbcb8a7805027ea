"""The core of prediction, shared by every front end: :meth:`Predictor.predict`.

TF Serving's ``TensorflowPredictor::Predict`` (``servables/tensorflow/predict_impl.cc``): find the
servable for the request's :class:`~serving.apis.ModelSpec`, run the signature on the request's
numpy inputs (off the event loop) and return numpy outputs with the resolved model spec. The gRPC
front end decodes ``tensorflow.serving.PredictRequest`` protos into a
:class:`~serving.apis.PredictRequest` and calls :meth:`Predictor.predict`; the REST front end,
whose JSON can only be typed once the signature's input dtypes are known, calls
:meth:`Predictor.decode_and_predict` with its decoder, which looks the servable up once for both.
Both share lookups, validation, errors, batching and metrics.

The request is checked on the event loop (:meth:`Servable.prepare_predict
<serving.servables.tensorflow.servable.Servable.prepare_predict>`, cheap), then its tensors are computed by the
:class:`~serving.servables.tensorflow.serving_session.Session`: one ``Session.run`` per request on
the request thread pool
(:class:`~serving.servables.tensorflow.serving_session.DirectSession`), or merged with concurrent requests by
:class:`~serving.batching.batching_session.BatchingSession` when ``--enable_batching`` is set.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol, TypeVar

import numpy as np

from serving.apis import ModelSpec, PredictRequest, PredictResponse
from serving.core.manager import ServableManager
from serving.core.servable_handle import ServableHandle
from serving.servables.tensorflow.serving_session import DirectSession, Session
from serving.util.executor import BlockingExecutor

__all__ = ["PredictService", "Predictor"]

_C = TypeVar("_C")


class PredictService(Protocol):
    """What the front ends call for Predict: a :class:`Predictor` or a wrapper with its interface
    (:class:`serving.servables.tensorflow.monitored.MonitoredPredictor`)."""

    async def predict(
        self, request: PredictRequest, *, timeout_ms: int | None = None
    ) -> PredictResponse:
        """See :meth:`Predictor.predict`."""
        ...

    async def decode_and_predict(
        self,
        spec: ModelSpec,
        decode: Callable[[dict[str, str]], tuple[_C, Mapping[str, np.ndarray]]],
        *,
        timeout_ms: int | None = None,
    ) -> tuple[_C, PredictResponse]:
        """See :meth:`Predictor.decode_and_predict`."""
        ...


class Predictor:
    """Runs predictions on the manager's servables through a
    :class:`~serving.servables.tensorflow.serving_session.Session`.

    ``session`` defaults to a :class:`~serving.servables.tensorflow.serving_session.DirectSession` on ``executor``.
    """

    def __init__(
        self,
        manager: ServableManager,
        executor: BlockingExecutor,
        *,
        session: Session | None = None,
    ) -> None:
        self._manager = manager
        self._session: Session = session if session is not None else DirectSession(executor)

    async def predict(
        self, request: PredictRequest, *, timeout_ms: int | None = None
    ) -> PredictResponse:
        """Run ``request`` and return its outputs.

        ``timeout_ms`` bounds ``Session.run`` (``RunOptions.timeout_in_ms``; ``None`` or <= 0: no
        bound). Raises :class:`~serving.util.errors.ServingError`: lookup errors from
        :meth:`ServableManager.acquire` (``Servable not found for request: Latest(foo)`` ...),
        validation errors and TensorFlow's run errors from :meth:`Servable.run
        <serving.servables.tensorflow.servable.Servable.run>`, and the batching layer's own (a full queue is
        ``UNAVAILABLE``).
        """
        with self._manager.acquire(request.model_spec) as handle:
            return await self._predict_on(handle, request, timeout_ms)

    async def decode_and_predict(
        self,
        spec: ModelSpec,
        decode: Callable[[dict[str, str]], tuple[_C, Mapping[str, np.ndarray]]],
        *,
        timeout_ms: int | None = None,
    ) -> tuple[_C, PredictResponse]:
        """Predict for a request whose inputs can only be decoded once the signature is known.

        REST predict (``HttpRestApiHandler::ProcessPredictRequest``): the JSON tensors are typed
        by the signature's input dtypes (``GetInfoMap``), then predicted. ``decode(dtypes)`` gets
        ``{input alias: dtype name}`` (``"DT_FLOAT"``) of ``spec``'s signature and returns
        ``(context, inputs)``; the result is ``(context, response)`` -- the REST handler passes its
        JSON format through ``context``. The servable is looked up once, so the dtypes and the run
        come from the same version (TF Serving looks it up twice, and a version swap in between
        could decode with one version's dtypes and run another).

        Raises, in TF Serving's order: the lookup errors of :meth:`predict`; ``INVALID_ARGUMENT``
        ``Serving signature name: "<name>" not found in signature def``; what ``decode`` raises;
        then the errors of :meth:`predict`.
        """
        with self._manager.acquire(spec) as handle:
            context, inputs = decode(handle.servable.input_dtypes(spec.signature_name))
            response = await self._predict_on(handle, PredictRequest(spec, inputs), timeout_ms)
        return context, response

    async def _predict_on(
        self, handle: ServableHandle, request: PredictRequest, timeout_ms: int | None
    ) -> PredictResponse:
        """``RunPredict`` on the version ``handle`` pins (the caller holds it)."""
        run = handle.servable.prepare_predict(
            request.model_spec.signature_name, request.inputs, request.output_filter
        )
        values = await self._session.run_tensors(handle, run.feeds, run.fetches, timeout_ms)
        return PredictResponse(
            model_spec=ModelSpec(
                handle.name, version=handle.version, signature_name=run.signature_name
            ),
            outputs=run.outputs(values),
        )
