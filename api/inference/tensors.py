"""One example between a route's values and the client's tensors, checked against its `TensorSpec`s.

A route works with one example at a time, as nested Python lists of each tensor's declared
shape; serving takes and answers batches, `[batch, *shape]`. These functions make the
[1, *shape] input tensors from preprocess's values and check and unpack the answer's
outputs for postprocess. Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from api.model_routes import TensorSpec
from api.serving_client import DataType, ServingBadResponse, Tensor

_FLOATS = frozenset({DataType.DT_FLOAT, DataType.DT_DOUBLE})
_NUMBERS = _FLOATS | {
    DataType.DT_INT8, DataType.DT_INT16, DataType.DT_INT32, DataType.DT_INT64,
    DataType.DT_UINT8, DataType.DT_UINT16, DataType.DT_UINT32, DataType.DT_UINT64,
}  # fmt: skip


def example_inputs(specs: Mapping[str, TensorSpec], values: Mapping[str, Any]) -> dict[str, Tensor]:
    """Preprocess's values for one example as [1, *shape] tensors of the declared dtypes.

    Raises:
        ValueError: an input missing or not declared, or a value whose nesting does not
            match its declared shape (a bug in the route's preprocess: answered 500).
    """
    if values.keys() != specs.keys():
        raise ValueError(f"preprocess returned inputs {sorted(values)}, the signature declares {sorted(specs)}")
    tensors = {}
    for name, spec in specs.items():
        flat: list[Any] = []
        _flatten(values[name], spec.shape, flat, name)
        tensors[name] = Tensor((1, *spec.shape), flat, spec.dtype)
    return tensors


def _flatten(value: Any, shape: Sequence[int], out: list[Any], name: str) -> None:
    if not shape:
        if isinstance(value, (list, tuple)):
            raise ValueError(f"input {name!r}: a value nested deeper than its declared shape")
        out.append(value)
        return
    if not isinstance(value, (list, tuple)) or len(value) != shape[0]:
        size = len(value) if isinstance(value, (list, tuple)) else "a scalar"
        raise ValueError(f"input {name!r}: expected {shape[0]} values at this level of its shape, got {size}")
    if len(shape) == 1 and not any(isinstance(v, (list, tuple)) for v in value):
        out.extend(value)  # the common case, a vector: no recursion per element
        return
    for item in value:
        _flatten(item, shape[1:], out, name)


def example_outputs(specs: Mapping[str, TensorSpec], outputs: Mapping[str, Tensor], model: str) -> dict[str, Any]:
    """The declared outputs of a one-example answer, as nested lists of their shapes.

    Raises:
        ServingBadResponse: an output is missing, not [1, *shape], not numbers where
            numbers are declared, not finite where floats are, or outside its bounds.
    """
    unpacked = {}
    for name, spec in specs.items():
        tensor = outputs.get(name)
        if tensor is None:
            raise ServingBadResponse(f"model '{model}' answered without output '{name}'; got {sorted(outputs)}")
        if tuple(tensor.shape) != (1, *spec.shape):
            raise ServingBadResponse(
                f"model '{model}' answered output '{name}' of shape {list(tensor.shape)}, expected {[1, *spec.shape]}"
            )
        if spec.dtype in _NUMBERS:
            _check_numbers(name, spec, tensor.values, model)
        # [1, *shape]: the values are the one example's, nested by its shape.
        unpacked[name] = Tensor(spec.shape, tensor.values, tensor.dtype).to_nested()
    return unpacked


def _check_numbers(name: str, spec: TensorSpec, values: Sequence[Any], model: str) -> None:
    low, high = spec.bounds if spec.bounds is not None else (-math.inf, math.inf)
    for value in values:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ServingBadResponse(f"model '{model}' answered a non-numeric '{name}': {value!r}")
        if not math.isfinite(value):
            raise ServingBadResponse(f"model '{model}' answered a non-finite '{name}': {value!r}")
        if not low <= value <= high:
            raise ServingBadResponse(f"model '{model}' answered '{name}' {value!r}, outside [{low}, {high}]")
