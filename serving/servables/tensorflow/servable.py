"""One loaded SavedModel version: a TensorFlow Session over its ``serve`` MetaGraph.

Loads the way TF Serving's ``SavedModelBundle`` does (``servables/tensorflow/
saved_model_bundle_factory.cc``): ``tf.compat.v1.saved_model.loader.load`` into a
``tf.compat.v1.Session`` with its own ``tf.Graph``, keeping the MetaGraph's SignatureDefs. Works
for TF1 ``SavedModelBuilder`` exports and Keras 3 ``model.export()`` directories alike (unlike
``tf.saved_model.load``, which rejects some TF1 models TF Serving serves).

:meth:`Servable.run` follows ``RunPredict`` in ``servables/tensorflow/predict_util.cc``: resolve the
signature, check the request's inputs against it, feed the SignatureDef's tensor *names* and fetch
its output tensor names. Shapes and dtypes are checked by the TensorFlow runtime, not here, so the
errors are TensorFlow's own (``In[0] is not a matrix``, ``Type mismatch: actual int32 vs. expect
float``), as TF Serving returns them. Each distinct (feeds, fetches, timeout) gets a
``Session`` callable made once and cached; calling it releases the GIL, so runs on several threads
proceed in parallel. ``run`` blocks: call it through :class:`serving.util.executor.BlockingExecutor`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import types_pb2
from tensorflow.core.protobuf import config_pb2
from tensorflow.core.protobuf.meta_graph_pb2 import SignatureDef

from serving.apis import DEFAULT_SIGNATURE
from serving.util.errors import Code, ServingError, from_exception

__all__ = ["PredictRun", "Servable"]

_log = logging.getLogger(__name__)

_PREDICT_METHOD = "tensorflow/serving/predict"
_CLASSIFY_METHOD = "tensorflow/serving/classify"
_REGRESS_METHOD = "tensorflow/serving/regress"


def _silence_deprecation() -> contextlib.AbstractContextManager[Any]:
    """``loader.load`` logs a deprecation warning on every call; TF Serving uses this very API."""
    try:
        from tensorflow.python.util import deprecation  # type: ignore[attr-defined]  # no stub in types-tensorflow
    except ImportError:  # pragma: no cover - layout of a future TensorFlow
        return contextlib.nullcontext()
    silence: contextlib.AbstractContextManager[Any] = deprecation.silence()
    return silence


@dataclass(frozen=True)
class PredictRun:
    """One checked Predict call, in Session terms (:meth:`Servable.prepare_predict`).

    ``feeds`` maps graph tensor names to the request's arrays (signature defaults included),
    ``fetches`` are the output tensor names to fetch and ``output_aliases`` their signature
    aliases, in the same order.
    """

    signature_name: str
    feeds: dict[str, np.ndarray]
    fetches: tuple[str, ...]
    output_aliases: tuple[str, ...]

    def outputs(self, values: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
        """``{output alias: array}`` from the fetched ``values`` (``UNKNOWN`` if they miscount)."""
        if len(values) != len(self.output_aliases):
            raise ServingError(Code.UNKNOWN, "Predict internal error")
        return dict(zip(self.output_aliases, values, strict=True))


class Servable:
    """A SavedModel version loaded into its own Session. Thread-safe; close it once unused."""

    def __init__(
        self,
        path: str,
        session: tf.compat.v1.Session,
        meta_graph: Any,
        *,
        method_name_check: bool = False,
        run_in_caller_thread: bool = False,
    ) -> None:
        self.path = path
        # RunOptions.inter_op_thread_pool = -1: ops run on the thread calling Session.run instead
        # of being handed to the inter-op pool and back -- two context switches saved per run,
        # the bulk of a small model's cost. Used when that pool has one thread anyway.
        self._run_in_caller_thread = run_in_caller_thread
        self._session = session
        self._signatures: Mapping[str, SignatureDef] = dict(meta_graph.signature_def)
        self._defaults = {
            (name, alias): tf.make_ndarray(proto)
            for name, signature in self._signatures.items()
            for alias, proto in signature.defaults.items()
        }
        self._method_name_check = method_name_check
        # The shape each input placeholder declares in the graph (not the SignatureDef, whose
        # shapes some TF1 exports contradict): None per unknown dimension; None for an
        # unknown rank or an input that is not a placeholder (see _static_shape).
        self._feed_shapes: dict[str, tuple[int | None, ...] | None] = {}
        for signature in self._signatures.values():
            for info in signature.inputs.values():
                self._feed_shapes[info.name] = _static_shape(session.graph, info.name)
        self._callables: dict[tuple[Any, ...], Callable[..., list[np.ndarray]]] = {}
        self._callables_lock = threading.Lock()

    @classmethod
    def load(
        cls,
        path: str,
        *,
        tags: Sequence[str] = ("serve",),
        intra_op_threads: int = 0,
        inter_op_threads: int = 0,
        method_name_check: bool = False,
    ) -> Servable:
        """Load the SavedModel at ``path`` (a version directory).

        ``intra_op_threads`` / ``inter_op_threads`` size the Session's thread pools (0 lets
        TensorFlow choose); with ``inter_op_threads=1`` every run executes on its calling thread
        (``RunOptions.inter_op_thread_pool = -1``). Raises :class:`ServingError`: ``NOT_FOUND``
        ``Could not find SavedModel .pb or .pbtxt at supplied export directory path: <path>`` or for a missing tag-set;
        ``DATA_LOSS`` ``Can't parse <path>/saved_model.pb as binary proto`` for a SavedModel file
        that does not parse; TensorFlow's own code and message for anything else.
        """
        saved_model_file = next(
            (
                os.path.join(path, name)
                for name in ("saved_model.pb", "saved_model.pbtxt")
                if os.path.exists(os.path.join(path, name))
            ),
            None,
        )
        if saved_model_file is None:
            raise ServingError(
                Code.NOT_FOUND,
                "Could not find SavedModel .pb or .pbtxt at supplied export directory path: "
                + path,
            )
        config = tf.compat.v1.ConfigProto(
            intra_op_parallelism_threads=intra_op_threads,
            inter_op_parallelism_threads=inter_op_threads,
        )
        started = time.monotonic()
        session = tf.compat.v1.Session(graph=tf.Graph(), config=config)
        try:
            with _silence_deprecation():
                meta_graph = tf.compat.v1.saved_model.loader.load(session, list(tags), path)
            servable = cls(
                path,
                session,
                meta_graph,
                method_name_check=method_name_check,
                run_in_caller_thread=inter_op_threads == 1,
            )
        except Exception as exc:
            session.close()
            if isinstance(exc, RuntimeError) and "tags" in str(exc):
                raise ServingError(Code.NOT_FOUND, str(exc)) from exc
            if isinstance(exc, OSError):
                # TensorFlow's Python loader names the file as bytes ("Cannot parse file
                # b'/m/1/saved_model.pb': ..."); TF Serving's C++ reader answers ReadBinaryProto's
                # / ReadTextProto's DATA_LOSS.
                kind = "text" if saved_model_file.endswith(".pbtxt") else "binary"
                raise ServingError(
                    Code.DATA_LOSS, f"Can't parse {saved_model_file} as {kind} proto"
                ) from exc
            raise from_exception(exc) from exc
        _log.info(
            "Loaded SavedModel %s (tags %s) in %.0f ms; signatures: %s",
            path,
            ",".join(tags),
            (time.monotonic() - started) * 1000,
            ", ".join(sorted(servable._signatures)),
        )
        return servable

    @property
    def signature_defs(self) -> Mapping[str, SignatureDef]:
        """The MetaGraph's SignatureDefs by name (read-only protos)."""
        return self._signatures

    def input_dtypes(self, signature_name: str) -> dict[str, str]:
        """``GetInfoMap`` of the REST handler: input alias -> dtype name (``"DT_FLOAT"``).

        Raises ``INVALID_ARGUMENT`` ``Serving signature name: "<name>" not found in signature def``.
        """
        name = signature_name or DEFAULT_SIGNATURE
        signature = self._signatures.get(name)
        if signature is None:
            raise ServingError(
                Code.INVALID_ARGUMENT,
                f'Serving signature name: "{name}" not found in signature def',
            )
        return {
            alias: types_pb2.DataType.Name(info.dtype) for alias, info in signature.inputs.items()
        }

    def run(
        self,
        signature_name: str,
        inputs: Mapping[str, np.ndarray],
        output_filter: Iterable[str] = (),
        timeout_ms: int | None = None,
    ) -> tuple[str, dict[str, np.ndarray]]:
        """Run one signature: ``RunPredict`` of predict_util.cc. Blocking.

        Returns the signature name used and ``{output alias: array}``. Raises
        :class:`ServingError` with TF Serving's messages:

        * ``FAILED_PRECONDITION`` ``Serving signature key "<name>" not found.``
        * ``INVALID_ARGUMENT`` ``input size does not match signature: 1!=2 len({x}) != len({a,b}).
          Sent extra: {...}. Missing but required: {...}.``, ``Signature input alias: ...``,
          ``Inputs contains invalid name. ...``,
          ``output tensor alias not found in signature: ...``,
          ``duplicate output tensor alias: ...``
        * whatever ``Session.run`` returns (``INVALID_ARGUMENT`` for shape/dtype mismatches,
          ``DEADLINE_EXCEEDED`` past ``timeout_ms``), message unchanged.
        """
        run = self.prepare_predict(signature_name, inputs, output_filter)
        values = self.run_tensors(run.feeds, run.fetches, timeout_ms)
        return run.signature_name, run.outputs(values)

    def prepare_predict(
        self,
        signature_name: str,
        inputs: Mapping[str, np.ndarray],
        output_filter: Iterable[str] = (),
    ) -> PredictRun:
        """The checks of :meth:`run`, without running: what to feed and fetch. Not blocking.

        ``PreProcessPrediction`` of predict_util.cc: resolves the signature, checks the inputs and
        the output filter (same errors as :meth:`run`) and maps aliases to tensor names. A
        batching layer runs this per request, then :meth:`run_tensors` once per batch.
        """
        name = signature_name or DEFAULT_SIGNATURE
        signature = self._signatures.get(name)
        if signature is None:
            raise ServingError(
                Code.FAILED_PRECONDITION, f'Serving signature key "{name}" not found.'
            )
        if self._method_name_check and signature.method_name not in (
            _PREDICT_METHOD, _CLASSIFY_METHOD, _REGRESS_METHOD
        ):  # fmt: skip
            raise ServingError(
                Code.INTERNAL,
                "Expected prediction signature method_name to be one of {"
                f"{_PREDICT_METHOD}, {_CLASSIFY_METHOD}, {_REGRESS_METHOD}}}. "
                f"Was: {signature.method_name}",
            )
        feed_names, feed_values = self._feeds(name, signature, inputs)
        aliases, fetch_names = _fetches(signature, output_filter)
        feeds = dict(zip(feed_names, feed_values, strict=True))
        return PredictRun(name, feeds, fetch_names, tuple(aliases))

    def run_tensors(
        self,
        feeds: Mapping[str, np.ndarray],
        fetches: Sequence[str],
        timeout_ms: int | None = None,
    ) -> list[np.ndarray]:
        """``Session::Run`` on graph tensor names, no signature checks. Blocking.

        What Classify/Regress/MultiInference use (``PerformOneShotTensorComputation``: the
        serialized Examples fed to the signature's input tensor). Returns the fetched values in
        ``fetches`` order; TensorFlow's errors are raised as :class:`ServingError`, unchanged.
        """
        names = tuple(feeds)
        try:
            runner = self._callable(names, tuple(fetches), timeout_ms)
            values = runner(*(feeds[name] for name in names))
        except Exception as exc:  # noqa: BLE001 - OpError and feed conversion errors, translated
            raise from_exception(exc) from None
        return [np.asarray(value) for value in values]

    def prepare_run(
        self, feeds: Sequence[str], fetches: Sequence[str], timeout_ms: int | None = None
    ) -> None:
        """Make the Session callable a ``run_tensors`` of ``feeds`` -> ``fetches`` (graph tensor
        names, in feed order) with ``timeout_ms`` uses, without running it: warmup
        (``saved_model_warmup``) does it for the timeouts requests will pass, since making one
        costs seconds on a large graph (see ``ModelWarmupOptions.session_timeouts_ms``).
        TensorFlow's errors are raised as :class:`ServingError`."""
        try:
            self._callable(tuple(feeds), tuple(fetches), timeout_ms)
        except Exception as exc:  # noqa: BLE001 - TensorFlow's errors, translated
            raise from_exception(exc) from None

    def _feeds(
        self, name: str, signature: SignatureDef, inputs: Mapping[str, np.ndarray]
    ) -> tuple[tuple[str, ...], list[np.ndarray]]:
        """``VerifyRequestInputsSize`` + ``saved_model::GetInputValues``."""
        if len(inputs) > len(signature.inputs) or (
            len(inputs) < len(signature.inputs) and not signature.defaults
        ):
            raise _inputs_size_error(inputs, signature)
        request_keys = sorted(inputs)  # no more than the signature's inputs, from here on
        signature_keys = sorted(signature.inputs)
        names: list[str] = []
        values: list[np.ndarray] = []
        seen: list[str] = []
        for alias in signature_keys:
            if alias in inputs:
                values.append(inputs[alias])
                seen.append(alias)
            elif (name, alias) in self._defaults:
                values.append(self._defaults[(name, alias)])
            else:
                raise ServingError(
                    Code.INVALID_ARGUMENT,
                    f"Signature input alias: {alias}(feed name: {signature.inputs[alias].name}) "
                    "not found in request and no default value provided. Inputs expected to be "
                    f"in the request {{{','.join(request_keys)}}}, or default input alias set: "
                    f"{','.join(sorted(signature.defaults))}",
                )
            names.append(signature.inputs[alias].name)
            self._check_feed_shape(names[-1], values[-1])
        if inputs and len(seen) != len(inputs):
            raise ServingError(
                Code.INVALID_ARGUMENT,
                f"Inputs contains invalid name. Used request inputs: {','.join(seen)}, "
                f"request input: {','.join(request_keys)}",
            )
        return tuple(names), values

    def _check_feed_shape(self, tensor_name: str, value: np.ndarray) -> None:
        """``INVALID_ARGUMENT`` when ``value`` cannot be fed to the placeholder ``tensor_name``
        of rank 3 or more (the check of TensorFlow's Python ``Session.run``, with its message).

        TF Serving's C++ session makes no such check and passes the kernels' own errors on;
        so does this server for ranks 0-2. But oneDNN's convolution and pooling kernels
        (TensorFlow's default on x86) abort the whole process on an input of the wrong rank
        (a CHECK in tensor_format.h), so the image-like placeholders those kernels read are
        checked here first: one request gets an error instead of every request a dead server.
        """
        declared = self._feed_shapes.get(tensor_name)
        if declared is None or len(declared) < _CHECKED_MIN_RANK:
            return  # TensorFlow's own error (e.g. "In[0] is not a matrix"), as TF Serving's
        shape = np.shape(value)
        if len(shape) != len(declared) or any(
            want is not None and want != got for want, got in zip(declared, shape, strict=True)
        ):
            shown = "(" + ", ".join(str(d) for d in declared) + ("," if len(declared) == 1 else "") + ")"
            raise ServingError(
                Code.INVALID_ARGUMENT,
                f"Cannot feed value of shape {tuple(shape)} for Tensor {tensor_name}, "
                f"which has shape {shown}",
            )

    def _callable(
        self, feeds: tuple[str, ...], fetches: tuple[str, ...], timeout_ms: int | None
    ) -> Callable[..., list[np.ndarray]]:
        key = (feeds, fetches, timeout_ms)
        runner = self._callables.get(key)
        if runner is None:
            with self._callables_lock:
                runner = self._callables.get(key)
                if runner is None:
                    options = config_pb2.CallableOptions(feed=feeds, fetch=fetches)
                    if timeout_ms and timeout_ms > 0:
                        options.run_options.timeout_in_ms = timeout_ms
                    if self._run_in_caller_thread:
                        options.run_options.inter_op_thread_pool = -1
                    # Session.make_callable() with a feed list falls back to Session.run() and its
                    # Python-side shape checks; the CallableOptions form is the C++ MakeCallable.
                    runner = self._session._make_callable_from_options(options)
                    self._callables[key] = runner
        return runner

    def close(self) -> None:
        """Release the Session; the servable must not be used afterwards."""
        with self._callables_lock:
            self._callables.clear()
        self._session.close()


# Placeholders of this rank or more are shape-checked before a run (see _check_feed_shape).
_CHECKED_MIN_RANK = 3


def _static_shape(graph: Any, tensor_name: str) -> tuple[int | None, ...] | None:
    """The declared shape of ``tensor_name`` when it is a ``Placeholder``'s output; None when it
    is any other tensor (TF Serving feeds those whatever their static shape: its own
    half_plus_two example feeds ``[3]`` to an Identity of shape ``[?, 1]``), has an unknown rank,
    or is not in the graph."""
    try:
        tensor = graph.get_tensor_by_name(tensor_name)
    except (KeyError, ValueError):
        return None
    if tensor.op.type not in ("Placeholder", "PlaceholderV2") or tensor.shape.rank is None:
        return None
    return tuple(tensor.shape.as_list())


#: Request aliases beyond which ``input size does not match signature`` counts them instead of
#: listing them: the list costs O(request) (sorting 200,000 aliases: ~60 ms of the event loop),
#: and TF Serving's gRPC status is cut at 1024 characters, long before such a list ends.
_LISTED_ALIASES_MAX = 1024


def _inputs_size_error(inputs: Mapping[str, np.ndarray], signature: SignatureDef) -> ServingError:
    """``VerifyRequestInputsSize``'s error: ``input size does not match signature: 1!=2
    len({x}) != len({a,b}). Sent extra: {x}. Missing but required: {a,b}.`` -- with more than
    :data:`_LISTED_ALIASES_MAX` request aliases, ``{<N aliases>}`` stands for their lists, so
    the error costs O(signature), not O(request)."""
    signature_keys = sorted(signature.inputs)
    missing = [alias for alias in signature_keys if alias not in inputs]
    if len(inputs) <= _LISTED_ALIASES_MAX:
        request_keys = sorted(inputs)
        sent = ",".join(request_keys)
        extra = ",".join(sorted(set(request_keys) - set(signature_keys)))
    else:
        sent = f"<{len(inputs)} aliases>"
        extra = f"<{len(inputs) - (len(signature_keys) - len(missing))} aliases>"
    return ServingError(
        Code.INVALID_ARGUMENT,
        f"input size does not match signature: {len(inputs)}!={len(signature.inputs)} "
        f"len({{{sent}}}) != len({{{','.join(signature_keys)}}}). "
        f"Sent extra: {{{extra}}}. Missing but required: {{{','.join(missing)}}}.",
    )


def _fetches(
    signature: SignatureDef, output_filter: Iterable[str]
) -> tuple[list[str], tuple[str, ...]]:
    """Output aliases and tensor names to fetch (``PreProcessPrediction``'s output part)."""
    aliases: list[str] = []
    for alias in output_filter:
        if alias not in signature.outputs:
            raise ServingError(
                Code.INVALID_ARGUMENT,
                f"output tensor alias not found in signature: {alias} Outputs expected to be in "
                f"the set {{{','.join(sorted(signature.outputs))}}}.",
            )
        if alias in aliases:
            raise ServingError(Code.INVALID_ARGUMENT, f"duplicate output tensor alias: {alias}")
        aliases.append(alias)
    if not aliases:
        aliases = sorted(signature.outputs)
    return aliases, tuple(signature.outputs[alias].name for alias in aliases)
