"""OIP's REST documents and the binary tensor data extension, to and from `api.oip.types`.

The request body is the `$inference_request` JSON object, or, with the binary tensor data
extension, that object (`Inference-Header-Content-Length` bytes) followed by the raw data of
each input whose parameters carry `binary_data_size`, in the order of `inputs`. An input's
`data` is flat or nested row-major; either way it must hold exactly the shape's element count.
An output goes back as raw data when its `parameters.binary_data` is true, or, without it,
when the request's `parameters.binary_data_output` is; the answer then is the
`$inference_response` object without that output's `data`, its `parameters.binary_data_size`
set, followed by the raw data, with `Inference-Header-Content-Length` giving the JSON's length
(Triton's and KServe's binary tensor data extension). Parameters other than those and
`signature_name` are accepted and ignored, as the protocol lets a server do.

JSON numbers: non-finite floats in an answer are written as `NaN`, `Infinity`, `-Infinity`, as
TF Serving and Triton write them. Pure: no I/O, no web framework.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, Final

import orjson

from api.oip.datatypes import DATATYPES, Datatype, TensorDataError, decode_raw, encode_raw, json_element, json_output
from api.oip.types import (
    MAX_RANK,
    InferInput,
    InferRequest,
    InferResult,
    ModelMetadata,
    Parameters,
    RequestedOutput,
    TensorMetadata,
    invalid,
)

#: The header giving the JSON object's length when binary tensor data follows it.
HEADER_LENGTH: Final = "inference-header-content-length"
BINARY_DATA_SIZE: Final = "binary_data_size"
BINARY_DATA: Final = "binary_data"
BINARY_DATA_OUTPUT: Final = "binary_data_output"


def parse_header_length(value: str | None, body_length: int) -> int | None:
    """`Inference-Header-Content-Length` as an int, or None without one.

    Raises:
        OipError: INVALID_ARGUMENT when it is not a number between 0 and the body's length.
    """
    if value is None:
        return None
    text = value.strip()
    if not text.isascii() or not text.isdigit() or len(text) > 12 or int(text) > body_length:
        raise invalid(f"Inference-Header-Content-Length must be a byte count within the body ({body_length} bytes)")
    return int(text)


def parse_infer_request(body: bytes, header_length: int | None, model_name: str, version: str | None) -> InferRequest:
    """Decode an inference request body (see module doc).

    Args:
        body: the whole body.
        header_length: `parse_header_length`'s answer: the JSON's length, or None when the
            body is all JSON.
        model_name / version: from the path.

    Raises:
        OipError: INVALID_ARGUMENT for anything that is not a well-formed request, naming
            the field or tensor.
    """
    document = body if header_length is None else body[:header_length]
    binary = memoryview(body)[len(document) :]
    try:
        parsed = orjson.loads(document)
    except orjson.JSONDecodeError as exc:
        raise invalid(f"the request body is not JSON ({exc})") from None
    if not isinstance(parsed, dict):
        raise invalid("the request body must be a JSON object")
    request_id = parsed.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise invalid("'id' must be a string")
    parameters = _parameters(parsed.get("parameters"), "the request")
    raw_inputs = parsed.get("inputs")
    if not isinstance(raw_inputs, list):
        raise invalid("'inputs' must be a list of tensors")
    inputs = []
    offset = 0
    for index, raw in enumerate(raw_inputs):
        tensor, used = _input(raw, index, binary[offset:])
        inputs.append(tensor)
        offset += used
    if offset != len(binary):
        raise invalid(
            f"{len(binary)} bytes of binary data follow the JSON, the inputs' binary_data_size add up to {offset}"
        )
    return InferRequest(
        model_name=model_name,
        model_version=version,
        inputs=inputs,
        outputs=_outputs(parsed.get("outputs"), parameters),
        id=request_id,
        parameters=parameters,
    )


def _parameters(raw: Any, where: str) -> Parameters:
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not all(isinstance(v, (bool, int, float, str)) for v in raw.values()):
        raise invalid(f"the parameters of {where} must be an object of strings, numbers and booleans")
    return raw


def _input(raw: Any, index: int, binary: memoryview) -> tuple[InferInput, int]:
    """One `$request_input`, and how many bytes of the binary data it took."""
    if not isinstance(raw, dict):
        raise invalid(f"inputs[{index}] must be an object")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise invalid(f"inputs[{index}] needs a 'name'")
    datatype = _datatype(raw.get("datatype"), name)
    shape = _shape(raw.get("shape"), name)
    parameters = _parameters(raw.get("parameters"), f"input '{name}'")
    count = math.prod(shape)
    size = parameters.get(BINARY_DATA_SIZE)
    try:
        if size is not None:
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise invalid(f"input '{name}': binary_data_size must be a byte count")
            if "data" in raw:
                raise invalid(f"input '{name}' has both 'data' and binary_data_size")
            if size > len(binary):
                raise invalid(f"input '{name}': binary_data_size {size} runs past the binary data ({len(binary)} left)")
            return InferInput(name, datatype, shape, decode_raw(datatype, bytes(binary[:size]), count, name)), size
        if "data" not in raw:
            raise invalid(f"input '{name}' has no 'data' (nor binary_data_size)")
        return InferInput(name, datatype, shape, _json_data(datatype, raw["data"], shape, count, name)), 0
    except TensorDataError as exc:
        raise invalid(str(exc)) from None


def _datatype(raw: Any, name: str) -> Datatype:
    datatype = DATATYPES.get(raw) if isinstance(raw, str) else None
    if datatype is None:
        raise invalid(f"input '{name}': datatype {raw!r} is not one of {', '.join(DATATYPES)}")
    return datatype


def _shape(raw: Any, name: str) -> tuple[int, ...]:
    if (
        not isinstance(raw, list)
        or len(raw) > MAX_RANK
        or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**63 for d in raw)
    ):
        raise invalid(f"input '{name}': shape must be a list of at most {MAX_RANK} non-negative integers")
    return tuple(raw)


def _json_data(datatype: Datatype, data: Any, shape: tuple[int, ...], count: int, name: str) -> list[Any]:
    """The elements of `data`, flat: given flat, or nested exactly as `shape`."""
    if not isinstance(data, list):
        data = [data]  # a scalar's one element
    if len(data) == count and not any(isinstance(v, list) for v in data):
        return [json_element(datatype, v, name) for v in data]
    flat: list[Any] = []
    level: list[Any] = [data]
    for depth, size in enumerate(shape):
        following: list[Any] = []
        for item in level:
            if not isinstance(item, list) or len(item) != size:
                raise TensorDataError(
                    f"input '{name}': data is neither {count} values nor nested as shape {list(shape)} "
                    f"(at depth {depth})"
                )
            following.extend(item)
        level = following
    for value in level:
        if isinstance(value, list):
            raise TensorDataError(f"input '{name}': data is nested deeper than shape {list(shape)}")
        flat.append(json_element(datatype, value, name))
    return flat


def _outputs(raw: Any, parameters: Parameters) -> list[RequestedOutput]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise invalid("'outputs' must be a list")
    outputs = []
    for index, item in enumerate(raw):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise invalid(f"outputs[{index}] must be an object with a 'name'")
        output_parameters = _parameters(item.get("parameters"), f"output '{item['name']}'")
        binary = output_parameters.get(BINARY_DATA)
        outputs.append(RequestedOutput(item["name"], binary if isinstance(binary, bool) else None))
    return outputs


def binary_outputs(request: InferRequest) -> set[str] | bool:
    """Which outputs go back as binary data: a set of names, or True/False for all of them."""
    default = request.parameters.get(BINARY_DATA_OUTPUT) is True
    if not request.outputs:
        return default
    return {o.name for o in request.outputs if (o.binary if o.binary is not None else default)}


def encode_infer_result(result: InferResult, binary: set[str] | bool) -> tuple[bytes, int | None]:
    """The answer's body, and the JSON's length when binary data follows it (else None).

    Raises:
        TensorDataError: a BYTES output asked for as JSON holds bytes that are not UTF-8.
    """
    outputs: list[dict[str, Any]] = []
    chunks: list[bytes] = []
    for output in result.outputs:
        entry: dict[str, Any] = {"name": output.name, "datatype": output.datatype.name, "shape": list(output.shape)}
        if binary is True or (isinstance(binary, set) and output.name in binary):
            raw = encode_raw(output.datatype, output.values)
            entry["parameters"] = {BINARY_DATA_SIZE: len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = json_output(output.datatype, output.values, output.name)
        outputs.append(entry)
    document: dict[str, Any] = {"model_name": result.model_name, "model_version": result.model_version}
    if result.id is not None:
        document["id"] = result.id
    document["outputs"] = outputs
    header = dumps(document)
    if not chunks:
        return header, None
    return header + b"".join(chunks), len(header)


def dumps(document: Mapping[str, Any]) -> bytes:
    """Compact JSON; non-finite floats as TF Serving's bare tokens (orjson would write null).
    Only an answer that has one pays for Python's encoder."""
    if _has_nonfinite(document):
        return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return orjson.dumps(document)


def _has_nonfinite(document: Mapping[str, Any]) -> bool:
    for output in document.get("outputs", ()):
        data = output.get("data")
        if data and any(isinstance(v, float) and not math.isfinite(v) for v in data):
            return True
    return False


def encode_metadata(metadata: ModelMetadata) -> bytes:
    """`$metadata_model_response`."""
    return orjson.dumps(
        {
            "name": metadata.name,
            "versions": list(metadata.versions),
            "platform": metadata.platform,
            "inputs": [_tensor(t) for t in metadata.inputs],
            "outputs": [_tensor(t) for t in metadata.outputs],
        }
    )


def _tensor(tensor: TensorMetadata) -> dict[str, Any]:
    return {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape)}
