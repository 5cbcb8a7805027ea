"""The wrappers that record TF Serving's metrics (:mod:`serving.util.metrics`) around what they wrap.

Each has the interface of what it wraps, so the server composes them in (no front end or core
records anything itself):

* :class:`MonitoredPredictor` / :class:`MonitoredInference` -- one per front end, around the core
  call: ``request_count`` and ``request_latency`` (TF Serving's ``RecordRequestLatency`` and
  ``RecordModelRequestCount``, ``servables/tensorflow/util.cc``), once per request whatever its
  outcome;
* :class:`MonitoredSession` -- one per core API, around the Session: ``runtime_latency`` or the
  example counts of each successful run (``RecordRuntimeLatency``, ``RecordRequestExampleCount``);
* :func:`instrument_loader` -- around the SavedModel loader: ``load_attempt_count`` and
  ``load_latency`` (TensorFlow's ``saved_model/loader.cc`` metrics).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TypeVar

import numpy as np

from serving.apis import (
    ClassificationResponse,
    ExampleRequest,
    ModelSpec,
    MultiInferenceRequest,
    MultiInferenceResponse,
    PredictRequest,
    PredictResponse,
    RegressionResponse,
)
from serving.core.servable_handle import ServableHandle
from serving.servables.tensorflow.inference_runner import InferenceService
from serving.servables.tensorflow.predict_impl import PredictService
from serving.servables.tensorflow.serving_session import Session
from serving.util.errors import Code, ServingError
from serving.util.metrics import API_LABELS, ServingMetrics

__all__ = [
    "MonitoredInference",
    "MonitoredPredictor",
    "MonitoredSession",
    "fed_rows",
    "instrument_loader",
]

_T = TypeVar("_T")
_C = TypeVar("_C")


async def _recorded(
    metrics: ServingMetrics, model_name: str, api: str, entrypoint: str, call: Awaitable[_T]
) -> _T:
    """Await ``call`` -- one request's core call -- and record it: the one place a request is
    recorded (``request_count`` and ``request_latency``), whatever the API and front end.

    A request that fails records its canonical code as ``status``; one cancelled by its client
    (a gRPC deadline, a REST client gone), ``CANCELLED``; any other exception, ``UNKNOWN``.
    Raises what ``call`` raises.
    """
    started = time.perf_counter()
    code = Code.UNKNOWN
    try:
        result = await call
        code = Code.OK
        return result
    except ServingError as exc:
        code = exc.code
        raise
    except asyncio.CancelledError:
        code = Code.CANCELLED
        raise
    finally:
        metrics.record_request(model_name, api, entrypoint, code, time.perf_counter() - started)


class MonitoredPredictor:
    """A :class:`~serving.servables.tensorflow.predict_impl.Predictor` recording ``request_count``
    and ``request_latency``.

    Same interface as the predictor it wraps; one per front end, which names itself with
    ``entrypoint`` (``REST``/``GRPC``); ``api`` defaults to TF Serving's label for that front end
    (:data:`API_LABELS`: ``predict`` for REST, ``Predict`` for gRPC).
    """

    def __init__(
        self,
        predictor: PredictService,
        metrics: ServingMetrics,
        *,
        entrypoint: str,
        api: str | None = None,
    ) -> None:
        self._predictor = predictor
        self._metrics = metrics
        self._entrypoint = entrypoint
        self._api = api if api is not None else API_LABELS[entrypoint]["predict"]

    async def predict(
        self, request: PredictRequest, *, timeout_ms: int | None = None
    ) -> PredictResponse:
        """The wrapped ``predict``, recorded; raises what it raises."""
        return await _recorded(
            self._metrics,
            request.model_spec.name,
            self._api,
            self._entrypoint,
            self._predictor.predict(request, timeout_ms=timeout_ms),
        )

    async def decode_and_predict(
        self,
        spec: ModelSpec,
        decode: Callable[[dict[str, str]], tuple[_C, Mapping[str, np.ndarray]]],
        *,
        timeout_ms: int | None = None,
    ) -> tuple[_C, PredictResponse]:
        """The wrapped ``decode_and_predict`` (REST predict), recorded; raises what it raises."""
        return await _recorded(
            self._metrics,
            spec.name,
            self._api,
            self._entrypoint,
            self._predictor.decode_and_predict(spec, decode, timeout_ms=timeout_ms),
        )


class MonitoredInference:
    """An :class:`~serving.servables.tensorflow.inference_runner.InferenceRunner` recording its requests.

    Same interface as the runner it wraps; one per front end (``entrypoint`` ``REST`` or
    ``GRPC``). Classify and Regress record ``request_count`` and ``request_latency`` with TF
    Serving's ``API`` label for that front end (:data:`API_LABELS`); MultiInference is passed
    through unrecorded, as TF Serving's ``PredictionServiceImpl::MultiInference`` records no
    request metric (its Session run records ``request_example_counts``: :class:`MonitoredSession`).
    """

    def __init__(
        self, inference: InferenceService, metrics: ServingMetrics, *, entrypoint: str
    ) -> None:
        self._inference = inference
        self._metrics = metrics
        self._entrypoint = entrypoint
        self._apis = API_LABELS[entrypoint]

    async def classify(
        self, request: ExampleRequest, *, timeout_ms: int | None = None
    ) -> ClassificationResponse:
        """The wrapped ``classify``, recorded; raises what it raises."""
        return await _recorded(
            self._metrics,
            request.model_spec.name,
            self._apis["classify"],
            self._entrypoint,
            self._inference.classify(request, timeout_ms=timeout_ms),
        )

    async def regress(
        self, request: ExampleRequest, *, timeout_ms: int | None = None
    ) -> RegressionResponse:
        """The wrapped ``regress``, recorded; raises what it raises."""
        return await _recorded(
            self._metrics,
            request.model_spec.name,
            self._apis["regress"],
            self._entrypoint,
            self._inference.regress(request, timeout_ms=timeout_ms),
        )

    async def multi_inference(
        self, request: MultiInferenceRequest, *, timeout_ms: int | None = None
    ) -> MultiInferenceResponse:
        """The wrapped ``multi_inference``, not recorded (see the class docstring)."""
        return await self._inference.multi_inference(request, timeout_ms=timeout_ms)


class MonitoredSession:
    """A :class:`~serving.servables.tensorflow.serving_session.Session` recording what TF Serving
    records per Session run.

    Same interface as the Session it wraps; ``api`` is the core API whose calls it runs
    (``Predict``, ``Classify``, ``Regress``, ``MultiInference``) and decides what a successful run
    records (:meth:`ServingMetrics.record_session_run
    <serving.util.metrics.ServingMetrics.record_session_run>`): ``runtime_latency`` for the first three,
    the number of examples for MultiInference. A failed run records nothing, as in TF Serving. The
    time is the request's view of ``Session::Run``: with batching, queueing in the batch scheduler
    included, as TF Serving measures it around ``BatchingSession::Run``.
    """

    def __init__(self, session: Session, metrics: ServingMetrics, *, api: str) -> None:
        self._session = session
        self._metrics = metrics
        self._api = api

    async def run_tensors(
        self,
        handle: ServableHandle,
        feeds: Mapping[str, np.ndarray],
        fetches: Sequence[str],
        timeout_ms: int | None,
    ) -> list[np.ndarray]:
        """See :meth:`serving.servables.tensorflow.serving_session.Session.run_tensors`."""
        started = time.perf_counter()
        values = await self._session.run_tensors(handle, feeds, fetches, timeout_ms)
        self._metrics.record_session_run(
            handle.name, self._api, time.perf_counter() - started, fed_rows(feeds)
        )
        return values


def fed_rows(feeds: Mapping[str, np.ndarray]) -> int:
    """Rows of a run's first feed (the serialized Examples of an Example-based API); 0 without
    feeds or for a scalar feed."""
    for tensor in feeds.values():
        return int(tensor.shape[0]) if tensor.ndim else 0
    return 0


def instrument_loader(loader: Callable[[str], _T], metrics: ServingMetrics) -> Callable[[str], _T]:
    """Wrap a SavedModel loader (``path -> servable``) to record each attempt.

    ``load_attempt_count{model_path, status}`` and ``load_latency{model_path}``, TensorFlow's
    ``saved_model/loader.cc`` metrics, which its Python loader does not record.
    """

    def load(path: str) -> _T:
        started = time.perf_counter()
        try:
            servable = loader(path)
        except BaseException:
            metrics.record_load(path, False, time.perf_counter() - started)
            raise
        metrics.record_load(path, True, time.perf_counter() - started)
        return servable

    return load
