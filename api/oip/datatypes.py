"""OIP tensor datatypes and TensorFlow's `DataType`s, both ways, and their raw bytes.

The Open Inference Protocol names element types `BOOL`, `UINT8`...`UINT64`, `INT8`...`INT64`,
`FP16`, `FP32`, `FP64`, `BYTES` (its REST spec, "Tensor Data Types") and, as Triton and KServe
do, `BF16`; TF Serving names them `DT_*` (types.proto). `DATATYPES` is the one table between
them. Raw bytes are the binary tensor data extension's and `raw_input_contents`' layout:
little-endian, row-major, no padding; BOOL one byte 0 or 1; BYTES each element a 4-byte
little-endian length then its bytes. Pure: no I/O.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

from api.serving_client import DataType

_SWAP: Final = sys.byteorder != "little"
_LENGTH: Final = struct.Struct("<I")


@dataclass(frozen=True, slots=True)
class Datatype:
    """One OIP datatype.

    Attributes:
        name: the OIP name, e.g. "FP32".
        dtype: TensorFlow's `DataType` for it.
        size: bytes per element on the wire; 0 for BYTES (variable).
        typecode: the `array` typecode of the raw elements; "" for FP16, BF16 (16-bit floats
            `array` lacks) and BYTES.
        kind: "bool", "int", "float" or "bytes": what a JSON element must be.
        low / high: the range of an integer type.
    """

    name: str
    dtype: DataType
    size: int
    typecode: str
    kind: str
    low: int = 0
    high: int = 0


def _int(name: str, dtype: DataType, size: int, typecode: str, signed: bool) -> Datatype:
    bits = size * 8
    low, high = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
    return Datatype(name, dtype, size, typecode, "int", low, high)


_ALL: Final = (
    Datatype("BOOL", DataType.DT_BOOL, 1, "B", "bool"),
    _int("UINT8", DataType.DT_UINT8, 1, "B", signed=False),
    _int("UINT16", DataType.DT_UINT16, 2, "H", signed=False),
    _int("UINT32", DataType.DT_UINT32, 4, "I", signed=False),
    _int("UINT64", DataType.DT_UINT64, 8, "Q", signed=False),
    _int("INT8", DataType.DT_INT8, 1, "b", signed=True),
    _int("INT16", DataType.DT_INT16, 2, "h", signed=True),
    _int("INT32", DataType.DT_INT32, 4, "i", signed=True),
    _int("INT64", DataType.DT_INT64, 8, "q", signed=True),
    Datatype("FP16", DataType.DT_HALF, 2, "", "float"),
    Datatype("FP32", DataType.DT_FLOAT, 4, "f", "float"),
    Datatype("FP64", DataType.DT_DOUBLE, 8, "d", "float"),
    Datatype("BYTES", DataType.DT_STRING, 0, "", "bytes"),
    Datatype("BF16", DataType.DT_BFLOAT16, 2, "", "float"),
)
for _datatype in _ALL:  # array's C types must have the wire sizes
    assert not _datatype.typecode or array(_datatype.typecode).itemsize == _datatype.size, _datatype

#: OIP name -> datatype.
DATATYPES: Mapping[str, Datatype] = MappingProxyType({d.name: d for d in _ALL})
#: TensorFlow dtype -> datatype.
BY_DTYPE: Mapping[DataType, Datatype] = MappingProxyType({d.dtype: d for d in _ALL})


@dataclass(frozen=True, slots=True)
class FloatRange:
    """The finite range of a narrow float type (IEEE 754 round to nearest, ties to even).

    Attributes:
        largest: its largest finite value.
        overflow: the least magnitude that rounds to infinity on its way to serving: `largest`
            plus half its last unit (BF16: less half a float32 unit, as the serving client
            rounds to float32 first); anything below rounds to a finite value.
    """

    largest: float
    overflow: float


#: FP32, FP16, BF16 -> their finite range (FP64's is the JSON parser's own).
FLOAT_RANGE: Mapping[str, FloatRange] = MappingProxyType(
    {
        "FP32": FloatRange((2 - 2**-23) * 2.0**127, 2.0**128 - 2.0**103),
        "FP16": FloatRange(65504.0, 65520.0),
        "BF16": FloatRange((2 - 2**-7) * 2.0**127, 2.0**128 - 2.0**119 - 2.0**103),
    }
)


class TensorDataError(ValueError):
    """A tensor's data does not fit its datatype or shape; the message says how (answered 400)."""


def datatype_of(dtype: DataType) -> Datatype | None:
    """The OIP datatype of a TensorFlow dtype; None for one OIP has no name for (complex,
    resource, variant, or a dtype the serving client does not know)."""
    return BY_DTYPE.get(dtype)


def decode_raw(datatype: Datatype, raw: bytes, count: int, name: str) -> Sequence[Any]:
    """The `count` elements of a raw tensor, flat.

    Numbers come as an `array.array` of the wire's C type (FP16/BF16 as a list of floats),
    which the serving client sends on as it is; BOOL as bools, BYTES as a list of bytes.

    Raises:
        TensorDataError: the byte count does not fit `count` elements, a BOOL byte other than
            0 or 1, or a BYTES element whose length runs past the end.
    """
    if datatype.kind == "bytes":
        return _decode_bytes(raw, count, name)
    expected = count * datatype.size
    if len(raw) != expected:
        raise TensorDataError(
            f"input '{name}': {len(raw)} bytes of {datatype.name} data, expected {expected} for {count} elements"
        )
    if not datatype.typecode:  # FP16, BF16
        return _decode_16bit(datatype, raw)
    values = array(datatype.typecode, raw)
    if _SWAP:
        values.byteswap()
    if datatype.kind == "bool":
        if any(v > 1 for v in values):
            raise TensorDataError(f"input '{name}': a BOOL byte other than 0 or 1")
        return [bool(v) for v in values]
    return values


def _decode_bytes(raw: bytes, count: int, name: str) -> list[bytes]:
    out: list[bytes] = []
    view = memoryview(raw)
    offset = 0
    while offset < len(raw):
        if offset + 4 > len(raw):
            raise TensorDataError(f"input '{name}': BYTES data ends inside an element's 4-byte length")
        (length,) = _LENGTH.unpack_from(view, offset)
        offset += 4
        if offset + length > len(raw):
            raise TensorDataError(f"input '{name}': a BYTES element of {length} bytes runs past the data's end")
        out.append(bytes(view[offset : offset + length]))
        offset += length
        if len(out) > count:
            break
    if len(out) != count:
        raise TensorDataError(f"input '{name}': {len(out)} BYTES elements in the data, the shape needs {count}")
    return out


def _decode_16bit(datatype: Datatype, raw: bytes) -> list[float]:
    count = len(raw) // 2
    if datatype.dtype is DataType.DT_HALF:
        return list(struct.unpack(f"<{count}e", raw))
    # A bfloat16 is the top half of a float32: little-endian, its two bytes after two zeros.
    widened = bytearray(4 * count)
    widened[2::4] = raw[0::2]
    widened[3::4] = raw[1::2]
    return list(struct.unpack(f"<{count}f", widened))


def encode_raw(datatype: Datatype, values: Sequence[Any]) -> bytes:
    """The raw bytes of flat `values` (as serving answered them) in `datatype`'s layout.

    Raises:
        TensorDataError: a value does not fit the datatype (serving answered something else
            than its signature says).
    """
    try:
        if datatype.kind == "bytes":
            return b"".join(_LENGTH.pack(len(v)) + v for v in values)
        if datatype.dtype is DataType.DT_HALF:
            return struct.pack(f"<{len(values)}e", *values)
        if datatype.dtype is DataType.DT_BFLOAT16:
            # The values are exact bfloat16s (serving's): the top half of each float32.
            wide = struct.pack(f"<{len(values)}f", *values)
            narrow = bytearray(2 * len(values))
            narrow[0::2] = wide[2::4]
            narrow[1::2] = wide[3::4]
            return bytes(narrow)
        packed = values if isinstance(values, array) and values.typecode == datatype.typecode else None
        if packed is None:
            packed = array(datatype.typecode, values)
        if _SWAP:
            packed = array(packed.typecode, packed)
            packed.byteswap()
        return packed.tobytes()
    except (TypeError, OverflowError, struct.error) as exc:
        raise TensorDataError(f"a value does not fit {datatype.name} ({exc})") from exc


def json_element(datatype: Datatype, value: Any, name: str) -> Any:
    """One JSON element of `datatype` as the serving client takes it (bool, int, float, bytes).

    Integers must be JSON integers within the datatype's range; FP32, FP16 and BF16 any JSON
    number that does not round to infinity in that type (`FLOAT_RANGE`), FP64 any JSON number
    (the JSON parser already refuses one beyond a double and the `NaN` / `Infinity` tokens,
    which are not JSON); BOOL `true`/`false`; BYTES a string, sent as its UTF-8 bytes.

    Raises:
        TensorDataError: an element of another JSON type, or out of the datatype's range
            (the message gives the range).
    """
    kind = datatype.kind
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TensorDataError(f"input '{name}': {datatype.name} data must be numbers, got {_shown(value)}")
        bound = FLOAT_RANGE.get(datatype.name)
        if bound is not None and abs(value) >= bound.overflow:
            # Sent on, TensorFlow would round it to inf: a value the client did not send.
            raise TensorDataError(
                f"input '{name}': {_shown(value)} is out of {datatype.name}'s range "
                f"[-{bound.largest:.8g}, {bound.largest:.8g}]"
            )
        return float(value)
    if kind == "int":
        integral = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
        if isinstance(value, bool) or not integral:
            raise TensorDataError(f"input '{name}': {datatype.name} data must be integers, got {_shown(value)}")
        # A JSON integer beyond 64 bits reaches here as a float (the parser's): out of range
        # too, which is what the client needs to hear, not that it is not an integer.
        if not datatype.low <= value <= datatype.high:
            raise TensorDataError(
                f"input '{name}': {_shown(value)} is out of {datatype.name}'s range [{datatype.low}, {datatype.high}]"
            )
        if isinstance(value, float):
            raise TensorDataError(f"input '{name}': {datatype.name} data must be integers, got {_shown(value)}")
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            raise TensorDataError(f"input '{name}': BOOL data must be true or false, got {_shown(value)}")
        return value
    if not isinstance(value, str):
        raise TensorDataError(f"input '{name}': BYTES data must be strings, got {_shown(value)}")
    return value.encode("utf-8", "surrogatepass")


def json_output(datatype: Datatype, values: Sequence[Any], name: str) -> list[Any]:
    """Flat output values as JSON elements: numbers and bools as they are, BYTES as UTF-8 text.

    Raises:
        TensorDataError: a BYTES element that is not UTF-8 (JSON cannot carry it: ask for the
            output as binary data).
    """
    if datatype.kind != "bytes":
        return values.tolist() if isinstance(values, array) else list(values)
    try:
        return [v.decode("utf-8") for v in values]
    except UnicodeDecodeError:
        raise TensorDataError(
            f"output '{name}' holds bytes that are not UTF-8, which JSON cannot carry: ask for it as "
            'binary data (output parameter "binary_data": true)'
        ) from None


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"
