"""Unit tests for serving.util.json_tensor (pure: no TensorFlow). Messages are TF Serving's."""

from __future__ import annotations

import json
import math
import time
from typing import Any

import numpy as np
import pytest

from serving.util import json_tensor
from serving.util.errors import Code, ServingError
from serving.util.json_tensor import JsonFormat, decode_predict_inputs, encode_predict_outputs

X_FLOAT = {"x": "DT_FLOAT"}
AB = {"a": "DT_FLOAT", "b": "DT_FLOAT"}


def decode(doc: dict[str, Any], dtypes: dict[str, str] = X_FLOAT) -> dict[str, np.ndarray]:
    return decode_predict_inputs(doc, dtypes)[1]


def error_of(doc: dict[str, Any], dtypes: dict[str, str] = X_FLOAT) -> ServingError:
    with pytest.raises(ServingError) as info:
        decode_predict_inputs(doc, dtypes)
    return info.value


def message(doc: dict[str, Any], dtypes: dict[str, str] = X_FLOAT) -> str:
    error = error_of(doc, dtypes)
    assert error.code is Code.INVALID_ARGUMENT
    return error.message


def parse_error(body: bytes) -> str:
    with pytest.raises(ServingError) as info:
        json_tensor.parse_json(body)
    assert info.value.code is Code.INVALID_ARGUMENT
    return info.value.message


# ---- parse_json ----------------------------------------------------------------------------


def test_parse_object() -> None:
    assert json_tensor.parse_json(b'{"instances": [1, 2.5]}') == {"instances": [1, 2.5]}


def test_parse_nan_and_infinity_tokens() -> None:
    doc = json_tensor.parse_json(b'{"inputs": [NaN, Infinity, -Infinity, 1]}')
    values = doc["inputs"]
    assert math.isnan(values[0]) and values[1] == math.inf and values[2] == -math.inf


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"", "JSON Parse error: The document is empty"),
        (b"   ", "JSON Parse error: The document is empty. at offset: 3"),
        (b"nul", "JSON Parse error: Invalid value. at offset: 0"),
        (b"{", "JSON Parse error: Missing a name for object member. at offset: 1"),
        (
            b'{"a" 1}',
            "JSON Parse error: Missing a colon after a name of object member. at offset: 5",
        ),
        (
            b'{"a": [1, 2}',
            "JSON Parse error: Missing a comma or ']' after an array element. at offset: 11",
        ),
        (
            b'{"a": 1 "b": 2}',
            "JSON Parse error: Missing a comma or '}' after an object member. at offset: 8",
        ),
        (b'{"a": "x', "JSON Parse error: Missing a closing quotation mark in string. at offset: 6"),
        (b'{"a": "\\q"}', "JSON Parse error: Invalid escape character in string. at offset: 7"),
    ],
)
def test_parse_errors(body: bytes, expected: str) -> None:
    assert parse_error(body) == expected


def test_parse_non_object() -> None:
    assert parse_error(b"[1, 2]") == "JSON Value: [1, 2] Is not object"
    assert parse_error(b"1.5") == "JSON Value: 1.5 Is not object"


def test_parse_invalid_utf8_is_kept_as_bytes() -> None:
    doc = json_tensor.parse_json(b'{"inputs": ["\xff\xfe"]}')
    tensors = decode(doc, {"s": "DT_STRING"})
    assert tensors["s"].tolist() == [b"\xff\xfe"]


def test_signature_name() -> None:
    assert json_tensor.signature_name({"instances": []}) == ""
    assert json_tensor.signature_name({"signature_name": "sig"}) == "sig"
    with pytest.raises(ServingError) as info:
        json_tensor.signature_name({"signature_name": 1})
    assert info.value.message == (
        'JSON Value: {\n    "signature_name": 1\n} not formatted correctly. '
        "'signature_name' key must be a string value."
    )


# ---- row format ------------------------------------------------------------------------------


def test_row_scalars_stack_into_batch() -> None:
    fmt, tensors = decode_predict_inputs({"instances": [1.0, 2, 5.0]}, X_FLOAT)
    assert fmt is JsonFormat.ROW
    assert tensors["x"].dtype == np.float32
    np.testing.assert_array_equal(tensors["x"], np.array([1.0, 2.0, 5.0], np.float32))


def test_row_lists_stack_into_batch() -> None:
    tensors = decode({"instances": [[1, 2], [3, 4], [5, 6]]})
    assert tensors["x"].shape == (3, 2)


def test_row_named_inputs() -> None:
    tensors = decode({"instances": [{"a": 1.0, "b": [2.0]}, {"a": 3.0, "b": [4.0]}]}, AB)
    np.testing.assert_array_equal(tensors["a"], [1.0, 3.0])
    np.testing.assert_array_equal(tensors["b"], [[2.0], [4.0]])


def test_row_ragged_elements() -> None:
    assert message({"instances": [[1, 2], [3]]}) == (
        "Failed to process element: 1 of 'instances' list. Error: INVALID_ARGUMENT: "
        "Expecting tensor size: 2 but got: 1"
    )


def test_row_ragged_inside_element() -> None:
    assert message({"instances": [[[1, 2], [3]]]}) == (
        "Failed to process element: 0 of 'instances' list. Error: INVALID_ARGUMENT: "
        "Encountered list at unexpected size: 1 at level: 1 expected size: 2"
    )


def test_row_same_size_other_shape() -> None:
    assert message({"instances": [[1, 2, 3, 4], [[1, 2], [3, 4]]]}) == (
        "Failed to process element: 1 of 'instances' list. Error: INVALID_ARGUMENT: "
        "Expecting shape [4] but got: [2,2]"
    )


def test_row_wrong_type_names_element_and_key() -> None:
    assert message({"instances": [{"a": 1.0, "b": "x"}]}, AB) == (
        "Failed to process element: 0 key: b of 'instances' list. Error: INVALID_ARGUMENT: "
        'JSON Value: "x" Type: String is not of expected type: float'
    )


def test_row_missing_key() -> None:
    assert message({"instances": [{"a": 1.0}]}, AB) == (
        "Failed to process element: 0 of 'instances' list. JSON object: {\n    \"a\": 1.0\n} "
        "keys must be equal to: a,b"
    )


def test_row_extra_key() -> None:
    assert message({"instances": [{"a": 1, "b": 2, "c": 3}]}, AB) == (
        "Failed to process element: 0 key: c of 'instances' list. Error: INVALID_ARGUMENT: "
        "JSON object: does not have named input: c"
    )


def test_row_plain_list_for_several_inputs() -> None:
    assert message({"instances": [1.0, 2.0]}, AB) == (
        "instances is a plain list, but expecting list of objects as multiple input tensors "
        "required as per tensorinfo_map"
    )


def test_row_object_then_list() -> None:
    assert message({"instances": [{"a": 1, "b": 2}, [1]]}, AB) == (
        "Expecting object but got list at item 1 of input list"
    )


def test_row_value_then_object() -> None:
    assert message({"instances": [1.0, {"x": 1.0}]}) == (
        "Expecting value/list but got object at item 1 of input list"
    )


def test_row_empty_instances() -> None:
    assert message({"instances": []}) == (
        "JSON Value: {\n    \"instances\": []\n} No values in 'instances' array"
    )


def test_row_instances_not_a_list() -> None:
    assert message({"instances": 1}) == (
        "JSON Value: {\n    \"instances\": 1\n} Expecting 'instances' to be an list/array"
    )


def test_both_keys() -> None:
    assert message({"instances": [1], "inputs": [1]}) == (
        'JSON Value: {\n    "instances": [1],\n    "inputs": [1]\n} '
        "Not formatted correctly expecting only one of 'inputs' or 'instances' keys to exist "
    )


def test_neither_key() -> None:
    assert message({"foo": 1}) == "Missing 'inputs' or 'instances' key"


def test_empty_input_map() -> None:
    assert message({"inputs": [1]}, {}) == "Failed to get input map for signature: DEFAULT"
    with pytest.raises(ServingError, match="signature: sig$"):
        decode_predict_inputs({"inputs": [1]}, {}, "sig")


# ---- columnar format ---------------------------------------------------------------------------


def test_columnar_single_value() -> None:
    fmt, tensors = decode_predict_inputs({"inputs": [[1, 2], [3, 4]]}, X_FLOAT)
    assert fmt is JsonFormat.COLUMNAR
    assert tensors["x"].shape == (2, 2)


def test_columnar_scalar() -> None:
    tensors = decode({"inputs": 2.5})
    assert tensors["x"].shape == () and tensors["x"] == np.float32(2.5)


def test_columnar_named_inputs_may_differ_in_batch_and_ignore_extras() -> None:
    tensors = decode({"inputs": {"a": [1, 2, 3], "b": [4], "ignored": "x"}}, AB)
    assert tensors["a"].shape == (3,) and tensors["b"].shape == (1,)
    assert set(tensors) == {"a", "b"}


def test_columnar_missing_named_input() -> None:
    assert message({"inputs": {"a": [1]}}, AB) == "Missing named input: b in 'inputs' object."


def test_columnar_plain_value_for_several_inputs() -> None:
    assert message({"inputs": [1]}, AB) == (
        "inputs is a plain value/list, but expecting an object as multiple input tensors "
        "required as per tensorinfo_map"
    )


def test_columnar_empty_list_is_an_empty_tensor() -> None:
    assert decode({"inputs": []})["x"].shape == (0,)
    assert decode({"inputs": [[], []]})["x"].shape == (2, 0)


def test_ragged_columnar() -> None:
    assert message({"inputs": [[1, 2], [3]]}) == (
        "Encountered list at unexpected size: 1 at level: 1 expected size: 2"
    )


def test_list_too_deep() -> None:
    assert (
        message({"inputs": [[1], [[2]]]}) == "Encountered list at unexpected level: 2 expected < 2"
    )


def test_value_too_shallow() -> None:
    # Levels are 0-based as in the list messages above (TF Serving prints level + 1 here, which
    # made this "found at incorrect level: 2 ... Expected at level: 2").
    assert message({"inputs": [[1], 2]}) == (
        "JSON Value: 2 found at incorrect level: 1 in the JSON DOM. Expected at level: 2"
    )
    assert message({"inputs": [[[1]], [2]]}) == (
        "JSON Value: 2 found at incorrect level: 2 in the JSON DOM. Expected at level: 3"
    )
    assert message({"instances": [[[1], 2]]}) == (
        "Failed to process element: 0 of 'instances' list. Error: INVALID_ARGUMENT: "
        "JSON Value: 2 found at incorrect level: 1 in the JSON DOM. Expected at level: 2"
    )


# ---- value types ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "dtype", "expected"),
    [
        ("a", "DT_FLOAT", 'JSON Value: "a" Type: String is not of expected type: float'),
        (True, "DT_FLOAT", "JSON Value: true Type: True is not of expected type: float"),
        (None, "DT_DOUBLE", "JSON Value: null Type: Null is not of expected type: double"),
        (
            {"a": 1},
            "DT_FLOAT",
            'JSON Value: {\n    "a": 1\n} Type: Object is not of expected type: float',
        ),
        (1.5, "DT_INT32", "JSON Value: 1.5 Type: Number is not of expected type: int32"),
        (1.0, "DT_INT64", "JSON Value: 1.0 Type: Number is not of expected type: int64"),
        (2**31, "DT_INT32", "JSON Value: 2147483648 Type: Number is not of expected type: int32"),
        (-1, "DT_UINT32", "JSON Value: -1 Type: Number is not of expected type: uint32"),
        (
            2**63,
            "DT_INT64",
            "JSON Value: 9223372036854775808 Type: Number is not of expected type: int64",
        ),
        (1, "DT_BOOL", "JSON Value: 1 Type: Number is not of expected type: bool"),
        (False, "DT_STRING", "JSON Value: false Type: False is not of expected type: string"),
        (0.1, "DT_STRING", "JSON Value: 0.1 Type: Number is not of expected type: string"),
        (
            {"b64": 1},
            "DT_STRING",
            'JSON Value: {\n    "b64": 1\n} not formatted correctly for base64 data',
        ),
        ({"b64": "!!!"}, "DT_STRING", "Unable to base64 decode"),
    ],
)
def test_value_errors(value: Any, dtype: str, expected: str) -> None:
    assert message({"inputs": [value, value]}, {"x": dtype}) == expected


def test_unsupported_input_dtype_is_unimplemented() -> None:
    error = error_of({"inputs": [1.0]}, {"x": "DT_HALF"})
    assert error.code is Code.UNIMPLEMENTED
    assert error.message == "Conversion of JSON Value: 1.0 to type: half"


@pytest.mark.parametrize(
    ("dtype", "values", "expected"),
    [
        ("DT_FLOAT", [1, 2**24 - 1, -0.5], np.array([1, 2**24 - 1, -0.5], np.float32)),
        ("DT_DOUBLE", [2**53 - 1, 0.1], np.array([2**53 - 1, 0.1], np.float64)),
        ("DT_INT32", [-(2**31), 2**31 - 1], np.array([-(2**31), 2**31 - 1], np.int32)),
        ("DT_INT8", [300, -1], np.array([44, -1], np.int8)),  # C++ static_cast wraps
        ("DT_UINT8", [255, 256], np.array([255, 0], np.uint8)),
        ("DT_INT64", [-(2**63), 2**63 - 1], np.array([-(2**63), 2**63 - 1], np.int64)),
        ("DT_UINT32", [0, 2**32 - 1], np.array([0, 2**32 - 1], np.uint32)),
        ("DT_UINT64", [2**64 - 1], np.array([2**64 - 1], np.uint64)),
        ("DT_BOOL", [True, False], np.array([True, False])),
    ],
)
def test_value_conversions(dtype: str, values: list[Any], expected: np.ndarray) -> None:
    tensor = decode({"inputs": values}, {"x": dtype})["x"]
    assert tensor.dtype == expected.dtype
    np.testing.assert_array_equal(tensor, expected)


def test_float_tensor_with_precision_loss() -> None:
    # json_tensor_test.cc FloatTensorWithPrecisionLoss: 1435774380 and 1435774380.0 are both
    # accepted for a float input, rounded the same (no lossless check since TF Serving 2.5).
    for body in (b'{"instances": [1435774380]}', b'{"instances": [1435774380.0]}'):
        assert decode(json_tensor.parse_json(body))["x"].tolist() == [np.float32(1435774380)]
    assert decode({"inputs": [2**24 + 1, 16777217.0]})["x"].tolist() == [16777216.0, 16777216.0]
    # Doubles round too (MixedInputForDoubleTensor takes ints and decimals alike).
    assert decode({"inputs": [2**53 + 1, 0]}, {"x": "DT_DOUBLE"})["x"].tolist() == [2.0**53, 0.0]


@pytest.mark.parametrize("path", ["fast", "reference"])
def test_float_tensor_beyond_float_range(path: str) -> None:
    # FloatTensorThatExceedsMaxReturnsInf / FloatTensorThatExceedsMinReturnsZero: DBL_MAX is
    # +inf as a float, DBL_MIN (the smallest normal double) is 0; signs kept.
    values: list[Any] = [1.7976931348623157e308, -1.7976931348623157e308, 2.2250738585072014e-308]
    values.append(-2.2250738585072014e-308)
    if path == "reference":  # a ragged sibling sends decoding down the element-by-element path
        with pytest.raises(ServingError):
            decode({"inputs": [values, [1]]})
        array = json_tensor._slow_tensor(values, "DT_FLOAT")[0]
    else:
        array = decode({"inputs": values})["x"]
    assert array.dtype == np.float32
    assert array.tolist() == [math.inf, -math.inf, 0.0, -0.0]
    assert math.copysign(1.0, array[3]) < 0


def test_non_finite_floats() -> None:
    doc = json_tensor.parse_json(b'{"instances": [NaN, Infinity, -Infinity]}')
    tensor = decode(doc)["x"]
    assert math.isnan(tensor[0]) and tensor[1] == np.inf and tensor[2] == -np.inf


def test_strings_and_b64() -> None:
    tensors = decode(
        {"instances": ["a", "é", {"b64": "aGVsbG8="}, {"b64": "aGVsbG8"}]}, {"s": "DT_STRING"}
    )
    assert tensors["s"].dtype == object
    assert tensors["s"].tolist() == [b"a", "é".encode(), b"hello", b"hello"]


def test_b64_object_in_named_row() -> None:
    tensors = decode(
        {"instances": [{"s": {"b64": "AAE="}, "n": 1}]}, {"s": "DT_STRING", "n": "DT_INT64"}
    )
    assert tensors["s"].tolist() == [b"\x00\x01"]
    assert tensors["n"].tolist() == [1]


@pytest.mark.parametrize(
    "value",
    [[[1, 2], [3, 4]], [[[1.5]], [[2.5]]], [1, 2.5, 3], [], [[]], 7, [[1, 2]] * 50],
)
def test_fast_and_reference_paths_agree(value: Any) -> None:
    fast = json_tensor._fast_tensor(value, "DT_FLOAT")
    slow, shape, _ = json_tensor._slow_tensor(value, "DT_FLOAT")
    assert fast is not None
    assert fast.dtype == slow.dtype and list(fast.shape) == shape
    np.testing.assert_array_equal(fast, slow)


# ---- encode_predict_outputs ----------------------------------------------------------------


def encode(outputs: dict[str, np.ndarray], fmt: JsonFormat = JsonFormat.ROW) -> Any:
    return json.loads(encode_predict_outputs(outputs, fmt))


def test_row_single_output_is_a_list() -> None:
    body = encode_predict_outputs({"y": np.array([2.5, 3.0, 4.5], np.float32)}, JsonFormat.ROW)
    assert body == b'{"predictions":[2.5,3.0,4.5]}'


def test_row_several_outputs_are_objects() -> None:
    outputs = {"b": np.array([[1], [2]], np.int64), "a": np.array([0.5, 1.5], np.float32)}
    assert encode(outputs) == {"predictions": [{"a": 0.5, "b": [1]}, {"a": 1.5, "b": [2]}]}


def test_columnar_single_and_several() -> None:
    assert encode({"y": np.array([1.0, 2.0], np.float32)}, JsonFormat.COLUMNAR) == {
        "outputs": [1.0, 2.0]
    }
    outputs = {"a": np.array([1], np.int32), "b": np.array([[True]])}
    assert encode(outputs, JsonFormat.COLUMNAR) == {"outputs": {"a": [1], "b": [[True]]}}


def test_columnar_scalar_output() -> None:
    body = encode_predict_outputs({"y": np.array(2.5, np.float32)}, JsonFormat.COLUMNAR)
    assert body == b'{"outputs":2.5}'


def test_float32_written_shortest_and_round_trips() -> None:
    values = np.array([0.1, 1 / 3, 1e-5, 3.4e38, 16777216.0, -0.0], np.float32)
    body = encode_predict_outputs({"y": values}, JsonFormat.COLUMNAR)
    assert body.startswith(b'{"outputs":[0.1,')
    parsed = np.array(json.loads(body)["outputs"], np.float32)
    np.testing.assert_array_equal(parsed, values)


def test_float64_round_trips() -> None:
    values = np.array([0.1, 1 / 3, 2**-1074], np.float64)
    parsed = encode({"y": values}, JsonFormat.COLUMNAR)["outputs"]
    assert parsed == values.tolist()


def test_non_finite_outputs_are_bare_tokens() -> None:
    values = np.array([[np.nan, np.inf], [-np.inf, 0.1]], np.float32)
    body = encode_predict_outputs({"y": values}, JsonFormat.ROW)
    assert body == b'{"predictions":[[NaN,Infinity],[-Infinity,0.1]]}'
    multi = {"y": values, "z": np.array([1, 2], np.int8)}
    body = encode_predict_outputs(multi, JsonFormat.ROW)
    assert body == b'{"predictions":[{"y":[NaN,Infinity],"z":1},{"y":[-Infinity,0.1],"z":2}]}'


def test_half_is_written_as_float() -> None:
    assert encode({"y": np.array([0.5], np.float16)}) == {"predictions": [0.5]}


def test_int_widths_and_bools() -> None:
    outputs = {
        "i8": np.array([-128], np.int8),
        "u8": np.array([255], np.uint8),
        "i64": np.array([-(2**63)], np.int64),
        "u64": np.array([2**64 - 1], np.uint64),
        "b": np.array([True]),
    }
    assert encode(outputs, JsonFormat.COLUMNAR)["outputs"] == {
        "b": [True], "i64": [-(2**63)], "i8": [-128], "u64": [2**64 - 1], "u8": [255]
    }  # fmt: skip


def test_string_outputs_text_and_bytes_suffix() -> None:
    strings = np.array([b"caf\xc3\xa9", b"\x00\xff"], dtype=object)
    outputs = {"out": strings, "out_bytes": strings}
    assert encode(outputs) == {
        "predictions": [
            {"out": "café", "out_bytes": {"b64": "Y2Fmw6k="}},
            {"out": "\x00\ufffd", "out_bytes": {"b64": "AP8="}},
        ]
    }


def test_row_output_errors() -> None:
    with pytest.raises(ServingError, match="^Tensor name: y has no shape information $"):
        encode_predict_outputs({"y": np.array(1.0, np.float32)}, JsonFormat.ROW)
    with pytest.raises(
        ServingError, match="^Tensor name: b has inconsistent batch size: 3 expecting: 2$"
    ):
        encode_predict_outputs(
            {"a": np.zeros(2, np.float32), "b": np.zeros(3, np.float32)}, JsonFormat.ROW
        )
    with pytest.raises(ServingError, match="^Cannot convert empty tensor map to JSON$"):
        encode_predict_outputs({}, JsonFormat.ROW)


def test_unsupported_output_dtype() -> None:
    with pytest.raises(
        ServingError, match="^Failed to write JSON value for tensor type: complex64$"
    ) as info:
        encode_predict_outputs({"y": np.zeros(1, np.complex64)}, JsonFormat.ROW)
    assert info.value.code is Code.INVALID_ARGUMENT


# ---- rendering values in messages ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        # JsonValueToDebugString: rapidjson's PrettyWriter with kFormatSingleLineArray, doubles
        # by Writer::Double (shortest digits), as json_tensor.cc renders values in messages
        # since TF Serving's 2024 "Improve handling of large JSON requests".
        (0.1, "0.1"),
        (1.0, "1.0"),
        (1.23456789, "1.23456789"),
        (1e-5, "0.00001"),
        (9000000.0, "9000000.0"),
        (1e300, "1e300"),
        ("é\n\x01", '"é\\n\\u0001"'),
        ([1e-7, 1e21, 123.0, 0.001, -2.5e-10], "[1e-7, 1e21, 123.0, 0.001, -2.5e-10]"),
        ({}, "{}"),
        ({"a": [[]], "b": {"c": 1}}, '{\n    "a": [[]],\n    "b": {\n        "c": 1\n    }\n}'),
        ([{"a": 1}], '[{\n        "a": 1\n    }]'),
        # rapidjson's writer refuses non-finite doubles (no kWriteNanAndInfFlag): the text stops.
        (float("nan"), ""),
        ([1, float("-inf"), 2], "[1, "),
    ],
)
def test_json_value_to_string(value: Any, expected: str) -> None:
    assert json_tensor._json_value_to_string(value) == expected


def test_json_value_to_string_is_cut_at_256_bytes() -> None:
    # JsonWriterWithLimit (kMaxJsonDebugStringBytes = 256): whole tokens until 256 bytes.
    text = json_tensor._json_value_to_string(list(range(1000)))
    assert text.startswith("[0, 1, 2, ") and not text.endswith("]")
    assert 256 <= len(text) < 256 + 8
    deep = json_tensor._json_value_to_string(json_tensor.parse_json(b'{"a":' + b"[" * 5000 + b"]" * 5000 + b"}"))
    assert deep == '{\n    "a": ' + "[" * (256 - len('{\n    "a": '))


@pytest.mark.parametrize("depth", [65, 300])
def test_too_many_dimensions_is_invalid_argument(depth: int) -> None:
    doc = json_tensor.parse_json(b'{"instances":' + b"[" * depth + b"1" + b"]" * depth + b"}")
    with pytest.raises(ServingError, match=f"Too many dimensions in tensor: {depth}") as caught:
        decode_predict_inputs(doc, {"x": "DT_FLOAT"})
    assert caught.value.code is Code.INVALID_ARGUMENT


def test_deeply_nested_unknown_key_is_ignored() -> None:
    # json_tensor_test.cc DeeplyNestedWellFormed: rapidjson parses iteratively, so 500,000
    # levels under a key nobody reads are accepted.
    body = b'{"instances":[1], "nested":' + b"[" * 500_000 + b"]" * 500_000 + b"}"
    doc = json_tensor.parse_json(body)
    assert decode_predict_inputs(doc, {"default": "DT_INT32"})[1]["default"].tolist() == [1]


def test_deeply_nested_signature_name_is_refused_with_a_short_message() -> None:
    # json_tensor_test.cc DeeplyNestedMalformed: the document is rendered, cut at 256 bytes.
    body = b'{"signature_name":' + b"[" * 500_000 + b"]" * 500_000 + b"}"
    with pytest.raises(ServingError, match="key must be a string value") as caught:
        json_tensor.signature_name(json_tensor.parse_json(body))
    assert caught.value.code is Code.INVALID_ARGUMENT
    assert len(caught.value.message) < 400


def test_deeply_nested_instances_are_too_many_dimensions() -> None:
    body = b'{"instances":' + b"[" * 100_000 + b"1" + b"]" * 100_000 + b"}"
    with pytest.raises(ServingError, match="Too many dimensions in tensor: 100000;"):
        decode_predict_inputs(json_tensor.parse_json(body), {"x": "DT_FLOAT"})


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            b'{"a":' + b"[" * 3000 + b"1" + b"]" * 3000 + b"x}",
            "Missing a comma or '}' after an object member. at offset: 6006",
        ),
        (b"[" * 3000 + b"1,]" + b"]" * 2999, "Invalid value. at offset: 3002"),
        (b'{"a":' + b"[" * 3000 + b"}", "Invalid value. at offset: 3005"),
        (b'{"a":' + b"[" * 3000 + b'"x\\q"]', "Invalid escape character in string. at offset: 3007"),
        (b'{"a":' + b"[" * 3000 + b"1e999", "Number too big to be stored in double. at offset: 3005"),
        (b'{"a":' + b"[" * 3000 + b"1", "Missing a comma or ']' after an array element. at offset: 3006"),
    ],
)
def test_deep_documents_get_rapidjson_errors(body: bytes, expected: str) -> None:
    assert parse_error(body) == f"JSON Parse error: {expected}"


def test_deep_parse_work_is_linear() -> None:
    # Bound the work, not the answer: 4 MB of brackets parse in well under a second.
    depth = 2_000_000
    body = b'{"instances":[1], "nested":' + b"[" * depth + b"]" * depth + b"}"
    started = time.monotonic()
    json_tensor.parse_json(body)
    assert time.monotonic() - started < 5.0


@pytest.mark.parametrize(
    ("body", "value"),
    [
        # rapidjson's kParseStopWhenDoneFlag: nothing after the top-level value is read.
        (b'{"a": 1} x', {"a": 1}),
        (b'{"a": 1}}}', {"a": 1}),
        # Integers past 64 bits are doubles (rapidjson's kNumberDoubleFlag).
        (b'{"a": 18446744073709551616}', {"a": 1.8446744073709552e19}),
        (b'{"a": -9223372036854775809, "b": NaN}', {"a": -9.223372036854776e18, "b": math.nan}),
        # Decimals too small for a double are 0 (FloatTensorThatExceedsMinReturnsZero's input).
        (b'{"a": 1e-400}', {"a": 0.0}),
    ],
)
def test_parse_like_rapidjson(body: bytes, value: dict[str, Any]) -> None:
    parsed = json_tensor.parse_json(body)
    assert parsed.keys() == value.keys()
    for key, expected in value.items():
        assert parsed[key] == expected or (math.isnan(expected) and math.isnan(parsed[key]))


@pytest.mark.parametrize(
    ("body", "offset"),
    [
        (b'{"instances": [' + b"1" * 5000 + b"]}", 15),
        (b'{"instances": [1e400]}', 15),
        (b'{"instances": [-' + b"9" * 400 + b"]}", 15),
        (b'{"instances": [NaN, ' + b"1" * 5000 + b"]}", 20),
    ],
)
def test_numbers_beyond_double_are_a_parse_error(body: bytes, offset: int) -> None:
    # rapidjson: kParseErrorNumberTooBig at the number's offset (INVALID_ARGUMENT like any
    # unparsable number) -- never Python's 4,300-digit int limit, which was a 500.
    assert parse_error(body) == (
        f"JSON Parse error: Number too big to be stored in double. at offset: {offset}"
    )


# ---- decode_predict_body: parse and decode in one call (the REST worker processes' job) ------------


def test_decode_predict_body_decodes_for_the_signature_the_body_names() -> None:
    dtypes = {"serving_default": X_FLOAT, "pair": AB}
    default = json_tensor.decode_predict_body(b'{"instances": [1.0, 2.0]}', dtypes)
    assert (default.signature_name, default.input_dtypes) == ("", X_FLOAT)
    fmt, inputs = default.tensors()
    assert fmt is JsonFormat.ROW
    np.testing.assert_array_equal(inputs["x"], np.array([1.0, 2.0], np.float32))
    pair = json_tensor.decode_predict_body(b'{"signature_name": "pair", "inputs": {"a": 1, "b": [2]}}', dtypes)
    assert (pair.signature_name, pair.input_dtypes, pair.tensors()[0]) == ("pair", AB, JsonFormat.COLUMNAR)


def test_decode_predict_body_leaves_an_unknown_signature_undecoded() -> None:
    request = b'{"signature_name": "nope", "instances": [1]}'
    body = json_tensor.decode_predict_body(request, {"serving_default": X_FLOAT})
    assert (body.signature_name, body.input_dtypes) == ("nope", None)
    with pytest.raises(ValueError, match="not decoded"):
        body.tensors()
    assert json_tensor.decode_predict_body(b'{"instances": [1]}', {}).input_dtypes is None


def test_decode_predict_body_raises_parse_errors_and_keeps_decode_errors() -> None:
    with pytest.raises(ServingError, match="^JSON Parse error: Invalid value. at offset: 14$"):
        json_tensor.decode_predict_body(b'{"instances": ,}', {"serving_default": X_FLOAT})
    with pytest.raises(ServingError, match="'signature_name' key must be a string value"):
        json_tensor.decode_predict_body(b'{"signature_name": 1, "instances": [1]}', {})
    kept = json_tensor.decode_predict_body(b'{"instances": ["a"]}', {"serving_default": X_FLOAT})
    assert kept.error is not None and kept.error.message == message({"instances": ["a"]})
    with pytest.raises(ServingError) as info:
        kept.tensors()
    assert info.value is kept.error
