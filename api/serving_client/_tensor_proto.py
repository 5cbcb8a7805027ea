"""Codec between the client's types and TF Serving's gRPC messages (`api.protos`).

Numeric tensors are written to `TensorProto.tensor_content`: the raw little-endian
bytes of the values in row-major order, which TF Serving copies into a tensor without
per-value parsing (tensor.proto). Reading accepts both `tensor_content` and the typed
`*_val` fields, with TensorFlow's rule that a typed field shorter than the shape repeats
its last value (a single value fills the tensor). Pure: no I/O, no grpc import; NumPy
is not needed (`array` does the byte conversion).
"""

from __future__ import annotations

import math
import struct
import sys
from array import array
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from api.protos.tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2
from api.protos.tensorflow.core.protobuf import meta_graph_pb2
from api.protos.tensorflow_serving.apis import get_model_metadata_pb2, get_model_status_pb2, predict_pb2
from api.serving_client._errors import ServingBadResponse
from api.serving_client._types import (
    DataType,
    ModelMetadata,
    ModelStatus,
    PredictRequest,
    PredictResponse,
    Scalar,
    SignatureInfo,
    Tensor,
    TensorInfo,
    VersionStatus,
)

# dtype -> (array typecode, bytes per value, typed TensorProto field). DT_BOOL is one
# byte per value, 0 or 1, read as unsigned bytes.
_LAYOUT: dict[DataType, tuple[str, int, str]] = {
    DataType.DT_FLOAT: ("f", 4, "float_val"),
    DataType.DT_DOUBLE: ("d", 8, "double_val"),
    DataType.DT_INT32: ("i", 4, "int_val"),
    DataType.DT_INT16: ("h", 2, "int_val"),
    DataType.DT_INT8: ("b", 1, "int_val"),
    DataType.DT_UINT8: ("B", 1, "int_val"),
    DataType.DT_UINT16: ("H", 2, "int_val"),
    DataType.DT_INT64: ("q", 8, "int64_val"),
    DataType.DT_UINT32: ("I", 4, "uint32_val"),
    DataType.DT_UINT64: ("Q", 8, "uint64_val"),
    DataType.DT_BOOL: ("B", 1, "bool_val"),
}
for _typecode, _size, _ in _LAYOUT.values():  # array's C types must have the wire sizes
    assert array(_typecode).itemsize == _size, (_typecode, _size)
_SWAP = sys.byteorder != "little"  # tensor_content is little-endian on every TF host
_V = TypeVar("_V")


def tensor_to_proto(tensor: Tensor, out: tensor_pb2.TensorProto | None = None) -> tensor_pb2.TensorProto:
    """Encode `tensor` (dtype required) as a TensorProto, numbers via tensor_content.

    Args:
        tensor: the tensor; `dtype` must be set.
        out: a message to fill in place (e.g. `request.inputs[name]`); a new one if None.

    Raises:
        ValueError: no dtype, or a dtype this codec does not write.
        OverflowError / TypeError: a value does not fit the dtype.
    """
    proto = tensor_pb2.TensorProto() if out is None else out
    if tensor.dtype is None:
        raise ValueError("a tensor sent over gRPC needs a dtype")
    proto.dtype = types_pb2.DataType.ValueType(tensor.dtype)
    for size in tensor.shape:
        proto.tensor_shape.dim.add().size = size
    if tensor.dtype is DataType.DT_STRING:
        # `values` is typed for every dtype; protobuf checks each is bytes (TypeError otherwise).
        proto.string_val.extend(tensor.values)  # type: ignore[arg-type]
        return proto
    if tensor.dtype in _HALF_TYPES:
        proto.tensor_content = encode_16bit(tensor.dtype, tensor.values)
        return proto
    layout = _LAYOUT.get(tensor.dtype)
    if layout is None:
        raise ValueError(f"cannot encode dtype {tensor.dtype.name}")
    given = tensor.values
    values: array[Any]
    if isinstance(given, array) and given.typecode == layout[0]:
        values = given  # already the wire's C type (an OIP binary tensor): its bytes as they are
    else:
        # array() checks each value fits the C type (TypeError, OverflowError), which is the
        # check the caller relies on.
        values = array(layout[0], given)
    if _SWAP:
        values = array(values.typecode, values)
        values.byteswap()
    proto.tensor_content = values.tobytes()
    return proto


# DT_HALF (IEEE 754 binary16) and DT_BFLOAT16 (the top half of a float32): 2 bytes a value in
# tensor_content, their bit patterns in half_val (tensor.proto). `array` has no 16-bit float.
_HALF_TYPES = frozenset({DataType.DT_HALF, DataType.DT_BFLOAT16})


def encode_16bit(dtype: DataType, values: Sequence[Scalar]) -> bytes:
    """Little-endian DT_HALF or DT_BFLOAT16 bytes of `values` (Python floats).

    DT_HALF rounds to nearest even (`struct`'s `e`); DT_BFLOAT16 rounds the float32 to
    nearest even on its top 16 bits, NaN kept a NaN, as TensorFlow's conversion does.

    Raises:
        OverflowError: a finite value beyond DT_HALF's range (65504).
        TypeError: a value that is not a number.
    """
    if dtype is DataType.DT_HALF:
        return struct.pack(f"<{len(values)}e", *values)
    words = array("I", struct.pack(f"<{len(values)}f", *values))
    if _SWAP:
        words.byteswap()
    out = array("H")
    for bits in words:
        if bits & 0x7F800000 == 0x7F800000 and bits & 0x007FFFFF:  # NaN: a quiet NaN of its sign
            out.append((bits >> 16) | 0x0040)
        else:
            out.append(((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF)
    if _SWAP:
        out.byteswap()
    return out.tobytes()


def decode_16bit(dtype: DataType, content: bytes) -> list[float]:
    """Python floats of little-endian DT_HALF or DT_BFLOAT16 bytes (exact: both widen)."""
    count = len(content) // 2
    if dtype is DataType.DT_HALF:
        return list(struct.unpack(f"<{count}e", content))
    halves = array("H", content)
    if _SWAP:
        halves.byteswap()
    return list(struct.unpack(f"<{count}f", struct.pack(f"<{count}I", *(h << 16 for h in halves))))


def tensor_from_proto(proto: tensor_pb2.TensorProto) -> Tensor:
    """Decode a TensorProto (tensor_content or typed values) into a `Tensor`.

    Raises:
        ServingBadResponse: unknown rank or dimensions, an unsupported dtype, or a value
            count that does not match the shape.
    """
    if proto.tensor_shape.unknown_rank:
        raise ServingBadResponse("serving answered a tensor of unknown rank")
    shape = tuple(d.size for d in proto.tensor_shape.dim)
    if any(d < 0 for d in shape):
        raise ServingBadResponse(f"serving answered a tensor of unknown shape {list(shape)}")
    count = math.prod(shape)
    try:
        dtype = DataType(proto.dtype)
    except ValueError:
        raise ServingBadResponse(f"serving answered a tensor of unsupported dtype {proto.dtype}") from None
    values: Sequence[Scalar]
    if dtype is DataType.DT_STRING:
        values = _fill(list(proto.string_val), count, dtype)
    elif dtype in _HALF_TYPES:
        if proto.tensor_content:
            if len(proto.tensor_content) != count * 2:
                raise ServingBadResponse(
                    f"serving answered {len(proto.tensor_content)} bytes of tensor_content "
                    f"for a {dtype.name} tensor of shape {list(shape)}"
                )
            values = decode_16bit(dtype, proto.tensor_content)
        else:
            bits = _fill([v & 0xFFFF for v in proto.half_val], count, dtype)
            values = decode_16bit(dtype, struct.pack(f"<{len(bits)}H", *bits))
    else:
        layout = _LAYOUT.get(dtype)
        if layout is None:
            raise ServingBadResponse(f"serving answered a tensor of unsupported dtype {dtype.name}")
        typecode, size, field_name = layout
        if proto.tensor_content:
            if len(proto.tensor_content) != count * size:
                raise ServingBadResponse(
                    f"serving answered {len(proto.tensor_content)} bytes of tensor_content "
                    f"for a {dtype.name} tensor of shape {list(shape)}"
                )
            decoded = array(typecode)
            decoded.frombytes(proto.tensor_content)
            if _SWAP:
                decoded.byteswap()
            numbers: Sequence[float] = decoded.tolist()  # int and bool values too: float's type admits them
        else:
            numbers = _fill(list(getattr(proto, field_name)), count, dtype)
        if dtype is DataType.DT_BOOL:
            values = [bool(v) for v in numbers]
        elif dtype is DataType.DT_FLOAT:
            values = [shortest_float32(v) for v in numbers]
        else:
            values = numbers
    return Tensor(shape, values, dtype)


_FLOAT32 = struct.Struct("<f")


def shortest_float32(value: float) -> float:
    """The float32 `value` as the shortest decimal that reads back as the same float32.

    A float32 widened to a Python float carries its binary expansion (0.20017243921756744);
    serving's REST answer, and TF Serving's, carry the shortest round-tripping decimal
    (0.20017244). Decoding gRPC tensors through this makes both transports give the API the
    same numbers. Non-finite values are returned as they are.
    """
    if not math.isfinite(value):
        return value
    for digits in range(6, 10):  # 9 significant digits always round-trip a float32
        candidate = float(f"{value:.{digits}g}")
        if _FLOAT32.unpack(_FLOAT32.pack(candidate))[0] == value:
            return candidate
    return value


def _fill(values: list[_V], count: int, dtype: DataType) -> list[_V]:
    """TensorFlow's rule for typed fields: fewer values than elements repeat the last."""
    if len(values) == count:
        return values
    if values and len(values) < count:
        return values + [values[-1]] * (count - len(values))
    if not values and count == 0:
        return values
    raise ServingBadResponse(
        f"serving answered {len(values)} {dtype.name} values for a tensor of {count} elements"
    )


def predict_request_to_proto(request: PredictRequest) -> predict_pb2.PredictRequest:
    """Encode a `PredictRequest` as TF Serving's `tensorflow.serving.PredictRequest`.

    Raises:
        ValueError, OverflowError, TypeError: an input cannot be encoded (see
            `tensor_to_proto`).
    """
    proto = predict_pb2.PredictRequest()
    spec = request.model_spec
    proto.model_spec.name = spec.name
    proto.model_spec.signature_name = spec.signature_name
    if spec.version is not None:
        proto.model_spec.version.value = spec.version
    elif spec.version_label is not None:
        proto.model_spec.version_label = spec.version_label
    for name, tensor in request.inputs.items():
        tensor_to_proto(tensor, proto.inputs[name])
    proto.output_filter.extend(request.output_filter)
    return proto


def predict_response_from_proto(proto: predict_pb2.PredictResponse) -> PredictResponse:
    """Decode `tensorflow.serving.PredictResponse`; `model_version` from its model_spec.

    Raises:
        ServingBadResponse: an output cannot be decoded.
    """
    outputs = {name: tensor_from_proto(t) for name, t in proto.outputs.items()}
    version = proto.model_spec.version.value if proto.model_spec.HasField("version") else None
    return PredictResponse(outputs=outputs, model_version=version)


def model_status_from_proto(proto: get_model_status_pb2.GetModelStatusResponse) -> ModelStatus:
    """Decode `GetModelStatusResponse` (state names as in get_model_status.proto)."""
    state_name = get_model_status_pb2.ModelVersionStatus.State.Name
    versions = []
    for entry in proto.model_version_status:
        try:
            state = state_name(entry.state)
        except ValueError:
            state = "UNKNOWN"
        versions.append(VersionStatus(entry.version, state, entry.status.error_message))
    return ModelStatus(tuple(versions))


def model_metadata_request(
    model_name: str, version: int | None, label: str | None = None
) -> get_model_metadata_pb2.GetModelMetadataRequest:
    """`GetModelMetadataRequest` for the "signature_def" field of `version`, else of the version
    `label` names, else of the latest."""
    message = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    message.model_spec.name = model_name
    if version is not None:
        message.model_spec.version.value = version
    elif label is not None:
        message.model_spec.version_label = label
    return message


def model_metadata_from_proto(
    proto: get_model_metadata_pb2.GetModelMetadataResponse, version: int | None
) -> ModelMetadata:
    """Decode `GetModelMetadataResponse`: its "signature_def" field, a packed `SignatureDefMap`;
    the version from its `model_spec` (the one serving resolved), else `version`.

    Raises:
        ServingBadResponse: the field is missing or does not unpack, or no version is known.
    """
    if proto.model_spec.HasField("version"):
        version = proto.model_spec.version.value
    if version is None:
        raise ServingBadResponse("serving's model metadata names no version (model_spec.version)")
    signature_defs = get_model_metadata_pb2.SignatureDefMap()
    if "signature_def" not in proto.metadata or not proto.metadata["signature_def"].Unpack(signature_defs):
        raise ServingBadResponse("serving's model metadata has no SignatureDefMap under 'signature_def'")
    signatures = {
        key: SignatureInfo(_tensor_infos(sig.inputs), _tensor_infos(sig.outputs), sig.method_name)
        for key, sig in signature_defs.signature_def.items()
    }
    return ModelMetadata(version, signatures)


def _tensor_infos(entries: Mapping[str, meta_graph_pb2.TensorInfo]) -> dict[str, TensorInfo]:
    return {
        alias: TensorInfo(_dtype(info.dtype), _shape(info.tensor_shape), info.name) for alias, info in entries.items()
    }


def _dtype(number: int) -> DataType:
    try:
        return DataType(number)
    except ValueError:  # a dtype this client has no member for: matches no declared input
        return DataType.DT_INVALID


def _shape(shape: tensor_shape_pb2.TensorShapeProto) -> tuple[int, ...] | None:
    return None if shape.unknown_rank else tuple(dim.size for dim in shape.dim)
