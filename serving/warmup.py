"""SavedModel warmup: replay ``assets.extra/tf_serving_warmup_requests`` before a version serves.

TF Serving's ``servables/tensorflow/saved_model_warmup.cc`` and ``saved_model_warmup_util.cc``
(guide: ``saved_model_warmup.md``). With ``--enable_model_warmup`` (the default) each version, once
loaded and before it becomes ``AVAILABLE``, runs the requests recorded in its warmup file, so the
first real requests do not pay for lazy initialisation:

* the file is a TFRecord of ``tensorflow.serving.PredictionLog`` protos, at most 1000 records;
  a version without one loads normally ("No warmup data file found at ...");
* every record runs ``--num_request_iterations_for_warmup`` times (used when > 0; else once),
  on the servable being loaded, whatever model name its ``model_spec`` carries;
* any failure fails the load of that version (state ``END`` with the error), with TF Serving's
  codes and messages: ``DATA_LOSS`` ``<reader error>. Please verify your warmup data is in TFRecord
  format.``, ``INVALID_ARGUMENT`` ``Failed to parse warmup record: <record> from <path>`` and
  ``Number of warmup records exceeds the maximum (1000) at <path>``, ``UNIMPLEMENTED``
  ``Unsupported log_type for warmup: 5`` (``session_run_log``), and the request's own error.

Replayed here: ``predict_log`` (through the servable's ``run``, as Predict does). Not replayed:
``classify_log``, ``regress_log`` and ``multi_inference_log`` -- TF Serving runs those too, but
Classify/Regress are not callable on a servable that is not in the manager yet; such records are
counted and skipped with a warning rather than failing a model TF Serving would load.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import tensorflow as tf
from google.protobuf.message import DecodeError
from tensorflow_serving.apis import prediction_log_pb2

from serving.errors import Code, ServingError, from_exception

__all__ = [
    "MAX_NUM_RECORDS",
    "WARMUP_REQUESTS_FILE",
    "WarmupServable",
    "load_with_warmup",
    "run_saved_model_warmup",
    "warmup_file_path",
]

#: ``WarmupConsts::kRequestsFileName`` under ``kSavedModelAssetsExtraDirectory``.
WARMUP_REQUESTS_FILE = "tf_serving_warmup_requests"
_ASSETS_EXTRA = "assets.extra"
#: ``WarmupConsts::kMaxNumRecords``.
MAX_NUM_RECORDS = 1000
#: ``PredictionLog.session_run_log``'s field number: ``log_type_case()`` in TF Serving's message.
_SESSION_RUN_LOG_CASE = prediction_log_pb2.PredictionLog.SESSION_RUN_LOG_FIELD_NUMBER
_NOT_REPLAYED = ("classify_log", "regress_log", "multi_inference_log")

_log = logging.getLogger(__name__)


class WarmupServable(Protocol):
    """What warmup needs of a loaded version: :meth:`serving.servable.Servable.run`."""

    def run(
        self, signature_name: str, inputs: Any, output_filter: Any = ..., timeout_ms: Any = ...
    ) -> Any:
        """Run one signature on numpy inputs (blocking)."""


def warmup_file_path(export_dir: str) -> str:
    """``<export_dir>/assets.extra/tf_serving_warmup_requests``."""
    return os.path.join(export_dir, _ASSETS_EXTRA, WARMUP_REQUESTS_FILE)


def run_saved_model_warmup(
    servable: WarmupServable, export_dir: str, *, num_request_iterations: int = 0
) -> int:
    """``RunSavedModelWarmup``: replay the warmup file of ``export_dir`` on ``servable``.

    Blocking (Session runs). ``num_request_iterations`` <= 0 means once per record. Returns the
    number of records read (0 without a warmup file). Raises :class:`ServingError` as listed in
    the module docstring.
    """
    path = warmup_file_path(export_dir)
    if not os.path.exists(path):
        _log.info("No warmup data file found at %s", path)
        return 0
    iterations = num_request_iterations if num_request_iterations > 0 else 1
    _log.info(
        "Starting to read warmup data for model at %s with model-warmup-options "
        "num_request_iterations: %d",
        path,
        iterations,
    )
    started = time.monotonic()
    num_records = 0
    skipped = 0
    for record in _read_records(path):
        log = _parse(record, path)
        for _ in range(iterations):
            if not _run_warmup_request(servable, log):
                skipped += 1
                break
        num_records += 1
        if num_records > MAX_NUM_RECORDS:
            raise ServingError(
                Code.INVALID_ARGUMENT,
                f"Number of warmup records exceeds the maximum ({MAX_NUM_RECORDS}) at {path}",
            )
    if skipped:
        _log.warning(
            "%d warmup record(s) at %s were not replayed: only predict_log records are replayed "
            "here (classify_log, regress_log and multi_inference_log are skipped)",
            skipped,
            path,
        )
    elapsed_us = int((time.monotonic() - started) * 1e6)
    _log.info(
        "Finished reading warmup data for model at %s. Number of warmup records read: %d. "
        "Elapsed time (microseconds): %d.",
        path,
        num_records,
        elapsed_us,
    )
    return num_records


def load_with_warmup(
    load: Callable[[str], Any], export_dir: str, *, num_request_iterations: int = 0
) -> Any:
    """``load(export_dir)``, then :func:`run_saved_model_warmup` on the result.

    The servable is closed again if warmup fails, and the warmup error is raised: the version
    does not become AVAILABLE (TF Serving's ``--enable_model_warmup``).
    """
    servable = load(export_dir)
    try:
        run_saved_model_warmup(servable, export_dir, num_request_iterations=num_request_iterations)
    except BaseException:
        servable.close()
        raise
    return servable


def _read_records(path: str) -> Iterator[bytes]:
    """The file's records; a reader error becomes TF Serving's ``DATA_LOSS`` message."""
    try:
        with _silence_deprecation():
            reader = tf.compat.v1.io.tf_record_iterator(path)
        yield from reader
    except tf.errors.DataLossError as exc:
        raise ServingError(
            Code.DATA_LOSS,
            f"{exc.message}. Please verify your warmup data is in TFRecord format.",
        ) from None
    except tf.errors.OpError as exc:
        raise from_exception(exc) from None


def _parse(record: bytes, path: str) -> prediction_log_pb2.PredictionLog:
    try:
        return prediction_log_pb2.PredictionLog.FromString(record)
    except DecodeError:
        shown = record.decode("utf-8", "backslashreplace")
        raise ServingError(
            Code.INVALID_ARGUMENT, f"Failed to parse warmup record: {shown} from {path}"
        ) from None


def _run_warmup_request(servable: WarmupServable, log: prediction_log_pb2.PredictionLog) -> bool:
    """``RunWarmupRequest``: run one record; ``False`` if it is of a kind not replayed here."""
    kind = log.WhichOneof("log_type")
    if kind == "predict_log":
        request = log.predict_log.request
        inputs = {alias: tf.make_ndarray(proto) for alias, proto in request.inputs.items()}
        servable.run(request.model_spec.signature_name, inputs, tuple(request.output_filter))
        return True
    if kind == "session_run_log":
        raise ServingError(
            Code.UNIMPLEMENTED, f"Unsupported log_type for warmup: {_SESSION_RUN_LOG_CASE}"
        )
    if kind in _NOT_REPLAYED:
        return False
    return True  # no log_type (or one added later): TF Serving ignores it


def _silence_deprecation() -> contextlib.AbstractContextManager[Any]:
    """``tf_record_iterator`` logs a deprecation warning; it is the plain C++ record reader TF
    Serving uses (``tf.data`` wraps its errors in op names)."""
    try:
        from tensorflow.python.util import deprecation
    except ImportError:  # pragma: no cover - layout of a future TensorFlow
        return contextlib.nullcontext()
    silence: contextlib.AbstractContextManager[Any] = deprecation.silence()
    return silence
