"""TF Serving's JSON <-> tensor codec for the REST predict API. Pure: numpy and orjson only.

Follows ``tensorflow_serving/util/json_tensor.{h,cc}`` (``FillPredictRequestFromJson``,
``MakeJsonFromTensors``) and ``tensorflow_serving/g3doc/api_rest.md``; error messages are TF
Serving's, word for word, and every error is a :class:`~serving.util.errors.ServingError` with code
``INVALID_ARGUMENT`` (``UNIMPLEMENTED`` for input dtypes JSON cannot express). One number differs
on purpose: TF Serving's ``found at incorrect level: <level + 1> ... Expected at level: <rank>``
mixes a 1-based level with a 0-based one (``[[1], 2]``: "found at incorrect level: 2 ...
Expected at level: 2"); here both are 0-based, as in its ``Encountered list at unexpected
level`` messages ("found at incorrect level: 1 ... Expected at level: 2").

Request body (a JSON object; other top-level keys are ignored, however deeply nested; parsing is
rapidjson's, :mod:`serving.util.rapidjson`)::

    {"signature_name": <string, optional, default "serving_default">,
     "instances": [ ... ]  |  "inputs": <value> | {<input name>: <value>, ...}}

Row format, ``"instances"`` (response key ``"predictions"``)
    A non-empty list with one element per example, stacked along a new 0-th (batch) axis. With one
    named input each element is that input's value (scalar or nested list); with several, each
    element is an object ``{<name>: <value>, ...}`` holding every input exactly once. Every element
    must have the same shape. ``[1.0, 2.0]`` for input ``x`` -> ``x`` of shape ``[2]``.

Columnar format, ``"inputs"`` (response key ``"outputs"``)
    The input's value itself (any rank, scalars allowed, no batch stacking), or an object mapping
    each input name to its value. Keys that are not inputs are ignored.

Values (per the signature's ``TensorInfo.dtype``; shapes come from the nesting of JSON lists)
    ============================  ======================================================
    ``DT_FLOAT`` / ``DT_DOUBLE``  JSON numbers (``NaN``, ``Infinity``, ``-Infinity`` accepted),
                                  rounded to the type (``GetFloat()``): beyond float32's range
                                  +/-Infinity, below it 0. TF Serving dropped its lossless
                                  check in 2021 (``FloatTensorWithPrecisionLoss``).
    ``DT_INT8/16/32``, ``UINT8``  JSON integers in the int32 range (stored with C++ wrap-around).
    ``DT_INT64``                  JSON integers in the int64 range.
    ``DT_UINT32`` / ``DT_UINT64`` JSON integers in the unsigned range.
    ``DT_BOOL``                   ``true`` / ``false`` only.
    ``DT_STRING``                 JSON strings (UTF-8 bytes) or ``{"b64": "<base64>"}`` for binary.
    ============================  ======================================================

    Ragged lists, values at the wrong nesting depth and wrong JSON types are rejected with TF
    Serving's messages (``Encountered list at unexpected size: ...``, ``JSON Value: "a" Type: String
    is not of expected type: float``, ...). Decoded tensors are numpy arrays: ``np.float32`` etc.,
    and ``object`` arrays of ``bytes`` for ``DT_STRING``.

Response body
    Row: ``{"predictions": <list of the single output's rows> | [{<output>: <row>, ...}, ...]}`` --
    every output must share the batch (0-th) dimension. Columnar: ``{"outputs": <the single
    output> | {<output>: <value>, ...}}``. Floats are written with the shortest text that
    round-trips to the same float32/float64 (TF Serving prints ``%.6g`` and falls back to
    ``%.9g``/``%.17g``: the same numbers, occasionally spelled differently); non-finite floats as
    the bare tokens ``NaN``, ``Infinity``, ``-Infinity``; ``DT_STRING`` outputs as UTF-8 text, or
    as ``{"b64": ...}`` when the output's name ends in ``_bytes``; ``DT_HALF`` as float.

Decoding has a vectorised fast path (numpy over a flattened list of leaves) and a slow reference
path mirroring ``FillTensorProto`` element by element; the slow path only runs for requests the
fast path rejects, so that the first error reported is the one TF Serving would report.
"""

from __future__ import annotations

import base64
import binascii
import enum
import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from serving.apis import DEFAULT_SIGNATURE, MAX_RANK
from serving.util import rapidjson
from serving.util.errors import Code, ServingError

__all__ = [
    "JsonFormat",
    "PredictBody",
    "decode_predict_body",
    "decode_predict_inputs",
    "encode_predict_outputs",
    "parse_json",
    "signature_name",
]


class JsonFormat(enum.Enum):
    """Which request key carried the tensors; it decides the response key."""

    ROW = "row"  # "instances" in, "predictions" out
    COLUMNAR = "columnar"  # "inputs" in, "outputs" out


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_UINT64_MAX = 2**64 - 1
_NUMPY_OPTS = orjson.OPT_SERIALIZE_NUMPY


@dataclass(frozen=True)
class _InputType:
    """How JSON leaves convert to one TF dtype (``AddValueToTensor`` in json_tensor.cc)."""

    kind: str  # "float" | "int" | "bool" | "string"
    numpy: Any  # numpy dtype of the decoded array (object for strings)
    lo: int = 0  # accepted JSON integer range (rapidjson IsInt/IsInt64/IsUint/IsUint64)
    hi: int = 0


_INT32 = (-(2**31), 2**31 - 1)
_INPUT_TYPES: Mapping[str, _InputType] = {
    "DT_FLOAT": _InputType("float", np.float32),
    "DT_DOUBLE": _InputType("float", np.float64),
    "DT_INT32": _InputType("int", np.int32, *_INT32),
    "DT_INT16": _InputType("int", np.int16, *_INT32),
    "DT_INT8": _InputType("int", np.int8, *_INT32),
    "DT_UINT8": _InputType("int", np.uint8, *_INT32),
    "DT_INT64": _InputType("int", np.int64, _INT64_MIN, _INT64_MAX),
    "DT_UINT32": _InputType("int", np.uint32, 0, 2**32 - 1),
    "DT_UINT64": _InputType("int", np.uint64, 0, _UINT64_MAX),
    "DT_BOOL": _InputType("bool", np.bool_),
    "DT_STRING": _InputType("string", object),
}

# Output dtypes MakeJsonFromTensors can write (AddSingleValueAndAdvance); others are an error.
_OUTPUT_NUMPY_TYPES = frozenset(
    np.dtype(t)
    for t in (
        np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64,
        np.uint8, np.uint32, np.uint64, np.bool_,
    )
)  # fmt: skip


def _invalid(message: str) -> ServingError:
    return ServingError(Code.INVALID_ARGUMENT, message)


def _dtype_string(dtype_name: str) -> str:
    """``DataTypeString()``: ``"DT_FLOAT"`` -> ``"float"``."""
    return dtype_name[3:].lower() if dtype_name.startswith("DT_") else dtype_name.lower()


# --------------------------------------------------------------------------------------------
# Parsing the request document
# --------------------------------------------------------------------------------------------

def parse_json(body: bytes) -> dict[str, Any]:
    """Parse a request body the way TF Serving's ``ParseJson()`` does (rapidjson; see
    :func:`serving.util.rapidjson.parse`: ``NaN``/``Infinity`` tokens, nothing read after the
    top-level value, any nesting, bytes that are not UTF-8 kept).

    Raises ``INVALID_ARGUMENT``: ``JSON Parse error: The document is empty`` for an empty body,
    ``JSON Parse error: <rapidjson message> at offset: <byte offset>`` for malformed JSON (a
    number beyond the double range included), and ``JSON Value: <doc> Is not object`` when the
    top level is not an object.
    """
    if not body:
        raise _invalid("JSON Parse error: The document is empty")
    try:
        doc = rapidjson.parse(body, orjson.loads)
    except rapidjson.JsonParseError as exc:
        raise _invalid(str(exc)) from None
    if type(doc) is not dict:
        raise _format_error(doc, "Is not object")
    return doc


def signature_name(doc: Mapping[str, Any]) -> str:
    """The request's ``"signature_name"``, or ``""`` (meaning ``serving_default``) when absent.

    Raises ``INVALID_ARGUMENT`` ``JSON Value: <doc> not formatted correctly. 'signature_name' key
    must be a string value.`` when it is not a string.
    """
    if "signature_name" not in doc:
        return ""
    name = doc["signature_name"]
    if type(name) is not str:
        raise _invalid(
            f"JSON Value: {_json_value_to_string(doc)} not formatted correctly. "
            "'signature_name' key must be a string value."
        )
    return name


# --------------------------------------------------------------------------------------------
# Request document -> input tensors
# --------------------------------------------------------------------------------------------


def decode_predict_inputs(
    doc: Mapping[str, Any], input_dtypes: Mapping[str, str], signature: str = ""
) -> tuple[JsonFormat, dict[str, np.ndarray]]:
    """Decode ``"instances"`` or ``"inputs"`` into named numpy arrays.

    ``input_dtypes`` maps each signature input alias to its TF dtype enum name (``"DT_FLOAT"``);
    ``signature`` is only used in the message for an empty map. Returns the request format and
    ``{alias: array}``. Raises ``INVALID_ARGUMENT`` with TF Serving's messages (see module doc),
    e.g. ``Missing 'inputs' or 'instances' key``.
    """
    if not input_dtypes:
        raise _invalid(f"Failed to get input map for signature: {signature or 'DEFAULT'}")
    if "instances" in doc:
        if "inputs" in doc:
            raise _format_error(
                doc,
                "Not formatted correctly expecting only one of 'inputs' or 'instances' keys "
                "to exist ",
            )
        instances = doc["instances"]
        if type(instances) is not list:
            raise _format_error(doc, "Expecting 'instances' to be an list/array")
        if not instances:
            raise _format_error(doc, "No values in 'instances' array")
        return JsonFormat.ROW, _decode_instances(instances, input_dtypes)
    if "inputs" in doc:
        return JsonFormat.COLUMNAR, _decode_inputs(doc["inputs"], input_dtypes)
    raise _invalid("Missing 'inputs' or 'instances' key")


@dataclass(frozen=True)
class PredictBody:
    """A predict body parsed and, when its signature's input dtypes were known, decoded
    (:func:`decode_predict_body`)."""

    signature_name: str
    """The body's ``"signature_name"``; ``""`` when absent (``serving_default``)."""
    input_dtypes: Mapping[str, str] | None
    """The ``{alias: dtype name}`` the tensors were decoded for; ``None``: not decoded."""
    format: JsonFormat | None = None
    inputs: dict[str, np.ndarray] | None = None
    error: ServingError | None = None
    """What decoding raised, kept to be raised by :meth:`tensors` (after the servable lookup)."""

    def tensors(self) -> tuple[JsonFormat, dict[str, np.ndarray]]:
        """``(format, inputs)`` as :func:`decode_predict_inputs` returns them, or its error."""
        if self.error is not None:
            raise self.error
        if self.format is None or self.inputs is None:
            raise ValueError("the body was not decoded (no input dtypes for its signature)")
        return self.format, self.inputs


def decode_predict_body(
    body: bytes, input_dtypes_by_signature: Mapping[str, Mapping[str, str]]
) -> PredictBody:
    """``FillPredictRequestFromJson`` in one call: parse ``body``, read its signature name and
    decode its tensors for that signature's inputs, if ``input_dtypes_by_signature`` (signature
    name -> ``{alias: dtype name}``, the servable's ``GetInfoMap`` for each signature) has it.

    For the REST front end's worker processes (:mod:`serving.util.process_executor`), which get
    bytes and must send back arrays, not the parsed document. Raises what :func:`parse_json` and
    :func:`signature_name` raise -- errors TF Serving reports before it looks the servable up;
    decoding's own errors are kept in :attr:`PredictBody.error`, since TF Serving reports a
    missing servable before them.
    """
    doc = parse_json(body)
    signature = signature_name(doc)
    input_dtypes = input_dtypes_by_signature.get(signature or DEFAULT_SIGNATURE)
    if input_dtypes is None:
        return PredictBody(signature, None)
    try:
        fmt, inputs = decode_predict_inputs(doc, input_dtypes, signature)
    except ServingError as exc:
        return PredictBody(signature, input_dtypes, error=exc)
    return PredictBody(signature, input_dtypes, fmt, inputs)


def _is_b64_object(val: Any) -> bool:
    return type(val) is dict and len(val) == 1 and type(val.get("b64")) is str


def _is_element_object(val: Any) -> bool:
    return type(val) is dict and not _is_b64_object(val)


def _decode_instances(
    instances: list[Any], input_dtypes: Mapping[str, str]
) -> dict[str, np.ndarray]:
    """``FillTensorMapFromInstancesList``: stack the elements along a new batch axis."""
    names = sorted(input_dtypes)
    if type(instances[0]) is not dict and len(names) > 1:
        raise _invalid(
            "instances is a plain list, but expecting list of objects as multiple input tensors "
            "required as per tensorinfo_map"
        )
    objects = _is_element_object(instances[0])
    if objects:
        name_set = set(names)
        if name_set != {"b64"} and all(
            type(row) is dict and row.keys() == name_set for row in instances
        ):
            decoded = {}
            for name in names:
                array = _fast_tensor([row[name] for row in instances], input_dtypes[name])
                if array is None:
                    break
                decoded[name] = array
            else:
                return decoded
    else:
        array = _fast_tensor(instances, input_dtypes[names[0]])
        if array is not None:
            return {names[0]: array}
    return _slow_instances(instances, names, input_dtypes, objects)


def _slow_instances(
    instances: list[Any], names: list[str], input_dtypes: Mapping[str, str], objects: bool
) -> dict[str, np.ndarray]:
    """Element-by-element reference path: finds the exact error TF Serving reports first."""
    rows: dict[str, list[np.ndarray]] = {}
    shapes: dict[str, tuple[list[int], int]] = {}
    for index, element in enumerate(instances):
        if objects:
            if not _is_element_object(element):
                raise _invalid(f"Expecting object but got list at item {index} of input list")
            for name, value in element.items():
                try:
                    _add_instance_item(value, name, input_dtypes, shapes, rows)
                except ServingError as exc:
                    raise _invalid(
                        f"Failed to process element: {index} key: {name} of 'instances' list. "
                        f"Error: {exc.status_string()}"
                    ) from None
            if set(element) != set(names):
                raise _invalid(
                    f"Failed to process element: {index} of 'instances' list. JSON object: "
                    f"{_json_value_to_string(element)} keys must be equal to: {','.join(names)}"
                )
        else:
            if _is_element_object(element):
                raise _invalid(f"Expecting value/list but got object at item {index} of input list")
            try:
                _add_instance_item(element, names[0], input_dtypes, shapes, rows)
            except ServingError as exc:
                raise _invalid(
                    f"Failed to process element: {index} of 'instances' list. "
                    f"Error: {exc.status_string()}"
                ) from None
    return {name: np.stack(arrays) for name, arrays in rows.items()}


def _add_instance_item(
    item: Any,
    name: str,
    input_dtypes: Mapping[str, str],
    shapes: dict[str, tuple[list[int], int]],
    rows: dict[str, list[np.ndarray]],
) -> None:
    """``AddInstanceItem``: one element of one input; all elements must share size and shape."""
    if name not in input_dtypes:
        raise _invalid(f"JSON object: does not have named input: {name}")
    array, shape, size = _slow_tensor(item, input_dtypes[name])
    if name not in shapes:
        shapes[name] = (shape, size)
    elif shapes[name][1] != size:
        raise _invalid(f"Expecting tensor size: {shapes[name][1]} but got: {size}")
    elif shapes[name][0] != shape:
        raise _invalid(
            f"Expecting shape {_shape_string(shapes[name][0])} but got: {_shape_string(shape)}"
        )
    rows.setdefault(name, []).append(array)


def _decode_inputs(value: Any, input_dtypes: Mapping[str, str]) -> dict[str, np.ndarray]:
    """``FillTensorMapFromInputsMap``: one value, or an object of named values (extras ignored)."""
    names = sorted(input_dtypes)
    if type(value) is not dict or _is_b64_object(value):
        if len(names) > 1:
            raise _invalid(
                "inputs is a plain value/list, but expecting an object as multiple input "
                "tensors required as per tensorinfo_map"
            )
        return {names[0]: _tensor(value, input_dtypes[names[0]])}
    decoded = {}
    for name in names:
        if name not in value:
            raise _invalid(f"Missing named input: {name} in 'inputs' object.")
        decoded[name] = _tensor(value[name], input_dtypes[name])
    return decoded


def _tensor(value: Any, dtype_name: str) -> np.ndarray:
    array = _fast_tensor(value, dtype_name)
    return array if array is not None else _slow_tensor(value, dtype_name)[0]


def _dense_shape(value: Any) -> list[int]:
    """``GetDenseTensorShape``: the shape implied by following the first element of each list."""
    shape = []
    while type(value) is list:
        shape.append(len(value))
        if not value:
            break
        value = value[0]
    rank = len(shape)
    if type(value) is rapidjson.Deep and value.kind == "array":  # nested past what the parser built
        rank += value.depth
    if rank > MAX_RANK:
        raise _invalid(f"Too many dimensions in tensor: {rank}; at most {MAX_RANK} here")
    return shape


def _shape_string(shape: list[int]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


# ---- fast path -------------------------------------------------------------------------------


def _fast_tensor(value: Any, dtype_name: str) -> np.ndarray | None:
    """Vectorised decode of a dense, well-typed value; ``None`` when anything is off."""
    spec = _INPUT_TYPES.get(dtype_name)
    if spec is None:
        return None
    shape = _dense_shape(value)
    leaves = _flatten(value, shape)
    if leaves is None:
        return None
    array = _convert_leaves(leaves, spec)
    return None if array is None else array.reshape(shape)


def _flatten(value: Any, shape: list[int]) -> list[Any] | None:
    """The leaves of a dense nested list, or ``None`` when it is ragged (one check per sub-list)."""
    if not shape:
        return [value]
    items: list[Any] = value
    for size in shape[1:]:
        if not all(type(item) is list and len(item) == size for item in items):
            return None
        items = list(itertools.chain.from_iterable(items))
    return items


def _convert_leaves(leaves: list[Any], spec: _InputType) -> np.ndarray | None:
    kinds = set(map(type, leaves))
    try:
        if spec.kind == "float":
            return _convert_floats(leaves, kinds, spec)
        if spec.kind == "int":
            if not kinds <= {int}:
                return None
            wide = np.array(leaves, dtype=np.uint64 if spec.hi == _UINT64_MAX else np.int64)
            if wide.size and (int(wide.min()) < spec.lo or int(wide.max()) > spec.hi):
                return None
            return wide.astype(spec.numpy)
        if spec.kind == "bool":
            return np.array(leaves, dtype=np.bool_) if kinds <= {bool} else None
        return _convert_strings(leaves, kinds)
    except (OverflowError, ValueError, TypeError):
        return None


def _convert_floats(leaves: list[Any], kinds: set[type], spec: _InputType) -> np.ndarray | None:
    if not kinds <= {int, float}:
        return None
    wide = np.array(leaves, dtype=np.float64)
    return _narrowed(wide, spec)


def _narrowed(wide: np.ndarray, spec: _InputType) -> np.ndarray:
    """``GetFloat()``: a double cast to float32 -- rounded, beyond its range +/-Infinity, below
    it 0 -- as TF Serving has accepted any number for a float input since 2021
    (``FloatTensorWithPrecisionLoss``, ``FloatTensorThatExceedsMaxReturnsInf``)."""
    with np.errstate(over="ignore"):
        return wide.astype(spec.numpy, copy=False)


def _convert_strings(leaves: list[Any], kinds: set[type]) -> np.ndarray | None:
    if kinds <= {str}:
        values = [_utf8(leaf) for leaf in leaves]
    elif kinds <= {str, dict}:
        values = []
        for leaf in leaves:
            if type(leaf) is str:
                values.append(_utf8(leaf))
            elif _is_b64_object(leaf):
                decoded = _b64decode(leaf["b64"])
                if decoded is None:
                    return None
                values.append(decoded)
            else:
                return None
    else:
        return None
    array = np.empty(len(values), dtype=object)
    array[:] = values
    return array


def _utf8(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: raw bytes from the body, or \ud800-style escapes
        try:
            return text.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            return text.encode("utf-8", "surrogatepass")


def _b64decode(text: str) -> bytes | None:
    """``absl::Base64Unescape``: standard alphabet, padding optional."""
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        return None


# ---- slow (reference) path ---------------------------------------------------------------------


def _slow_tensor(value: Any, dtype_name: str) -> tuple[np.ndarray, list[int], int]:
    """``FillTensorProto`` element by element. Returns the array, its shape and its value count."""
    shape = _dense_shape(value)
    leaves: list[Any] = []
    _fill(value, 0, shape, dtype_name, leaves)
    return _assemble(leaves, shape, dtype_name), shape, len(leaves)


def _fill(value: Any, level: int, shape: list[int], dtype_name: str, out: list[Any]) -> None:
    rank = len(shape)
    if type(value) is not list:
        if level != rank:
            raise _invalid(
                f"JSON Value: {_json_value_to_string(value)} found at incorrect level: "
                f"{level} in the JSON DOM. Expected at level: {rank}"
            )
        if type(value) is dict:
            if dtype_name != "DT_STRING":
                raise _type_error(value, dtype_name)
            if not _is_b64_object(value):
                raise _invalid(
                    f"JSON Value: {_json_value_to_string(value)} not formatted correctly for "
                    "base64 data"
                )
            decoded = _b64decode(value["b64"])
            if decoded is None:
                raise _invalid("Unable to base64 decode")
            out.append(decoded)
        else:
            out.append(_convert_scalar(value, dtype_name))
        return
    if level >= rank:
        raise _invalid(f"Encountered list at unexpected level: {level} expected < {rank}")
    if len(value) != shape[level]:
        raise _invalid(
            f"Encountered list at unexpected size: {len(value)} at level: {level} "
            f"expected size: {shape[level]}"
        )
    for item in value:
        _fill(item, level + 1, shape, dtype_name, out)


def _is_json_int(value: Any) -> bool:
    """rapidjson stores integer literals within 64 bits as integers, larger ones as doubles."""
    return type(value) is int and _INT64_MIN <= value <= _UINT64_MAX


def _convert_scalar(value: Any, dtype_name: str) -> Any:
    """``AddValueToTensor`` for one JSON scalar."""
    spec = _INPUT_TYPES.get(dtype_name)
    if spec is None:
        raise ServingError(
            Code.UNIMPLEMENTED,
            f"Conversion of JSON Value: {_json_value_to_string(value)} to type: "
            f"{_dtype_string(dtype_name)}",
        )
    kind = type(value)
    if spec.kind == "float":
        if kind not in (int, float):
            raise _type_error(value, dtype_name)
        return float(value)  # cast to the input's width in _assemble
    if spec.kind == "int":
        if not (_is_json_int(value) and spec.lo <= value <= spec.hi):
            raise _type_error(value, dtype_name)
        return value
    if spec.kind == "bool":
        if kind is not bool:
            raise _type_error(value, dtype_name)
        return value
    if kind is not str:
        raise _type_error(value, dtype_name)
    return _utf8(value)


def _assemble(leaves: list[Any], shape: list[int], dtype_name: str) -> np.ndarray:
    spec = _INPUT_TYPES.get(dtype_name)
    if spec is None:  # only reachable with no values at all (nothing to convert)
        return np.zeros(shape, dtype=np.float32)
    if spec.kind == "string":
        array = np.empty(len(leaves), dtype=object)
        array[:] = leaves
    elif spec.kind == "int":
        wide = np.array(leaves, dtype=np.uint64 if spec.hi == _UINT64_MAX else np.int64)
        array = wide.astype(spec.numpy)
    elif spec.kind == "float":
        array = _narrowed(np.array(leaves, dtype=np.float64), spec)
    else:
        array = np.array(leaves, dtype=spec.numpy)
    return array.reshape(shape)


def _type_error(value: Any, dtype_name: str) -> ServingError:
    return _invalid(
        f"JSON Value: {_json_value_to_string(value)} Type: {_json_type_string(value)} "
        f"is not of expected type: {_dtype_string(dtype_name)}"
    )


def _format_error(value: Any, message: str) -> ServingError:
    return _invalid(f"JSON Value: {_json_value_to_string(value)} {message}")


def _json_type_string(value: Any) -> str:
    """``JsonTypeString``: rapidjson's type names."""
    return rapidjson.type_string(value)


def _json_value_to_string(value: Any) -> str:
    """``JsonValueToDebugString``: single-line arrays, cut at 256 bytes (:mod:`serving.util.rapidjson`)."""
    return rapidjson.debug_string(value)


# --------------------------------------------------------------------------------------------
# Output tensors -> response document
# --------------------------------------------------------------------------------------------


def encode_predict_outputs(outputs: Mapping[str, np.ndarray], fmt: JsonFormat) -> bytes:
    """``MakeJsonFromTensors``: the response body for ``outputs`` (alias -> numpy array).

    Raises ``INVALID_ARGUMENT``: ``Cannot convert empty tensor map to JSON``; in row format
    ``Tensor name: <n> has no shape information `` for a scalar output and ``Tensor name: <n> has
    inconsistent batch size: <b> expecting: <b0>``; ``Failed to write JSON value for tensor type:
    <dtype>`` for dtypes JSON cannot carry (complex, bfloat16, uint16, ...).
    """
    if not outputs:
        raise _invalid("Cannot convert empty tensor map to JSON")
    names = sorted(outputs)
    if fmt is JsonFormat.ROW:
        batch = -1
        for name in names:
            array = outputs[name]
            if array.ndim == 0:
                raise _invalid(f"Tensor name: {name} has no shape information ")
            if batch >= 0 and array.shape[0] != batch:
                raise _invalid(
                    f"Tensor name: {name} has inconsistent batch size: {array.shape[0]} "
                    f"expecting: {batch}"
                )
            batch = array.shape[0]
        values = {name: _jsonable(name, outputs[name]) for name in names}
        if len(names) == 1:
            body: dict[str, Any] = {"predictions": values[names[0]]}
        else:
            body = {"predictions": [{n: values[n][i] for n in names} for i in range(batch)]}
    else:
        values = {name: _jsonable(name, outputs[name]) for name in names}
        body = {"outputs": values[names[0]] if len(names) == 1 else values}
    return orjson.dumps(body, option=_NUMPY_OPTS)


def _jsonable(name: str, array: np.ndarray) -> Any:
    """Something orjson writes as TF Serving would, indexable along axis 0 when ``ndim > 0``."""
    if array.dtype == object or array.dtype.kind in "SU":  # DT_STRING (a scalar comes as S<n>)
        as_b64 = name.endswith("_bytes")  # IsNamedTensorBytes
        convert = _bytes_to_b64_object if as_b64 else _bytes_to_text
        return np.frompyfunc(convert, 1, 1)(array).tolist() if array.ndim else convert(array.item())
    if array.dtype not in _OUTPUT_NUMPY_TYPES:
        raise _invalid(f"Failed to write JSON value for tensor type: {array.dtype.name}")
    if array.dtype == np.float16:  # DT_HALF is written as float
        array = array.astype(np.float32)
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        return _with_nonfinite_tokens(array)
    if array.ndim == 0:
        return array[()]  # a numpy scalar
    return np.ascontiguousarray(array)


def _with_nonfinite_tokens(array: np.ndarray) -> Any:
    """Nested lists of raw JSON number tokens, so NaN/Infinity appear as bare tokens."""
    flat = array.ravel()
    finite = np.isfinite(flat)
    tokens = orjson.dumps(np.where(finite, flat, 0), option=_NUMPY_OPTS)[1:-1].split(b",")
    for index in np.flatnonzero(~finite):
        value = flat[index]
        tokens[index] = b"NaN" if np.isnan(value) else (b"-Infinity" if value < 0 else b"Infinity")
    fragments = np.empty(len(tokens), dtype=object)
    fragments[:] = [orjson.Fragment(token) for token in tokens]
    return fragments.reshape(array.shape).tolist()


def _bytes_to_text(value: bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _bytes_to_b64_object(value: bytes) -> dict[str, str]:
    raw = value if isinstance(value, bytes) else str(value).encode()
    return {"b64": base64.b64encode(raw).decode("ascii")}
