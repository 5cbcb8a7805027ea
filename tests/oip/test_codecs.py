"""The OIP codecs alone: datatypes and raw bytes, the REST documents with the binary tensor data
extension, the gRPC messages, and the serving client's 16-bit tensors. Pure functions, no I/O."""

from __future__ import annotations

import math
import struct
from array import array

import ml_dtypes
import numpy as np
import pytest

from api.oip import grpc_codec, rest_codec
from api.oip.datatypes import DATATYPES, TensorDataError, decode_raw, encode_raw, json_element, json_output
from api.oip.types import InferOutput, InferRequest, InferResult, OipError, RequestedOutput
from api.protos.inference import open_inference_grpc_pb2 as pb
from api.serving_client import Code, DataType, Tensor

NUMPY = {
    "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
    "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64, "FP16": np.float16,
    "FP32": np.float32, "FP64": np.float64, "BF16": ml_dtypes.bfloat16,
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(NUMPY))
def test_raw_bytes_are_numpys_little_endian_layout_both_ways(name: str) -> None:
    datatype = DATATYPES[name]
    values = np.array([0, 1, 1, 0, 1, 0] if name == "BOOL" else [0, 1, 2, 3, 100, 7], dtype=NUMPY[name])
    raw = values.astype(values.dtype.newbyteorder("<")).tobytes()
    decoded = decode_raw(datatype, raw, 6, "x")
    assert np.array_equal(np.array(list(decoded), dtype=np.float64), values.astype(np.float64))
    assert encode_raw(datatype, decoded) == raw


def test_bytes_elements_are_length_prefixed() -> None:
    raw = struct.pack("<I", 3) + b"abc" + struct.pack("<I", 0) + struct.pack("<I", 2) + b"\xff\x00"
    assert decode_raw(DATATYPES["BYTES"], raw, 3, "t") == [b"abc", b"", b"\xff\x00"]
    assert encode_raw(DATATYPES["BYTES"], [b"abc", b"", b"\xff\x00"]) == raw
    for bad, words in ((raw[:-1], "runs past"), (raw + b"\x01", "4-byte length"), (raw + struct.pack("<I", 0), "4")):
        with pytest.raises(TensorDataError, match=words):
            decode_raw(DATATYPES["BYTES"], bad, 3, "t")


def test_raw_data_of_the_wrong_size_or_bool_bytes_are_refused() -> None:
    with pytest.raises(TensorDataError, match="expected 8"):
        decode_raw(DATATYPES["FP32"], bytes(7), 2, "x")
    with pytest.raises(TensorDataError, match="BOOL byte"):
        decode_raw(DATATYPES["BOOL"], b"\x00\x02", 2, "x")


def test_json_elements_are_checked_against_their_datatype() -> None:
    assert json_element(DATATYPES["FP32"], 1, "x") == 1.0
    assert json_element(DATATYPES["BYTES"], "é", "x") == "é".encode()
    assert json_element(DATATYPES["UINT64"], 2**64 - 1, "x") == 2**64 - 1
    for datatype, value, words in (
        ("INT8", 128, "range"), ("UINT8", -1, "range"), ("INT32", 1.5, "integers"), ("INT64", True, "integers"),
        ("FP32", "1", "numbers"), ("FP16", 70000.0, "FP16"), ("BOOL", 1, "true or false"), ("BYTES", 3, "strings"),
    ):  # fmt: skip
        with pytest.raises(TensorDataError, match=words):
            json_element(DATATYPES[datatype], value, "x")
    with pytest.raises(TensorDataError, match="binary_data"):
        json_output(DATATYPES["BYTES"], [b"\xff"], "y")


def test_a_rest_request_flat_nested_and_binary() -> None:
    flat = b'{"id": "1", "inputs": [{"name": "a", "shape": [2, 2], "datatype": "INT32", "data": [1, 2, 3, 4]}]}'
    nested = b'{"inputs": [{"name": "a", "shape": [2, 2], "datatype": "INT32", "data": [[1, 2], [3, 4]]}]}'
    header = (
        b'{"inputs": [{"name": "a", "shape": [2, 2], "datatype": "INT32",'
        b' "parameters": {"binary_data_size": 16}}]}'
    )
    binary = header + array("i", [1, 2, 3, 4]).tobytes()
    for body, length in ((flat, None), (nested, None), (binary, len(header))):
        request = rest_codec.parse_infer_request(body, length, "m", None)
        assert list(request.inputs[0].values) == [1, 2, 3, 4] and request.inputs[0].shape == (2, 2)
    assert rest_codec.parse_infer_request(flat, None, "m", "3").id == "1"
    for body, words in (
        (b'{"inputs": [{"name": "a", "shape": [2, 2], "datatype": "INT32", "data": [[1, 2], [3]]}]}', "nested"),
        (b'{"inputs": [{"name": "a", "shape": [2], "datatype": "INT32", "data": [[1], [2]]}]}', "deeper"),
        (b'{"inputs": [{"name": "a", "shape": [2], "datatype": "INT32"}]}', "no 'data'"),
        (b'{"inputs": [{"name": "a", "shape": [2], "datatype": "INT32", "data": [1, 2]}], "outputs": 3}', "'outputs'"),
        (b'{"id": 3, "inputs": []}', "'id'"),
        (b'{"parameters": [], "inputs": []}', "parameters"),
    ):  # fmt: skip
        with pytest.raises(OipError, match=words) as raised:
            rest_codec.parse_infer_request(body, None, "m", None)
        assert raised.value.code is Code.INVALID_ARGUMENT and raised.value.http_status == 400


def test_the_header_length_must_lie_within_the_body() -> None:
    assert rest_codec.parse_header_length(None, 10) is None
    assert rest_codec.parse_header_length(" 10 ", 10) == 10
    for bad in ("11", "-1", "ten", "1e3", "٣"):
        with pytest.raises(OipError, match="Inference-Header-Content-Length"):
            rest_codec.parse_header_length(bad, 10)


def _result(*outputs: InferOutput) -> InferResult:
    return InferResult("m", "2", outputs, id="7")


def test_a_rest_answer_json_binary_and_mixed() -> None:
    fp32 = InferOutput("y", DATATYPES["FP32"], (2,), [0.5, 1.25])
    text = InferOutput("t", DATATYPES["BYTES"], (1,), [b"hi"])
    body, length = rest_codec.encode_infer_result(_result(fp32, text), False)
    assert length is None and body == (
        b'{"model_name":"m","model_version":"2","id":"7","outputs":[{"name":"y","datatype":"FP32","shape":[2],'
        b'"data":[0.5,1.25]},{"name":"t","datatype":"BYTES","shape":[1],"data":["hi"]}]}'
    )
    body, length = rest_codec.encode_infer_result(_result(fp32, text), {"y"})
    assert length is not None and body[length:] == struct.pack("<2f", 0.5, 1.25)
    assert b'"parameters":{"binary_data_size":8}' in body[:length] and b'"data":["hi"]' in body[:length]
    nan = InferOutput("y", DATATYPES["FP64"], (2,), [math.nan, -math.inf])
    assert rest_codec.encode_infer_result(_result(nan), False)[0].endswith(b'"data":[NaN,-Infinity]}]}')


def test_which_outputs_go_binary() -> None:
    def request(parameters: dict, outputs: list[RequestedOutput]) -> InferRequest:
        return InferRequest("m", None, [], outputs, parameters=parameters)

    assert rest_codec.binary_outputs(request({}, [])) is False
    assert rest_codec.binary_outputs(request({"binary_data_output": True}, [])) is True
    assert rest_codec.binary_outputs(
        request({"binary_data_output": True}, [RequestedOutput("a"), RequestedOutput("b", False)])
    ) == {"a"}


def test_a_grpc_request_raw_or_typed_and_its_answer() -> None:
    message = pb.ModelInferRequest(model_name="m", model_version="2", id="9")
    message.inputs.add(name="a", datatype="FP16", shape=[2])
    message.raw_input_contents.append(struct.pack("<2e", 0.5, -2.0))
    message.parameters["signature_name"].string_param = "echo"
    request = grpc_codec.infer_request(message)
    assert request.signature_name == "echo" and request.model_version == "2" and request.id == "9"
    assert list(request.inputs[0].values) == [0.5, -2.0]
    typed = pb.ModelInferRequest(model_name="m")
    typed.inputs.add(name="b", datatype="INT8", shape=[2]).contents.int_contents.extend([1, 300])
    with pytest.raises(OipError, match="range"):
        grpc_codec.infer_request(typed)
    fp16 = pb.ModelInferRequest(model_name="m")
    fp16.inputs.add(name="h", datatype="FP16", shape=[1]).contents.fp32_contents.append(1.0)
    with pytest.raises(OipError, match="raw_input_contents"):
        grpc_codec.infer_request(fp16)
    out = InferOutput("y", DATATYPES["INT64"], (2,), [5, -6])
    raw = grpc_codec.infer_response(_result(out), raw=True)
    assert raw.raw_output_contents == [struct.pack("<2q", 5, -6)] and not raw.outputs[0].HasField("contents")
    typed_answer = grpc_codec.infer_response(_result(out), raw=False)
    assert list(typed_answer.outputs[0].contents.int64_contents) == [5, -6] and not typed_answer.raw_output_contents
    half = InferOutput("h", DATATYPES["FP16"], (1,), [0.5])
    assert grpc_codec.infer_response(_result(out, half), raw=False).raw_output_contents  # FP16: all raw


def test_the_serving_clients_16_bit_tensors_round_trip() -> None:
    """DT_HALF and DT_BFLOAT16 over gRPC (tensor_content, half_val), rounded as numpy rounds them."""
    from api.serving_client._tensor_proto import tensor_from_proto, tensor_to_proto

    values = [0.1, -3.14159, 65504.0, 1e-3]
    for dtype, numpy_type in ((DataType.DT_HALF, np.float16), (DataType.DT_BFLOAT16, ml_dtypes.bfloat16)):
        proto = tensor_to_proto(Tensor((4,), values, dtype))
        assert proto.tensor_content == np.array(values, dtype=np.float32).astype(numpy_type).tobytes()
        assert tensor_from_proto(proto).values == np.array(values).astype(numpy_type).astype(np.float64).tolist()
        proto.ClearField("tensor_content")
        proto.half_val.extend(np.array(values).astype(numpy_type).view(np.uint16).tolist())
        assert tensor_from_proto(proto).values == np.array(values).astype(numpy_type).astype(np.float64).tolist()
