"""The model server's Prometheus metrics: TF Serving's names, labels and buckets, in one place.

``--monitoring_config_file`` is TF Serving's ``MonitoringConfig`` text proto
(``tensorflow_serving/config/monitoring_config.proto``)::

    prometheus_config { enable: true path: "/monitoring/prometheus/metrics" }

With ``enable: true`` the REST port answers ``GET <path>`` (default
``/monitoring/prometheus/metrics``, ``PrometheusExporter::kPrometheusPath``) with every metric in
Prometheus' text format, as ``tensorflow_serving/util/prometheus_exporter.cc`` writes it: TF's
metric path with ``/`` turned into ``:`` (so names start with a colon, which Prometheus allows),
a ``# TYPE`` line per metric and no ``# HELP``. Metrics are always recorded (as in TF Serving);
the config only decides whether they are served.

=================================================================  ================================
metric (type; labels)                                              recorded
=================================================================  ================================
``:tensorflow:serving:request_count`` (counter; model_name,        each Predict, by canonical code
status)
``:tensorflow:serving:request_latency`` (histogram, µs;            each Predict, core call only
model_name, API, entrypoint, status)
``:tensorflow:serving:runtime_latency`` (histogram, µs;            each Session run as the request
model_name, API, runtime)                                          sees it (batch queue included)
``:tensorflow:serving:batching_session:queuing_latency``           each batched request, enqueue to
(histogram, µs; thread_pool_name)                                  dequeue
``:tensorflow:serving:batching_session:input_batch_size``          each batched request's rows
(histogram)
``:tensorflow:serving:batching_session:processed_batch_size``      each batch run, padding included
(histogram)
``:tensorflow:serving:batching_session:padding_size``              each batch run
(histogram; execution_batch_size)
``:tensorflow:cc:saved_model:load_attempt_count`` (counter;        each SavedModel load,
model_path, status ``success``/``fail``)                           as TensorFlow's loader does
``:tensorflow:cc:saved_model:load_latency`` (counter, µs;          each successful load
model_path)
=================================================================  ================================

Labels take TF Serving's values: ``API`` is ``predict`` for REST and ``Predict`` for gRPC (TF
Serving's REST handler and gRPC service spell them so), ``entrypoint`` ``REST`` / ``GRPC``,
``status`` the canonical code name (``OK``, ``INVALID_ARGUMENT``...), ``runtime`` ``TF1`` (a
``tf.compat.v1.Session``, TF Serving's label for it). Buckets are TF's
``Buckets::Exponential(scale, growth, count)`` limits (rounded to 6 significant digits, as TF
Serving prints them); Prometheus' ``le`` is inclusive where TF's bucket limits are exclusive, so a
value exactly on a limit lands one bucket lower than TF Serving would put it.

Differences from TF Serving, on purpose: ``request_count``/``request_latency`` are recorded for
REST and gRPC alike, once, by :class:`MonitoredPredictor` around the core call (TF Serving records
them in each transport handler, and its latency also covers JSON/proto decoding; a request refused
before the core call, e.g. malformed JSON, is not counted here); TensorFlow core's own
``:tensorflow:core:*`` metrics are not exported (the Python runtime keeps them in a registry it
does not expose).

prometheus-client keeps the values (thread-safe counters and histograms in a private
:class:`~prometheus_client.CollectorRegistry`); :meth:`ServingMetrics.render` writes them in TF
Serving's spelling, because prometheus-client's own exposition writes counters as
``<name>_total`` plus ``<name>_created`` series (the OpenMetrics convention), which would rename
every TF Serving counter. prometheus-client accepts names with a leading colon as they are.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Histogram

from serving.apis import ModelSpec, PredictRequest, PredictResponse
from serving.config import read_text_proto_file
from serving.errors import Code, ServingError
from serving.manager import ServableHandle
from serving.protos.tensorflow_serving.config import monitoring_config_pb2
from serving.session import Session

__all__ = [
    "CONTENT_TYPE",
    "PROMETHEUS_PATH",
    "MonitoredPredictor",
    "MonitoredSession",
    "ServingMetrics",
    "exponential_buckets",
    "instrument_loader",
    "prometheus_path",
]

#: ``PrometheusExporter::kPrometheusPath``: where metrics are served when the config names none.
PROMETHEUS_PATH = "/monitoring/prometheus/metrics"
#: Prometheus' text exposition format, version 0.0.4.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_T = TypeVar("_T")


def exponential_buckets(
    scale: float, growth_factor: float, bucket_count: int
) -> tuple[float, ...]:
    """TF's ``monitoring::Buckets::Exponential``: ``scale * growth_factor**i``, i < count.

    The last TF bucket (up to ``DBL_MAX``) is Prometheus' implicit ``+Inf``. Limits are rounded
    to 6 significant digits, the precision TF Serving prints them with.
    """
    return tuple(float(f"{scale * growth_factor**i:.6g}") for i in range(bucket_count))


# Bucket layouts of TF Serving's samplers (servables/tensorflow/util.cc, batching_session.cc,
# batching_util.h).
_LATENCY_BUCKETS = exponential_buckets(10, 1.8, 33)  # ~20 minutes, in microseconds
_QUEUING_BUCKETS = exponential_buckets(100, 1.2, 52)  # ~1 second, in microseconds
_BATCH_SIZE_BUCKETS = exponential_buckets(1, 2, 14)  # 1 .. 8192 rows


class ServingMetrics:
    """Every metric of the model server, in a registry of its own. Thread-safe.

    One instance per server (the composition root creates it); tests create their own.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        registry = self.registry
        self._request_count = Counter(
            ":tensorflow:serving:request_count",
            "The total number of requests.",
            ["model_name", "status"],
            registry=registry,
        )
        self._request_latency = Histogram(
            ":tensorflow:serving:request_latency",
            "Distribution of wall time (in microseconds) for Tensorflow Serving request.",
            ["model_name", "API", "entrypoint", "status"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self._runtime_latency = Histogram(
            ":tensorflow:serving:runtime_latency",
            "Distribution of wall time (in microseconds) for Tensorflow runtime.",
            ["model_name", "API", "runtime"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self._queuing_latency = Histogram(
            ":tensorflow:serving:batching_session:queuing_latency",
            "Distribution of wall time spent (in microseconds) in queuing",
            ["thread_pool_name"],
            buckets=_QUEUING_BUCKETS,
            registry=registry,
        )
        self._input_batch_size = Histogram(
            ":tensorflow:serving:batching_session:input_batch_size",
            "Tracks the batch size distribution on the inputs.",
            buckets=_BATCH_SIZE_BUCKETS,
            registry=registry,
        )
        self._processed_batch_size = Histogram(
            ":tensorflow:serving:batching_session:processed_batch_size",
            "Tracks the batch size distribution on processing.",
            buckets=_BATCH_SIZE_BUCKETS,
            registry=registry,
        )
        self._padding_size = Histogram(
            ":tensorflow:serving:batching_session:padding_size",
            "Tracks the padding size distribution on batches.",
            ["execution_batch_size"],
            buckets=_BATCH_SIZE_BUCKETS,
            registry=registry,
        )
        self._load_attempt_count = Counter(
            ":tensorflow:cc:saved_model:load_attempt_count",
            "The number of times a SavedModel was successfully loaded.",
            ["model_path", "status"],
            registry=registry,
        )
        self._load_latency = Counter(
            ":tensorflow:cc:saved_model:load_latency",
            "Latency in microseconds for SavedModels that were successfully loaded.",
            ["model_path"],
            registry=registry,
        )
        self._request_children: dict[tuple[str, str, str, Code], tuple[Any, Any]] = {}
        self._runtime_children: dict[tuple[str, str], Any] = {}
        self._queuing_children: dict[str, Any] = {}
        self._padding_children: dict[int, Any] = {}

    # ---- recording -------------------------------------------------------------------------
    # The labelled children are cached in plain dicts: prometheus-client's ``labels()`` takes a
    # lock and rebuilds the label tuple on every call, a large share of a request's cost here.
    # (A race only makes two threads fetch the same child.)

    def record_request(
        self, model_name: str, api: str, entrypoint: str, code: Code, seconds: float
    ) -> None:
        """One finished request: ``request_count`` and ``request_latency``."""
        key = (model_name, api, entrypoint, code)
        children = self._request_children.get(key)
        if children is None:
            status = code.name
            children = self._request_children[key] = (
                self._request_count.labels(model_name, status),
                self._request_latency.labels(model_name, api, entrypoint, status),
            )
        children[0].inc()
        children[1].observe(seconds * 1e6)

    def record_runtime(self, model_name: str, api: str, seconds: float) -> None:
        """One Session run as a request saw it: ``runtime_latency`` (runtime ``TF1``)."""
        child = self._runtime_children.get((model_name, api))
        if child is None:
            child = self._runtime_children[(model_name, api)] = self._runtime_latency.labels(
                model_name, api, "TF1"
            )
        child.observe(seconds * 1e6)

    def record_queuing(self, thread_pool_name: str, seconds: float) -> None:
        """One request's wait in a batch queue: ``batching_session:queuing_latency``."""
        child = self._queuing_children.get(thread_pool_name)
        if child is None:
            child = self._queuing_children[thread_pool_name] = self._queuing_latency.labels(
                thread_pool_name
            )
        child.observe(seconds * 1e6)

    def record_input_batch_size(self, rows: int) -> None:
        """One request's rows entering a batch queue: ``batching_session:input_batch_size``."""
        self._input_batch_size.observe(rows)

    def record_batch(self, execution_batch_size: int, padding_size: int) -> None:
        """One batch run: ``processed_batch_size`` (rows with padding) and ``padding_size``."""
        self._processed_batch_size.observe(execution_batch_size)
        child = self._padding_children.get(execution_batch_size)
        if child is None:
            child = self._padding_children[execution_batch_size] = self._padding_size.labels(
                str(execution_batch_size)
            )
        child.observe(padding_size)

    def record_load(self, model_path: str, ok: bool, seconds: float) -> None:
        """One SavedModel load: ``load_attempt_count``, and ``load_latency`` if it worked."""
        self._load_attempt_count.labels(model_path, "success" if ok else "fail").inc()
        if ok:
            self._load_latency.labels(model_path).inc(seconds * 1e6)

    # ---- exposition ------------------------------------------------------------------------

    def render(self) -> bytes:
        """All metrics as ``PrometheusExporter::GeneratePage`` writes them (text format 0.0.4).

        ``# TYPE <name> counter|histogram`` per metric, even before it has a sample; counter
        samples under the metric's own name (no ``_total``), no ``_created`` series; histogram
        ``_bucket``/``_sum``/``_count`` series with ``le`` last.
        """
        lines: list[str] = []
        for family in self.registry.collect():
            lines.append(f"# TYPE {family.name} {family.type}")
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue
                name = family.name if family.type == "counter" else sample.name
                labels = ",".join(
                    f'{key}="{_label_value(key, value)}"' for key, value in sample.labels.items()
                )
                lines.append(f"{name}{{{labels}}} {_number(sample.value)}")
        return ("\n".join(lines) + "\n").encode()


def _label_value(key: str, value: str) -> str:
    if key == "le" and value != "+Inf":
        return f"{float(value):.6g}"
    # Backslash, double quote and newline are escaped (the exposition format's rule).
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    """Integers without a fraction (TF Serving prints counts with ``%d``), others in full."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 2**63:
        return str(int(value))
    return repr(value)


def prometheus_path(monitoring_config_file: str) -> str | None:
    """The path to serve metrics at, from ``--monitoring_config_file``; ``None``: not served.

    ``None`` when the flag is empty or ``prometheus_config.enable`` is false; the config's
    ``path``, or :data:`PROMETHEUS_PATH` when it is empty. Raises ``INVALID_ARGUMENT`` for an
    unreadable or malformed file (TF Serving's ``Invalid protobuf file: '<path>'``), and for a
    path that does not start with ``/``.
    """
    if not monitoring_config_file:
        return None
    config = read_text_proto_file(
        monitoring_config_file, monitoring_config_pb2.MonitoringConfig(), "monitoring config"
    )
    if not config.prometheus_config.enable:
        return None
    path = config.prometheus_config.path or PROMETHEUS_PATH
    if not path.startswith("/"):
        raise ServingError(
            Code.INVALID_ARGUMENT, f"prometheus_config.path must start with '/'; got {path!r}"
        )
    return path


class _Predictor(Protocol):
    async def predict(
        self, request: PredictRequest, *, timeout_ms: int | None = None
    ) -> PredictResponse: ...

    def input_dtypes(self, spec: ModelSpec) -> dict[str, str]: ...


class MonitoredPredictor:
    """A :class:`~serving.predict.Predictor` recording ``request_count`` and ``request_latency``.

    Same interface as the predictor it wraps; one per front end, which names itself with
    ``entrypoint`` (``REST``/``GRPC``) and ``api`` (``predict`` for REST, ``Predict`` for gRPC,
    TF Serving's spellings). A request that fails records its canonical code as ``status``;
    one cancelled by its client, ``CANCELLED``.
    """

    def __init__(
        self, predictor: _Predictor, metrics: ServingMetrics, *, entrypoint: str, api: str
    ) -> None:
        self._predictor = predictor
        self._metrics = metrics
        self._entrypoint = entrypoint
        self._api = api

    async def predict(
        self, request: PredictRequest, *, timeout_ms: int | None = None
    ) -> PredictResponse:
        """The wrapped ``predict``, timed; raises what it raises."""
        started = time.perf_counter()
        code = Code.UNKNOWN
        try:
            response = await self._predictor.predict(request, timeout_ms=timeout_ms)
            code = Code.OK
            return response
        except ServingError as exc:
            code = exc.code
            raise
        except asyncio.CancelledError:
            code = Code.CANCELLED
            raise
        finally:
            self._metrics.record_request(
                request.model_spec.name,
                self._api,
                self._entrypoint,
                code,
                time.perf_counter() - started,
            )

    def input_dtypes(self, spec: ModelSpec) -> dict[str, str]:
        """The wrapped ``input_dtypes`` (not a request; not recorded)."""
        return self._predictor.input_dtypes(spec)


class MonitoredSession:
    """A :class:`~serving.session.Session` that records ``runtime_latency`` per call.

    Same interface as the Session it wraps; ``api`` labels the calls (``Predict``,
    ``Classify``...). The time is the request's view of ``Session::Run``: with batching, queueing
    in the batch scheduler included, as TF Serving measures it around ``BatchingSession::Run``.
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
        """See :meth:`serving.session.Session.run_tensors`."""
        started = time.perf_counter()
        try:
            return await self._session.run_tensors(handle, feeds, fetches, timeout_ms)
        finally:
            self._metrics.record_runtime(handle.name, self._api, time.perf_counter() - started)


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
