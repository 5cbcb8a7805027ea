"""The server's internal request and response types (TF Serving's ``apis/`` protos, as numpy).

Front ends are codecs around these: REST JSON via :mod:`serving.util.json_tensor`, gRPC
``PredictRequest`` protos (later) via ``tf.make_ndarray`` / ``tf.make_tensor_proto``. Both call the
same core, :meth:`serving.servables.tensorflow.predict_impl.Predictor.predict`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

__all__ = ["DEFAULT_SIGNATURE", "ModelSpec", "PredictRequest", "PredictResponse"]

#: ``kDefaultServingSignatureDefKey``: the signature used when ``signature_name`` is empty.
DEFAULT_SIGNATURE = "serving_default"


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
