"""The core of prediction, shared by every front end: :meth:`Predictor.predict`.

TF Serving's ``TensorflowPredictor::Predict`` (``servables/tensorflow/predict_impl.cc``): find the
servable for the request's :class:`~serving.apis.ModelSpec`, run the signature on the request's
numpy inputs (off the event loop) and return numpy outputs with the resolved model spec. The REST
front end decodes JSON into a :class:`~serving.apis.PredictRequest` first; a gRPC front end will
decode ``tensorflow.serving.PredictRequest`` protos into the same type and call the same method,
so both share lookups, validation, errors, batching and metrics.

The request is checked on the event loop (:meth:`Servable.prepare_predict
<serving.servable.Servable.prepare_predict>`, cheap), then its tensors are computed by the
:class:`~serving.session.Session`: one ``Session.run`` per request on the request thread pool
(:class:`~serving.session.DirectSession`), or merged with concurrent requests by
:class:`~serving.batching.BatchingSession` when ``--enable_batching`` is set.
"""

from __future__ import annotations

from serving.apis import ModelSpec, PredictRequest, PredictResponse
from serving.executor import BlockingExecutor
from serving.manager import ServableManager
from serving.session import DirectSession, Session

__all__ = ["Predictor"]


class Predictor:
    """Runs predictions on the manager's servables through a :class:`~serving.session.Session`.

    ``session`` defaults to a :class:`~serving.session.DirectSession` on ``executor``.
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
        bound). Raises :class:`~serving.errors.ServingError`: lookup errors from
        :meth:`ServableManager.acquire` (``Servable not found for request: Latest(foo)`` ...),
        validation errors and TensorFlow's run errors from :meth:`Servable.run
        <serving.servable.Servable.run>`, and the batching layer's own (a full queue is
        ``UNAVAILABLE``).
        """
        spec = request.model_spec
        with self._manager.acquire(spec) as handle:
            run = handle.servable.prepare_predict(
                spec.signature_name, request.inputs, request.output_filter
            )
            values = await self._session.run_tensors(handle, run.feeds, run.fetches, timeout_ms)
        return PredictResponse(
            model_spec=ModelSpec(
                handle.name, version=handle.version, signature_name=run.signature_name
            ),
            outputs=run.outputs(values),
        )

    def input_dtypes(self, spec: ModelSpec) -> dict[str, str]:
        """The inputs of ``spec``'s signature: alias -> dtype name (the REST handler's GetInfoMap).

        Raises ``NOT_FOUND`` for an unknown servable and ``INVALID_ARGUMENT`` ``Serving signature
        name: "<name>" not found in signature def``.
        """
        with self._manager.acquire(spec) as handle:
            dtypes: dict[str, str] = handle.servable.input_dtypes(spec.signature_name)
            return dtypes
