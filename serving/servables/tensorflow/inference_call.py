"""What Classify, Regress and MultiInference share: the API names, :class:`InferenceCall`, checks.

TF Serving's ``servables/tensorflow/util.cc`` part that its ``classifier.cc``, ``regressor.cc`` and
``multi_inference.cc`` share (``InputToSerializedExampleTensor``'s empty-input check,
``MakeModelSpec``), plus :class:`InferenceCall`: one checked call in ``Session`` terms, what the
``prepare_*`` functions of :mod:`~serving.servables.tensorflow.classifier`,
:mod:`~serving.servables.tensorflow.regressor` and :mod:`~serving.servables.tensorflow.multi_inference`
return.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np
from google.protobuf import text_format
from tensorflow.core.protobuf.meta_graph_pb2 import SignatureDef

from serving.apis import DEFAULT_SIGNATURE, ModelSpec
from serving.util.errors import Code, ServingError

__all__ = [
    "CLASSIFY_API",
    "CLASSIFY_METHOD_NAME",
    "INFERENCE_APIS",
    "MULTI_INFERENCE_API",
    "REGRESS_API",
    "REGRESS_METHOD_NAME",
    "InferenceCall",
    "MethodName",
    "check_method_name",
    "find_signature",
    "invalid",
    "make_model_spec",
    "require_examples",
    "shape_string",
    "signature_debug_string",
]

#: The core APIs' names (the gRPC methods; the ``API`` label of TF Serving's runtime metrics).
CLASSIFY_API = "Classify"
REGRESS_API = "Regress"
MULTI_INFERENCE_API = "MultiInference"
INFERENCE_APIS = (CLASSIFY_API, REGRESS_API, MULTI_INFERENCE_API)

_R = TypeVar("_R")

#: ``kClassifyMethodName`` / ``kRegressMethodName`` (``signature_constants.h``).
CLASSIFY_METHOD_NAME = "tensorflow/serving/classify"
REGRESS_METHOD_NAME = "tensorflow/serving/regress"


class MethodName(enum.Enum):
    """The two Example-based APIs (``InferenceTask.method_name``)."""

    CLASSIFY = CLASSIFY_METHOD_NAME
    REGRESS = REGRESS_METHOD_NAME


@dataclass(frozen=True)
class InferenceCall(Generic[_R]):
    """One checked Classify, Regress or MultiInference call in ``Session`` terms.

    What ``prepare_classify``, ``prepare_regress`` and ``prepare_multi_inference`` return --
    TF Serving's pre-processing, done -- and what both callers run: the request path
    (:class:`~serving.servables.tensorflow.inference_runner.InferenceRunner`, through a
    :class:`~serving.servables.tensorflow.serving_session.Session`) and the warmup replay
    (:mod:`serving.servables.tensorflow.saved_model_warmup`, on the servable directly), so that the
    two cannot drift apart.

    ``feeds`` is ``{input tensor name: 1-D object array of serialized Examples}``, ``fetches``
    the output tensor names; :meth:`finish` turns the fetched values (in ``fetches`` order) into
    the response, with TF Serving's post-processing checks. ``api`` names the core API
    (``Classify``, ``Regress``, ``MultiInference``; the metrics' ``API`` label).
    """

    api: str
    feeds: Mapping[str, np.ndarray]
    fetches: tuple[str, ...]
    _finish: Callable[[Sequence[np.ndarray]], _R]

    def finish(self, outputs: Sequence[np.ndarray]) -> _R:
        """``PostProcess*Result``: the response from the fetched values. Raises
        ``INVALID_ARGUMENT`` (or ``FAILED_PRECONDITION``) for outputs of the wrong shape or
        dtype, with TF Serving's messages."""
        return self._finish(outputs)


def find_signature(signatures: Mapping[str, SignatureDef], name: str) -> tuple[str, SignatureDef]:
    """The signature ``name`` (empty: ``serving_default``) as ``(name used, signature)``.

    Raises ``INVALID_ARGUMENT`` ``No signature was found with the name: <name>``.
    """
    used = name or DEFAULT_SIGNATURE
    signature = signatures.get(used)
    if signature is None:
        raise invalid(f"No signature was found with the name: {used}")
    return used, signature


def check_method_name(signature: SignatureDef, method: MethodName, method_name_check: bool) -> None:
    """With ``--enable_signature_method_name_check``, ``INVALID_ARGUMENT`` unless ``signature``'s
    ``method_name`` is ``method``'s (``Expected classification signature method_name to be ...``)."""
    if method_name_check and signature.method_name != method.value:
        kind = "classification" if method is MethodName.CLASSIFY else "regression"
        raise invalid(
            f"Expected {kind} signature method_name to be {method.value}. "
            f"Was: {signature.method_name}"
        )


def require_examples(examples: np.ndarray) -> np.ndarray:
    """``InputToSerializedExampleTensor``'s check, after the signature checks (TF's order):
    ``INVALID_ARGUMENT`` ``Input is empty.`` for no Examples; else ``examples`` unchanged."""
    if len(examples) == 0:
        raise invalid("Input is empty.")
    return examples


def invalid(message: str) -> ServingError:
    """An ``INVALID_ARGUMENT`` error with ``message`` (most of these APIs' errors)."""
    return ServingError(Code.INVALID_ARGUMENT, message)


def make_model_spec(model_name: str, signature_name: str, version: int | None) -> ModelSpec:
    """``MakeModelSpec``: the request's name, the signature used, the version that ran (``None``:
    not known, as in a warmup replay)."""
    return ModelSpec(model_name, version=version, signature_name=signature_name)


def signature_debug_string(signature: SignatureDef) -> str:
    """``SignatureDef::DebugString()``: the text format."""
    return text_format.MessageToString(signature)


def shape_string(array: np.ndarray) -> str:
    """``TensorShape::DebugString()``: ``[2,3]``."""
    return "[" + ",".join(str(size) for size in array.shape) + "]"
