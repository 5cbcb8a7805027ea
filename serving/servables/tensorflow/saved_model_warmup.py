"""SavedModel warmup: replay ``assets.extra/tf_serving_warmup_requests`` before a version serves.

TF Serving's ``servables/tensorflow/saved_model_warmup.cc`` (which request each record runs) and
``saved_model_warmup_util.cc`` (reading the file; guide: ``saved_model_warmup.md``). With
``--enable_model_warmup`` (the default) each version, once loaded and before it becomes
``AVAILABLE``, runs the requests recorded in its warmup file, so the first real requests do not
pay for lazy initialisation:

* the file is a TFRecord of ``tensorflow.serving.PredictionLog`` protos, at most
  :data:`MAX_NUM_RECORDS` (``WarmupConsts::kMaxNumRecords``); a version without one loads
  normally ("No warmup data file found at ...");
* each record runs :attr:`ModelWarmupOptions.num_request_iterations` times (once when unset;
  ``--num_request_iterations_for_warmup`` sets it when > 0), on the servable being loaded, whatever
  model name its ``model_spec`` carries;
* ``predict_log``, ``classify_log``, ``regress_log`` and ``multi_inference_log`` records run as
  TF Serving's ``RunPredict``, ``RunClassify``, ``RunRegress`` and ``RunMultiInference`` do --
  the same checks, Session run and post-processing as a request
  (:meth:`serving.servables.tensorflow.servable.Servable.prepare_predict`,
  :func:`serving.servables.tensorflow.classifier.prepare_classify` ...), with
  ``--enable_signature_method_name_check`` applied;
* ``session_run_log`` fails the load with ``UNIMPLEMENTED`` ``Unsupported log_type for warmup: 5``
  (the ``log_type`` oneof's field number, as TF Serving prints ``log_type_case()``); any other log
  type -- ``predict_streamed_log``, or none set -- is skipped, as the Session-based
  ``RunWarmupRequest`` does (``default: break``; only TF Serving's TFRT runtime replays or refuses
  those);
* any failure fails the load of that version (state ``END`` with the error), with TF Serving's
  codes and messages: ``DATA_LOSS`` ``<reader error>. Please verify your warmup data is in TFRecord
  format.``, ``INVALID_ARGUMENT`` ``Failed to parse warmup record: <record> from <path>`` and
  ``Number of warmup records exceeds the maximum (1000) at <path>`` (raised after the 1001st record
  has run, as TF Serving counts it), and the request's own error (``No signature was found with the
  name: ...``, TensorFlow's run errors).

Metrics (with ``metrics``), as TF Serving records them during warmup: each replayed request's
successful Session run (``runtime_latency`` for Predict/Classify/Regress, the example counts for
MultiInference, labelled with the record's model name) and ``model_warmup_latency{model_path,
status}`` once the file has been read to its end (``OK``) or to a reader error (TF Serving returns
early, unrecorded, for a record that does not parse, a failing request or too many records).

Warmup runs on the servable directly, not through the batching layer: with ``--enable_batching`` TF
Serving replays through its ``BatchingSession`` (warming up the batch threads too); here the
replayed runs are not batched. ``ModelWarmupOptions.num_model_warmup_threads`` (parallel replay) is
not supported: the model server has no flag for it.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import tensorflow as tf
from google.protobuf.message import DecodeError
from tensorflow.core.protobuf.meta_graph_pb2 import SignatureDef
from tensorflow_serving.apis import prediction_log_pb2

from serving.apis import ExampleRequest
from serving.servables.tensorflow.classifier import prepare_classify
from serving.servables.tensorflow.monitored import fed_rows
from serving.servables.tensorflow.multi_inference import prepare_multi_inference
from serving.servables.tensorflow.regressor import prepare_regress
from serving.util import proto_codec
from serving.util.errors import Code, ServingError, from_exception
from serving.util.metrics import ServingMetrics

if TYPE_CHECKING:  # servable imports TensorFlow's Session machinery; only the type is needed
    from serving.servables.tensorflow.servable import PredictRun

__all__ = [
    "MAX_NUM_RECORDS",
    "WARMUP_REQUESTS_FILE",
    "ModelWarmupOptions",
    "WarmupServable",
    "load_with_warmup",
    "run_saved_model_warmup",
    "warmup_file_path",
]

#: ``WarmupConsts::kRequestsFileName`` under ``kSavedModelAssetsExtraDirectory``.
WARMUP_REQUESTS_FILE = "tf_serving_warmup_requests"
_ASSETS_EXTRA = "assets.extra"
#: ``WarmupConsts::kMaxNumRecords``: the most records a warmup file may hold.
MAX_NUM_RECORDS = 1000
#: ``PredictionLog.session_run_log``'s field number: ``log_type_case()`` in TF Serving's message.
_SESSION_RUN_LOG_CASE = prediction_log_pb2.PredictionLog.SESSION_RUN_LOG_FIELD_NUMBER
_PREDICT_API = "Predict"

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelWarmupOptions:
    """The fields of TF Serving's ``ModelWarmupOptions`` (session_bundle_config.proto) that the
    replay honours."""

    num_request_iterations: int | None = None
    """Times each record is replayed; ``None`` (unset): once. A set value is used as is, as TF
    Serving uses it: 0 replays no request but still reads, parses and counts every record."""

    session_timeouts_ms: tuple[int, ...] = ()
    """(ours) Session run timeouts requests will pass (the REST front end's
    ``--rest_api_timeout_in_ms``): each record runs once more with each. A run's timeout is
    fixed in the callable made for it (``Servable._callable``), and making one builds new
    executors for the pruned graph -- 1.7-2.4 s each on ``fraud_transformer`` (2-core machine)
    against 17 ms a run after -- so without this the first real request after warmup paid it,
    and was answered 504 at a 2 s budget although the model was ready. The callables are made,
    not run: the replay's runs, counts and metrics stay TF Serving's."""

    @classmethod
    def from_flags(
        cls, num_request_iterations_for_warmup: int, rest_api_timeout_in_ms: int = 0
    ) -> ModelWarmupOptions:
        """The options ``tensorflow_model_server`` builds from its flags (model_servers/server.cc):
        ``num_request_iterations`` is set only when ``--num_request_iterations_for_warmup`` > 0;
        ``session_timeouts_ms`` holds ``--rest_api_timeout_in_ms`` when it is > 0 (ours)."""
        timeouts = (rest_api_timeout_in_ms,) if rest_api_timeout_in_ms > 0 else ()
        if num_request_iterations_for_warmup > 0:
            return cls(num_request_iterations=num_request_iterations_for_warmup, session_timeouts_ms=timeouts)
        return cls(session_timeouts_ms=timeouts)

    def debug_string(self) -> str:
        """``ModelWarmupOptions::DebugString()``: the text format, empty when nothing is set."""
        if self.num_request_iterations is None:
            return ""
        return f"num_request_iterations {{\n  value: {self.num_request_iterations}\n}}\n"


class WarmupServable(Protocol):
    """What warmup needs of a loaded version (:class:`serving.servables.tensorflow.servable.Servable`)."""

    @property
    def signature_defs(self) -> Mapping[str, SignatureDef]:
        """The MetaGraph's SignatureDefs by name."""
        ...

    def prepare_predict(
        self, signature_name: str, inputs: Mapping[str, np.ndarray], output_filter: Any = ...
    ) -> PredictRun:
        """Predict's checks: what to feed and fetch (``PreProcessPrediction``)."""
        ...

    def run_tensors(
        self, feeds: Mapping[str, np.ndarray], fetches: Sequence[str], timeout_ms: Any = ...
    ) -> list[np.ndarray]:
        """``Session::Run`` on graph tensor names (blocking)."""
        ...

    def prepare_run(self, feeds: Sequence[str], fetches: Sequence[str], timeout_ms: int | None) -> None:
        """Make what a ``run_tensors`` of these tensor names with this timeout uses (blocking)."""
        ...

    def close(self) -> None:
        """Release the Session."""
        ...


def warmup_file_path(export_dir: str) -> str:
    """``<export_dir>/assets.extra/tf_serving_warmup_requests``."""
    return os.path.join(export_dir, _ASSETS_EXTRA, WARMUP_REQUESTS_FILE)


def run_saved_model_warmup(
    servable: WarmupServable,
    export_dir: str,
    *,
    options: ModelWarmupOptions = ModelWarmupOptions(),  # noqa: B008 - frozen, immutable
    method_name_check: bool = False,
    metrics: ServingMetrics | None = None,
) -> int:
    """``RunSavedModelWarmup``: replay the warmup file of ``export_dir`` on ``servable``.

    Blocking (Session runs). ``method_name_check`` is ``--enable_signature_method_name_check``.
    Returns the number of records read (0 without a warmup file). Raises :class:`ServingError`
    as listed in the module docstring.
    """
    started = time.monotonic()
    path = warmup_file_path(export_dir)
    if not os.path.exists(path):
        _log.info("No warmup data file found at %s", path)
        return 0
    iterations = 1 if options.num_request_iterations is None else options.num_request_iterations
    _log.info(
        "Starting to read warmup data for model at %s with model-warmup-options %s",
        path,
        options.debug_string(),
    )
    num_records = 0
    skipped: collections.Counter[str] = collections.Counter()
    reader_error: ServingError | None = None
    try:
        for record in _read_records(path):
            log = _parse(record, path)
            for _ in range(iterations):
                skipped_kind = _run_warmup_request(servable, log, method_name_check, metrics)
                if skipped_kind is not None:
                    skipped[skipped_kind] += 1
                    break
            else:
                for timeout_ms in options.session_timeouts_ms:
                    _run_warmup_request(servable, log, method_name_check, None, timeout_ms, make_only=True)
            num_records += 1
            # Counted after the record ran, as TF Serving does: the 1001st record runs, then fails.
            if num_records > MAX_NUM_RECORDS:
                raise ServingError(
                    Code.INVALID_ARGUMENT,
                    f"Number of warmup records exceeds the maximum ({MAX_NUM_RECORDS}) at {path}",
                )
    except _ReaderError as exc:
        reader_error = exc.error
    elapsed_s = time.monotonic() - started
    if metrics is not None:
        # Recorded for the reader's final status only: TF Serving returns early, unrecorded, for
        # a record that does not parse, a failing request and too many records.
        status = "OK" if reader_error is None else reader_error.status_string()
        metrics.record_warmup(export_dir, status, elapsed_s)
    if reader_error is not None:
        if reader_error.code is Code.DATA_LOSS:
            raise ServingError(
                Code.DATA_LOSS,
                f"{reader_error.message}. Please verify your warmup data is in TFRecord format.",
            )
        raise reader_error
    if skipped:
        # TF Serving skips these silently; say so, since a record that never runs warms nothing.
        _log.warning(
            "%d warmup record(s) at %s were skipped: log types a Session-based servable does not "
            "replay (%s)",
            sum(skipped.values()),
            path,
            ", ".join(f"{kind}: {count}" for kind, count in sorted(skipped.items())),
        )
    _log.info(
        "Finished reading warmup data for model at %s. Number of warmup records read: %d. "
        "Elapsed time (microseconds): %d.",
        path,
        num_records,
        int(elapsed_s * 1e6),
    )
    return num_records


def load_with_warmup(
    load: Callable[[str], Any],
    export_dir: str,
    *,
    options: ModelWarmupOptions = ModelWarmupOptions(),  # noqa: B008 - frozen, immutable
    method_name_check: bool = False,
    metrics: ServingMetrics | None = None,
) -> Any:
    """``load(export_dir)``, then :func:`run_saved_model_warmup` on the result.

    The servable is closed again if warmup fails, and the warmup error is raised: the version
    does not become AVAILABLE (TF Serving's ``--enable_model_warmup``).
    """
    servable = load(export_dir)
    try:
        run_saved_model_warmup(
            servable,
            export_dir,
            options=options,
            method_name_check=method_name_check,
            metrics=metrics,
        )
    except BaseException:
        servable.close()
        raise
    return servable


class _ReaderError(Exception):
    """The record reader stopped with an error (TF Serving's loop ends on a non-OK status)."""

    def __init__(self, error: ServingError) -> None:
        super().__init__(error.message)
        self.error = error


def _read_records(path: str) -> Iterator[bytes]:
    """The file's records; a reader error ends them with :class:`_ReaderError`."""
    try:
        with _silence_deprecation():
            reader = tf.compat.v1.io.tf_record_iterator(path)
        yield from reader
    except tf.errors.OpError as exc:
        raise _ReaderError(from_exception(exc)) from None


def _parse(record: bytes, path: str) -> prediction_log_pb2.PredictionLog:
    try:
        return prediction_log_pb2.PredictionLog.FromString(record)
    except DecodeError:
        shown = record.decode("utf-8", "backslashreplace")
        raise ServingError(
            Code.INVALID_ARGUMENT, f"Failed to parse warmup record: {shown} from {path}"
        ) from None


def _run_warmup_request(
    servable: WarmupServable,
    log: prediction_log_pb2.PredictionLog,
    method_name_check: bool,
    metrics: ServingMetrics | None,
    timeout_ms: int | None = None,
    *,
    make_only: bool = False,
) -> str | None:
    """``RunWarmupRequest``: run one record as its request would run; return the log type's name
    instead when TF Serving's Session-based warmup skips it. Raises the request's error. With
    ``make_only`` (ours), only make the Session callable its run with the timeout ``timeout_ms``
    would use (``WarmupServable.prepare_run``)."""
    kind = log.WhichOneof("log_type")
    feeds: Mapping[str, np.ndarray]
    finish: Callable[[Sequence[np.ndarray]], object]
    if kind == "predict_log":
        request = log.predict_log.request
        model_name = request.model_spec.name
        run = servable.prepare_predict(
            request.model_spec.signature_name,
            proto_codec.inputs_from_proto(request.inputs),
            tuple(request.output_filter),
        )
        api, feeds, fetches, finish = _PREDICT_API, run.feeds, run.fetches, run.outputs
    elif kind == "classify_log" or kind == "regress_log":
        request = getattr(log, kind).request
        model_name = request.model_spec.name
        # No "Missing ModelSpec" check: RunClassify/RunRegress take the request as it is.
        example_request = ExampleRequest(
            proto_codec.model_spec_from_proto(request.model_spec),
            proto_codec.examples_from_input(request.input),
        )
        prepare = prepare_classify if kind == "classify_log" else prepare_regress
        call = prepare(servable.signature_defs, example_request, None, method_name_check)
        api, feeds, fetches, finish = call.api, call.feeds, call.fetches, call.finish
    elif kind == "multi_inference_log":
        multi_request = proto_codec.multi_inference_request_from_proto(
            log.multi_inference_log.request
        )
        model_name = multi_request.tasks[0].model_spec.name if multi_request.tasks else ""
        multi_call = prepare_multi_inference(
            servable.signature_defs, multi_request, None, method_name_check
        )
        api, feeds, fetches = multi_call.api, multi_call.feeds, multi_call.fetches
        finish = multi_call.finish
    elif kind == "session_run_log":
        raise ServingError(
            Code.UNIMPLEMENTED, f"Unsupported log_type for warmup: {_SESSION_RUN_LOG_CASE}"
        )
    else:
        return kind or "no log_type"
    if make_only:
        servable.prepare_run(tuple(feeds), tuple(fetches), timeout_ms)
        return None
    started = time.perf_counter()
    values = servable.run_tensors(feeds, fetches)
    if metrics is not None:
        metrics.record_session_run(model_name, api, time.perf_counter() - started, fed_rows(feeds))
    finish(values)  # post-processing checks fail the load like a bad request
    return None


def _silence_deprecation() -> contextlib.AbstractContextManager[Any]:
    """``tf_record_iterator`` logs a deprecation warning; it is the plain C++ record reader TF
    Serving uses (``tf.data`` wraps its errors in op names)."""
    try:
        from tensorflow.python.util import deprecation  # type: ignore[attr-defined]  # no stub in types-tensorflow
    except ImportError:  # pragma: no cover - layout of a future TensorFlow
        return contextlib.nullcontext()
    silence: contextlib.AbstractContextManager[Any] = deprecation.silence()
    return silence
