"""OIP's gRPC messages (`api.protos.inference.open_inference_grpc_pb2`), to and from `api.oip.types`.

A request's tensors come either all in `raw_input_contents` (one entry per input, in order;
the layout of `api.oip.datatypes`) or each in its `contents` field of its datatype; never
both. The answer mirrors the request: raw outputs in `raw_output_contents` when the request
came raw (as Triton's and KServe's clients send it), typed `contents` otherwise, except that
FP16 and BF16 have no typed field, so an answer with one is all raw. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from google.protobuf.internal.containers import MessageMap

from api.oip.datatypes import DATATYPES, Datatype, TensorDataError, decode_raw, encode_raw, json_element
from api.oip.types import (
    MAX_RANK,
    InferInput,
    InferRequest,
    InferResult,
    ModelMetadata,
    Parameters,
    RequestedOutput,
    invalid,
)
from api.protos.inference import open_inference_grpc_pb2 as pb
from api.serving_client import DataType

# The typed `InferTensorContents` field of each datatype (FP16 and BF16 have none).
_CONTENTS: Final[Mapping[DataType, str]] = {
    DataType.DT_BOOL: "bool_contents",
    DataType.DT_INT8: "int_contents",
    DataType.DT_INT16: "int_contents",
    DataType.DT_INT32: "int_contents",
    DataType.DT_INT64: "int64_contents",
    DataType.DT_UINT8: "uint_contents",
    DataType.DT_UINT16: "uint_contents",
    DataType.DT_UINT32: "uint_contents",
    DataType.DT_UINT64: "uint64_contents",
    DataType.DT_FLOAT: "fp32_contents",
    DataType.DT_DOUBLE: "fp64_contents",
    DataType.DT_STRING: "bytes_contents",
}


def parameters(entries: MessageMap[str, pb.InferParameter]) -> Parameters:
    """A parameter map as plain values (the set field of each `InferParameter`)."""
    out: dict[str, bool | int | float | str] = {}
    for key, parameter in entries.items():
        choice = parameter.WhichOneof("parameter_choice")
        if choice is not None:
            out[key] = getattr(parameter, choice)
    return out


def infer_request(message: pb.ModelInferRequest) -> InferRequest:
    """Decode a `ModelInferRequest`.

    Raises:
        OipError: INVALID_ARGUMENT for an unknown datatype, a negative or too long shape,
            raw contents that do not match the inputs, both raw and typed contents, or data
            that does not fit its datatype.
    """
    raw = message.raw_input_contents
    if raw and len(raw) != len(message.inputs):
        raise invalid(f"raw_input_contents has {len(raw)} entries for {len(message.inputs)} inputs")
    inputs = []
    for index, tensor in enumerate(message.inputs):
        name = tensor.name
        datatype = DATATYPES.get(tensor.datatype)
        if datatype is None:
            raise invalid(f"input '{name}': datatype {tensor.datatype!r} is not one of {', '.join(DATATYPES)}")
        shape = tuple(tensor.shape)
        if len(shape) > MAX_RANK or any(d < 0 for d in shape):
            raise invalid(f"input '{name}': shape must be at most {MAX_RANK} non-negative integers")
        count = 1
        for dim in shape:
            count *= dim
        try:
            if raw:
                if tensor.HasField("contents"):
                    raise invalid(f"input '{name}' has contents, and the request raw_input_contents")
                values: Sequence[Any] = decode_raw(datatype, raw[index], count, name)
            else:
                values = _typed(datatype, tensor.contents, name)
        except TensorDataError as exc:
            raise invalid(str(exc)) from None
        inputs.append(InferInput(name, datatype, shape, values))
    outputs = [
        RequestedOutput(o.name, binary=parameters(o.parameters).get("binary_data") is True) for o in message.outputs
    ]
    return InferRequest(
        model_name=message.model_name,
        model_version=message.model_version or None,
        inputs=inputs,
        outputs=outputs,
        id=message.id or None,
        parameters=parameters(message.parameters),
    )


def _typed(datatype: Datatype, contents: pb.InferTensorContents, name: str) -> list[Any]:
    field = _CONTENTS.get(datatype.dtype)
    if field is None:
        raise invalid(f"input '{name}': {datatype.name} data travels only in raw_input_contents")
    values = list(getattr(contents, field))
    if datatype.kind == "int":  # int_contents and uint_contents are wider than INT8/16, UINT8/16
        for value in values:
            json_element(datatype, value, name)
    return values


def infer_response(result: InferResult, raw: bool) -> pb.ModelInferResponse:
    """Encode an answer: raw outputs when `raw` or an output is FP16/BF16, else typed contents.

    Raises:
        TensorDataError: an output's values do not fit its datatype.
    """
    message = pb.ModelInferResponse(model_name=result.model_name, model_version=result.model_version)
    if result.id is not None:
        message.id = result.id
    raw = raw or any(o.datatype.dtype not in _CONTENTS for o in result.outputs)
    for output in result.outputs:
        tensor = message.outputs.add(name=output.name, datatype=output.datatype.name, shape=output.shape)
        if raw:
            message.raw_output_contents.append(encode_raw(output.datatype, output.values))
        else:
            getattr(tensor.contents, _CONTENTS[output.datatype.dtype]).extend(output.values)
    return message


def model_metadata(metadata: ModelMetadata) -> pb.ModelMetadataResponse:
    """Encode OIP model metadata."""
    message = pb.ModelMetadataResponse(name=metadata.name, versions=metadata.versions, platform=metadata.platform)
    for tensor in metadata.inputs:
        message.inputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
    for tensor in metadata.outputs:
        message.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
    return message
