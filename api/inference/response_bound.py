"""The largest Predict answer the enabled routes can rightly get from serving, bytes.

A route declares its outputs (`TensorSpec`: dtype and per-example shape); one call to serving
carries at most `rows` examples (the coalescing batch). TF Serving's REST answer writes each
number as JSON text: at most `BYTES_PER_NUMBER` bytes with its separator (a float32 as
`-1.23456789e-38,`; float64 and int64 take up to 24), plus `OVERHEAD_BYTES` for the object's
keys and nesting. A gRPC answer's `tensor_content` is smaller than that. A string output (or
one with an unknown dimension) has no such bound: the setting alone applies.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Final

from api.model_routes import Signature
from api.serving_client import DataType

__all__ = ["BYTES_PER_NUMBER", "OVERHEAD_BYTES", "predict_response_bound"]

BYTES_PER_NUMBER: Final = 32
OVERHEAD_BYTES: Final = 64 * 1024


def predict_response_bound(signatures: Iterable[Signature], rows: int) -> int | None:
    """The bound for the largest of `signatures`' answers to `rows` examples, bytes; None
    when an output's size is not bounded by its declaration (a string, a dimension < 0)."""
    largest = 0
    for signature in signatures:
        numbers = 0
        for spec in signature.outputs.values():
            if spec.dtype is DataType.DT_STRING or any(d < 0 for d in spec.shape):
                return None
            numbers += math.prod(spec.shape)
        largest = max(largest, numbers * rows * BYTES_PER_NUMBER + OVERHEAD_BYTES)
    return largest or None
