"""The server's internal request and response types: TF Serving's ``apis/`` protos, as numpy.

``model.proto`` (:class:`ModelSpec`), ``predict.proto`` (:class:`PredictRequest`,
:class:`PredictResponse`), ``classification.proto`` / ``regression.proto`` (:class:`ExampleRequest`,
:class:`ClassificationResult`, :class:`ClassificationResponse`, :class:`RegressionResponse`) and
``inference.proto`` (:class:`InferenceTask`, :class:`MultiInferenceRequest`,
:class:`MultiInferenceResponse`). The front ends are codecs around these -- REST JSON
(:mod:`serving.util.json_tensor`, :mod:`serving.util.json_example`), gRPC protos
(:mod:`serving.util.proto_codec`) -- and one core serves both
(:class:`~serving.servables.tensorflow.predict_impl.Predictor`,
:class:`~serving.servables.tensorflow.inference_runner.InferenceRunner`).

Pure: numpy only, so every layer can use these types.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "DEFAULT_SIGNATURE",
    "MAX_RANK",
    "ClassificationResponse",
    "ClassificationResult",
    "ExampleRequest",
    "InferenceTask",
    "ModelSpec",
    "MultiInferenceRequest",
    "MultiInferenceResponse",
    "PredictRequest",
    "PredictResponse",
    "RegressionResponse",
]

#: ``kDefaultServingSignatureDefKey``: the signature used when ``signature_name`` is empty.
DEFAULT_SIGNATURE = "serving_default"

#: The most dimensions a request tensor may have: numpy's limit (TensorFlow's own is 254). Both
#: codecs refuse a deeper tensor (INVALID_ARGUMENT) instead of failing to allocate it.
MAX_RANK = 64


@dataclass(frozen=True)
class ModelSpec:
    """Which servable a request is for (``tensorflow.serving.ModelSpec``).

    At most one of ``version`` / ``version_label``; neither means the latest available version.
    """

    name: str
    version: int | None = None
    version_label: str | None = None
    signature_name: str = ""
    """Empty means ``serving_default``."""

    def debug_string(self) -> str:
        """``ServableRequest::DebugString()``: ``Latest(foo)`` or ``Specific(foo, 3)``."""
        if self.version is not None:
            return f"Specific({self.name}, {self.version})"
        return f"Latest({self.name})"


@dataclass(frozen=True)
class PredictRequest:
    """``tensorflow.serving.PredictRequest`` with numpy inputs.

    ``inputs`` maps signature input aliases to arrays (any dtype/shape; the TensorFlow runtime
    checks them, as in TF Serving). ``output_filter`` names the outputs to fetch (empty: all).
    """

    model_spec: ModelSpec
    inputs: Mapping[str, np.ndarray]
    output_filter: tuple[str, ...] = ()


@dataclass(frozen=True)
class PredictResponse:
    """``tensorflow.serving.PredictResponse`` with numpy outputs.

    ``model_spec`` is the resolved one: the version that answered and the signature used.
    """

    model_spec: ModelSpec
    outputs: Mapping[str, np.ndarray] = field(default_factory=dict)


@dataclass(frozen=True)
class ExampleRequest:
    """``ClassificationRequest`` / ``RegressionRequest``: a model spec and its Examples.

    ``examples`` is a 1-D ``object`` array of ``bytes``, each a serialized ``tf.Example`` (with
    any context already prepended); it may be empty (the core answers ``Input is empty.`` after
    resolving the servable and signature, in TF Serving's order).
    """

    model_spec: ModelSpec
    examples: np.ndarray


@dataclass(frozen=True)
class ClassificationResult:
    """``ClassificationResult`` as arrays: ``labels`` (bytes, ``object``) and/or ``scores``
    (``float32``), each ``[num_examples, num_classes]``; ``None`` when the signature lacks that
    output (TF Serving then leaves ``label`` empty / ``score`` 0)."""

    num_examples: int
    num_classes: int
    labels: np.ndarray | None
    scores: np.ndarray | None

    def label_texts(self) -> list[list[str]]:
        """The labels as text, ``[num_examples][num_classes]`` (``""`` without a ``classes``
        output). ``Class.label`` is a proto ``string``: bytes that are not UTF-8 are replaced."""
        if self.labels is None:
            return [[""] * self.num_classes for _ in range(self.num_examples)]
        texts: list[list[str]] = np.frompyfunc(_label_text, 1, 1)(self.labels).tolist()
        return texts


@dataclass(frozen=True)
class ClassificationResponse:
    """``ClassificationResponse``: the resolved spec (version, signature) and the result."""

    model_spec: ModelSpec
    result: ClassificationResult


@dataclass(frozen=True)
class RegressionResponse:
    """``RegressionResponse``: the resolved spec and one ``float32`` value per example."""

    model_spec: ModelSpec
    values: np.ndarray


@dataclass(frozen=True)
class InferenceTask:
    """``InferenceTask``: a model spec (name + signature) and the API to run it with."""

    model_spec: ModelSpec
    method_name: str


@dataclass(frozen=True)
class MultiInferenceRequest:
    """``MultiInferenceRequest``: tasks on one model sharing one set of Examples."""

    tasks: tuple[InferenceTask, ...]
    examples: np.ndarray


@dataclass(frozen=True)
class MultiInferenceResponse:
    """``MultiInferenceResponse``: one result per task, in task order."""

    results: tuple[ClassificationResponse | RegressionResponse, ...]


def _label_text(label: object) -> str:
    return label.decode("utf-8", "replace") if isinstance(label, bytes) else str(label)
