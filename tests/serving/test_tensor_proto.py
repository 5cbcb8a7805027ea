"""serving.util.tensor_proto against TensorFlow's own codec (tf.make_tensor_proto / tf.make_ndarray)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import types_pb2
from tensorflow.core.framework.tensor_pb2 import TensorProto

from serving.util.tensor_proto import TensorProtoError, data_type_name, from_ndarray, to_ndarray

NUMERIC = [
    np.float32,
    np.float64,
    np.int32,
    np.uint8,
    np.int16,
    np.int8,
    np.uint16,
    np.int64,
    np.uint32,
    np.uint64,
    np.float16,
    np.complex64,
    np.complex128,
]


def _sample(dtype: type) -> np.ndarray:
    values = np.arange(-3, 9).reshape(3, 4)
    if np.issubdtype(dtype, np.unsignedinteger):
        values = values + 3
    if np.issubdtype(dtype, np.complexfloating):
        return (values + 0.5j * values).astype(dtype)
    return values.astype(dtype)


@pytest.mark.parametrize("dtype", NUMERIC + [np.bool_])
def test_reads_what_tensorflow_writes(dtype: type) -> None:
    array = _sample(dtype) if dtype is not np.bool_ else np.array([[True, False, True]])
    proto = tf.make_tensor_proto(array)
    decoded = to_ndarray(proto)
    assert decoded.dtype == array.dtype
    np.testing.assert_array_equal(decoded, array)


@pytest.mark.parametrize("dtype", NUMERIC + [np.bool_])
@pytest.mark.parametrize("as_content", [False, True])
def test_tensorflow_reads_what_we_write(dtype: type, as_content: bool) -> None:
    array = _sample(dtype) if dtype is not np.bool_ else np.array([[True, False, True]])
    proto = TensorProto()
    from_ndarray(array, proto, as_content=as_content)
    assert bool(proto.tensor_content) is as_content
    decoded = tf.make_ndarray(proto)
    assert decoded.dtype == array.dtype
    np.testing.assert_array_equal(decoded, array)
    np.testing.assert_array_equal(to_ndarray(proto), array)


def test_typed_fields_are_the_default_output_form() -> None:
    # TF Serving's kAsProtoField: clients read outputs["y"].float_val.
    proto = TensorProto()
    from_ndarray(np.array([[2.5], [3.0]], np.float32), proto)
    assert proto.dtype == types_pb2.DT_FLOAT
    assert [d.size for d in proto.tensor_shape.dim] == [2, 1]
    assert list(proto.float_val) == [2.5, 3.0]
    assert proto.tensor_content == b""


@pytest.mark.parametrize(
    "array",
    [
        np.array([[0.0, -0.0], [np.nan, np.inf], [-np.inf, 1e-45]], np.float32),
        np.array([1e308, -5e-324, np.nan], np.float64),
        np.array([[True, False, True]]),
        np.zeros((0, 3), np.float32),
        np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3)),
    ],
)
def test_typed_float_double_and_bool_fields_are_written_as_protobuf_writes_them(array: np.ndarray) -> None:
    # They are merged from their packed wire form in one parse: the same message as extending the
    # field value by value, field by field.
    proto = TensorProto()
    from_ndarray(array, proto)
    expected = TensorProto(dtype=proto.dtype)
    for size in array.shape:
        expected.tensor_shape.dim.add(size=size)
    field = {np.float32: "float_val", np.float64: "double_val", np.bool_: "bool_val"}[array.dtype.type]
    getattr(expected, field).extend(array.ravel().tolist())
    assert proto.SerializeToString() == expected.SerializeToString()
    assert len(getattr(proto, field)) == array.size


def test_bfloat16_both_ways() -> None:
    array = np.array([1.0, -2.5, 0.125], dtype=ml_dtypes.bfloat16)
    for as_content in (False, True):
        proto = TensorProto()
        from_ndarray(array, proto, as_content=as_content)
        assert proto.dtype == types_pb2.DT_BFLOAT16
        np.testing.assert_array_equal(to_ndarray(proto), array)
        np.testing.assert_array_equal(tf.make_ndarray(proto), array)


def test_strings() -> None:
    array = np.array([[b"a", b"\xff\x00"], [b"", b"longer"]], dtype=object)
    proto = TensorProto()
    from_ndarray(array, proto, as_content=True)  # strings always use string_val
    assert list(proto.string_val) == [b"a", b"\xff\x00", b"", b"longer"]
    np.testing.assert_array_equal(tf.make_ndarray(proto), array)
    decoded = to_ndarray(tf.make_tensor_proto(array))
    assert decoded.dtype == object
    assert decoded.tolist() == array.tolist()


def test_typed_field_fill_rules_are_tensorflows() -> None:
    # Tensor::FromProto: none -> zeros, short -> last value repeated, long -> truncated.
    proto = TensorProto(dtype=types_pb2.DT_INT32)
    proto.tensor_shape.dim.add().size = 4
    np.testing.assert_array_equal(to_ndarray(proto), [0, 0, 0, 0])
    proto.int_val.extend([7, 8])
    np.testing.assert_array_equal(to_ndarray(proto), [7, 8, 8, 8])
    proto.int_val.extend([9, 10, 11])
    np.testing.assert_array_equal(to_ndarray(proto), [7, 8, 9, 10])
    strings = TensorProto(dtype=types_pb2.DT_STRING)
    strings.tensor_shape.dim.add().size = 3
    assert to_ndarray(strings).tolist() == [b"", b"", b""]
    strings.string_val.append(b"x")
    assert to_ndarray(strings).tolist() == [b"x", b"x", b"x"]


def test_scalar_and_empty_shapes() -> None:
    scalar = to_ndarray(tf.make_tensor_proto(np.float32(1.5)))
    assert scalar.shape == () and scalar == 1.5
    empty = to_ndarray(tf.make_tensor_proto(np.zeros((0, 3), np.float32)))
    assert empty.shape == (0, 3)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda p: setattr(p, "tensor_content", b"\x00" * 5),  # not a multiple of 4 x elements
        lambda p: p.tensor_shape.dim.add().__setattr__("size", -1),
        lambda p: setattr(p.tensor_shape, "unknown_rank", True),
        lambda p: setattr(p, "dtype", types_pb2.DT_RESOURCE),
        lambda p: setattr(p, "dtype", 1234),
    ],
)
def test_unparsable_tensors(mutate: object) -> None:
    proto = tf.make_tensor_proto(np.ones((2, 2), np.float32))
    mutate(proto)  # type: ignore[operator]
    with pytest.raises(TensorProtoError):
        to_ndarray(proto)


def test_data_type_names() -> None:
    assert data_type_name(np.dtype(np.float32)) == "DT_FLOAT"
    assert data_type_name(np.dtype(">f4")) == "DT_FLOAT"
    assert data_type_name(np.dtype(object)) == "DT_STRING"
    assert data_type_name(np.dtype(ml_dtypes.bfloat16)) == "DT_BFLOAT16"
    assert data_type_name(np.dtype("datetime64[s]")) == "DT_INVALID"
    with pytest.raises(TensorProtoError):
        from_ndarray(np.zeros(2, "datetime64[s]"), TensorProto())


def test_decoding_is_vectorised_over_tensor_content() -> None:
    """A large tensor decodes as one view of the bytes, not element by element."""
    array = np.random.default_rng(0).random((1000, 256)).astype(np.float32)
    proto = tf.make_tensor_proto(array)
    decoded = to_ndarray(proto)
    np.testing.assert_array_equal(decoded, array)
    assert decoded.base is not None  # a view over the proto's bytes, no per-element copy


@pytest.mark.parametrize(
    ("shape", "match"),
    [
        ([1] * 65, "65 dimensions"),
        ([2**31, 2**31], "cannot allocate"),  # beyond what numpy can address
    ],
)
def test_tensors_numpy_cannot_hold_are_parse_errors(shape: list[int], match: str) -> None:
    proto = TensorProto(dtype=types_pb2.DT_FLOAT, float_val=[1.0])
    for size in shape:
        proto.tensor_shape.dim.add().size = size
    with pytest.raises(TensorProtoError, match=match):
        to_ndarray(proto)
