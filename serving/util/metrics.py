"""The model server's Prometheus metrics: TF Serving's names, labels and buckets, in one place.

With ``--monitoring_config_file`` (:mod:`serving.config.monitoring_config`) the REST port answers
``GET <path>`` with every metric in Prometheus' text format, as
``tensorflow_serving/util/prometheus_exporter.cc`` writes it (:meth:`ServingMetrics.render`): TF's
metric path with ``/`` turned into ``:`` (so names start with a colon, which Prometheus allows), a
``# TYPE`` line per metric and no ``# HELP``. Metrics are always recorded (as in TF Serving); the
config only decides whether they are served. The recording wrappers are in
:mod:`serving.servables.tensorflow.monitored`.

=================================================================  ================================
metric (type; labels)                                              recorded
=================================================================  ================================
``:tensorflow:serving:request_count`` (counter; model_name,        each Predict, Classify and
status)                                                            Regress request (REST and gRPC),
                                                                   by canonical code
``:tensorflow:serving:request_latency`` (histogram, µs;            the same requests, core call
model_name, API, entrypoint, status)                               only
``:tensorflow:serving:runtime_latency`` (histogram, µs;            each successful Session run of
model_name, API, runtime)                                          Predict, Classify, Regress (and
                                                                   of their warmup replays), as the
                                                                   request sees it (batch queue
                                                                   included)
``:tensorflow:serving:request_example_counts`` (histogram;         each successful MultiInference
model)                                                             run (and its warmup replays):
                                                                   its number of tf.Examples
``:tensorflow:serving:request_example_count_total`` (counter;      the same runs: examples summed
model)
``:tensorflow:serving:model_warmup_latency`` (histogram, µs;       each warmup file read to its end
model_path, status)                                                (``OK``) or to a reader error
``:tensorflow:serving:batching_session:queuing_latency``           each batched task, enqueue to
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
``:tensorflow:serving:request_limit_exceeded_count`` (counter;     each request refused for a
entrypoint, reason) -- ours                                        limit of the server's flags
                                                                   (:class:`~serving.util.errors.
                                                                   LimitExceeded`)
=================================================================  ================================

Labels take TF Serving's values: ``API`` of ``request_latency`` is the REST verb (``predict``,
``classify``, ``regress``) or the gRPC method (``Predict``, ``Classify``, ``Regress``) -- TF
Serving's HTTP server and ``PredictionServiceImpl`` spell them so (:data:`API_LABELS`);
``entrypoint`` ``REST`` / ``GRPC``; ``API`` of ``runtime_latency`` is ``Predict``, ``Classify`` or
``Regress`` whatever the front end (``predict_util.cc``, ``classifier.cc``, ``regressor.cc``);
``status`` the canonical code name (``OK``, ``INVALID_ARGUMENT``...), ``runtime`` ``TF1`` (a
``tf.compat.v1.Session``, TF Serving's label for it); ``model_warmup_latency``'s ``status`` is
``absl::Status::ToString()`` (``OK``, ``DATA_LOSS: <message>``). Buckets are TF's
``Buckets::Exponential(scale, growth, count)`` limits (rounded to 6 significant digits, as TF
Serving prints them); Prometheus' ``le`` is inclusive where TF's bucket limits are exclusive, so a
value exactly on a limit lands one bucket lower than TF Serving would put it.

What TF Serving records for each API is kept, including what it does not record:
MultiInference (gRPC only) counts in neither ``request_count`` nor ``request_latency``
(``PredictionServiceImpl::MultiInference`` records nothing) and records no ``runtime_latency``
(``multi_inference.cc`` times no run), only ``request_example_counts``; Classify and Regress
record no example counts (TF Serving removed their ``RecordRequestExampleCount`` calls).
``runtime_latency`` is recorded only for runs that succeed, as TF Serving records it after
``TF_RETURN_IF_ERROR(session->Run(...))``.

Differences from TF Serving, on purpose: ``request_count``/``request_latency`` are recorded for
REST and gRPC alike, once, by the wrappers of :mod:`serving.servables.tensorflow.monitored`
around the core call, for every outcome, with its ``status`` (TF Serving records them in each transport
handler; its ``request_latency`` also covers proto decoding, and its newer releases record it for
successful requests only, without a ``status`` label). A request refused before the core call --
JSON that does not parse, a gRPC request without ``model_spec`` -- is not counted; REST predict's
JSON-to-tensor decoding is inside the core call (it needs the servable's input dtypes), so a body
whose tensors do not decode is counted with its code. TensorFlow core's own
``:tensorflow:core:*`` metrics are not exported (the Python runtime keeps them in a registry it
does not expose).

prometheus-client keeps the values (thread-safe counters and histograms in a private
:class:`~prometheus_client.CollectorRegistry`); :meth:`ServingMetrics.render` writes them in TF
Serving's spelling, because prometheus-client's own exposition writes counters as
``<name>_total`` plus ``<name>_created`` series (the OpenMetrics convention), which would rename
every TF Serving counter (and it strips the ``_total`` that ends one of TF Serving's own names).
prometheus-client accepts names with a leading colon as they are.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from serving.util.errors import Code

__all__ = [
    "API_LABELS",
    "CONTENT_TYPE",
    "EXAMPLE_COUNT_APIS",
    "RUNTIME_LATENCY_APIS",
    "ServingMetrics",
    "exponential_buckets",
]

#: Prometheus' text exposition format, version 0.0.4.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: ``request_latency``'s ``API`` label by entrypoint and core call: TF Serving's HTTP server passes
#: the path's verb, its gRPC ``PredictionServiceImpl`` the method name. MultiInference is absent:
#: TF Serving records no request metric for it.
API_LABELS: Mapping[str, Mapping[str, str]] = MappingProxyType(
    {
        "REST": MappingProxyType(
            {"predict": "predict", "classify": "classify", "regress": "regress"}
        ),
        "GRPC": MappingProxyType(
            {"predict": "Predict", "classify": "Classify", "regress": "Regress"}
        ),
    }
)
#: Core APIs (the ``runtime_latency`` ``API`` label) whose successful Session run is timed into
#: ``runtime_latency``: ``RecordRuntimeLatency`` in predict_util.cc, classifier.cc, regressor.cc.
RUNTIME_LATENCY_APIS = frozenset({"Predict", "Classify", "Regress"})
#: Core APIs whose successful run records its number of examples (``RecordRequestExampleCount``):
#: multi_inference.cc only.
EXAMPLE_COUNT_APIS = frozenset({"MultiInference"})

def exponential_buckets(
    scale: float, growth_factor: float, bucket_count: int
) -> tuple[float, ...]:
    """TF's ``monitoring::Buckets::Exponential``: ``scale * growth_factor**i``, i < count.

    The last TF bucket (up to ``DBL_MAX``) is Prometheus' implicit ``+Inf``. Limits are rounded
    to 6 significant digits, the precision TF Serving prints them with.
    """
    return tuple(float(f"{scale * growth_factor**i:.6g}") for i in range(bucket_count))


# Bucket layouts of TF Serving's samplers (servables/tensorflow/util.cc, batching_session.cc,
# batching_util.h, saved_model_warmup_util.cc).
_LATENCY_BUCKETS = exponential_buckets(10, 1.8, 33)  # ~20 minutes, in microseconds
_QUEUING_BUCKETS = exponential_buckets(100, 1.2, 52)  # ~1 second, in microseconds
_BATCH_SIZE_BUCKETS = exponential_buckets(1, 2, 14)  # 1 .. 8192 rows
_EXAMPLE_COUNT_BUCKETS = exponential_buckets(1, 2, 15)  # 1 .. 16384 examples


class ServingMetrics:
    """Every metric of the model server, in a registry of its own. Thread-safe.

    One instance per server (the composition root creates it); tests create their own.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        # prometheus-client family name -> the name TF Serving exports (see _counter).
        self._counter_names: dict[str, str] = {}
        self._request_count = self._counter(
            ":tensorflow:serving:request_count",
            "The total number of requests.",
            ["model_name", "status"],
        )
        self._request_latency = self._histogram(
            ":tensorflow:serving:request_latency",
            "Distribution of wall time (in microseconds) for Tensorflow Serving request.",
            ["model_name", "API", "entrypoint", "status"],
            _LATENCY_BUCKETS,
        )
        self._runtime_latency = self._histogram(
            ":tensorflow:serving:runtime_latency",
            "Distribution of wall time (in microseconds) for Tensorflow runtime.",
            ["model_name", "API", "runtime"],
            _LATENCY_BUCKETS,
        )
        self._example_counts = self._histogram(
            ":tensorflow:serving:request_example_counts",
            "The number of tensorflow.Examples per request.",
            ["model"],
            _EXAMPLE_COUNT_BUCKETS,
        )
        self._example_count_total = self._counter(
            ":tensorflow:serving:request_example_count_total",
            "The total number of tensorflow.Examples.",
            ["model"],
        )
        self._warmup_latency = self._histogram(
            ":tensorflow:serving:model_warmup_latency",
            "Distribution of wall time (in microseconds) for warming up the model.",
            ["model_path", "status"],
            _LATENCY_BUCKETS,
        )
        self._queuing_latency = self._histogram(
            ":tensorflow:serving:batching_session:queuing_latency",
            "Distribution of wall time spent (in microseconds) in queuing",
            ["thread_pool_name"],
            _QUEUING_BUCKETS,
        )
        self._input_batch_size = self._histogram(
            ":tensorflow:serving:batching_session:input_batch_size",
            "Tracks the batch size distribution on the inputs.",
            [],
            _BATCH_SIZE_BUCKETS,
        )
        self._processed_batch_size = self._histogram(
            ":tensorflow:serving:batching_session:processed_batch_size",
            "Tracks the batch size distribution on processing.",
            [],
            _BATCH_SIZE_BUCKETS,
        )
        self._padding_size = self._histogram(
            ":tensorflow:serving:batching_session:padding_size",
            "Tracks the padding size distribution on batches.",
            ["execution_batch_size"],
            _BATCH_SIZE_BUCKETS,
        )
        self._load_attempt_count = self._counter(
            ":tensorflow:cc:saved_model:load_attempt_count",
            "The number of times a SavedModel was successfully loaded.",
            ["model_path", "status"],
        )
        self._load_latency = self._counter(
            ":tensorflow:cc:saved_model:load_latency",
            "Latency in microseconds for SavedModels that were successfully loaded.",
            ["model_path"],
        )
        # Ours: TF Serving has no request limits of its own to count (see LimitExceeded).
        self._limit_exceeded = self._counter(
            ":tensorflow:serving:request_limit_exceeded_count",
            "The number of requests refused for exceeding one of the server's limits.",
            ["entrypoint", "reason"],
        )
        self._request_children: dict[tuple[str, str, str, Code], tuple[Any, Any]] = {}
        self._runtime_children: dict[tuple[str, str], Any] = {}
        self._example_children: dict[str, tuple[Any, Any]] = {}
        self._queuing_children: dict[str, Any] = {}
        self._padding_children: dict[int, Any] = {}

    def _counter(self, name: str, documentation: str, labels: list[str]) -> Counter:
        counter = Counter(name, documentation, labels, registry=self.registry)
        # prometheus-client strips a trailing "_total" from a counter's family name (its own
        # exposition adds it back to the samples); render() writes TF Serving's name as declared.
        self._counter_names[name.removesuffix("_total")] = name
        return counter

    def _histogram(
        self, name: str, documentation: str, labels: list[str], buckets: Sequence[float]
    ) -> Histogram:
        return Histogram(name, documentation, labels, buckets=buckets, registry=self.registry)

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

    def record_example_count(self, model_name: str, count: int) -> None:
        """``RecordRequestExampleCount``: ``request_example_counts`` and ``..._count_total``."""
        children = self._example_children.get(model_name)
        if children is None:
            children = self._example_children[model_name] = (
                self._example_counts.labels(model_name),
                self._example_count_total.labels(model_name),
            )
        children[0].observe(count)
        children[1].inc(count)

    def record_session_run(
        self, model_name: str, api: str, seconds: float, num_examples: int
    ) -> None:
        """One successful Session run of core API ``api``, what TF Serving records for it.

        ``runtime_latency`` for :data:`RUNTIME_LATENCY_APIS`, the example counts (``num_examples``:
        rows fed) for :data:`EXAMPLE_COUNT_APIS`, nothing for any other ``api``. ``model_name`` is
        the request's (TF Serving labels with ``request.model_spec().name()``).
        """
        if api in RUNTIME_LATENCY_APIS:
            self.record_runtime(model_name, api, seconds)
        elif api in EXAMPLE_COUNT_APIS:
            self.record_example_count(model_name, num_examples)

    def record_warmup(self, model_path: str, status: str, seconds: float) -> None:
        """One warmup replay that read its file to the end or to a reader error:
        ``model_warmup_latency``; ``status`` is ``absl::Status::ToString()`` (``"OK"``)."""
        self._warmup_latency.labels(model_path, status).observe(seconds * 1e6)

    def record_queuing(self, thread_pool_name: str, seconds: float) -> None:
        """One task's wait in a batch queue: ``batching_session:queuing_latency``."""
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

    def record_limit_exceeded(self, entrypoint: str, reason: str) -> None:
        """One request refused for a limit: ``request_limit_exceeded_count``.

        ``entrypoint`` is ``REST`` or ``GRPC``; ``reason`` one of
        :attr:`LimitExceeded.reason <serving.util.errors.LimitExceeded>`'s values.
        """
        self._limit_exceeded.labels(entrypoint, reason).inc()

    # ---- exposition ------------------------------------------------------------------------

    def render(self) -> bytes:
        """All metrics as ``PrometheusExporter::GeneratePage`` writes them (text format 0.0.4).

        ``# TYPE <name> counter|histogram`` per metric, even before it has a sample; counter
        samples under the metric's own name (no ``_total`` added, a ``_total`` of TF Serving's
        name kept), no ``_created`` series; histogram ``_bucket``/``_sum``/``_count`` series with
        ``le`` last.
        """
        lines: list[str] = []
        for family in self.registry.collect():
            counter = family.type == "counter"
            family_name = self._counter_names.get(family.name, family.name)
            lines.append(f"# TYPE {family_name} {family.type}")
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue
                name = family_name if counter else sample.name
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
