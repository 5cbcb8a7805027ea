"""The OIP REST documents as OpenAPI schemas (the spec's `open_inference_rest.yaml`).

Documentation only: the endpoints read and write the documents with `api.oip.rest_codec`
(the binary tensor data extension puts raw bytes after the JSON, which no JSON model can
parse), so these models never validate a request or an answer on the hot path.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

Parameters = dict[str, bool | int | float | str]


class ServerMetadata(BaseModel):
    """`$metadata_server_response`."""

    name: str
    version: str
    extensions: list[str]


class Live(BaseModel):
    """`$live_server_response`."""

    live: bool


class Ready(BaseModel):
    """`$ready_server_response`."""

    ready: bool


class ModelReady(BaseModel):
    """`$ready_model_response`."""

    name: str
    ready: bool


class MetadataTensor(BaseModel):
    """`$metadata_tensor`: a variable dimension is -1."""

    name: str
    datatype: str
    shape: list[int]


class ModelMetadata(BaseModel):
    """`$metadata_model_response`: the versions AVAILABLE on serving, the signature's tensors."""

    name: str
    versions: list[str]
    platform: str
    inputs: list[MetadataTensor]
    outputs: list[MetadataTensor]


class ResponseOutput(BaseModel):
    """`$response_output`: `data` flat, row-major; absent when the output is binary data
    (`parameters.binary_data_size` then gives its length)."""

    name: str
    shape: list[int]
    datatype: str
    parameters: Parameters | None = None
    data: list[Any] | None = None


class InferenceResponse(BaseModel):
    """`$inference_response`."""

    model_name: str
    model_version: str
    id: str | None = None
    parameters: Parameters | None = None
    outputs: list[ResponseOutput]


class ErrorResponse(BaseModel):
    """`$inference_error_response`: `error`, and the API's own error fields beside it."""

    error: str
    detail: Any = None
    code: str = Field(description="The API's machine-readable code (the canonical code's name, lower case).")
    request_id: str | None = None


_TENSOR_DATA: dict[str, Any] = {
    "type": "array",
    "description": "The elements, flat or nested row-major (numbers, strings, booleans).",
    "items": {},
}
_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "additionalProperties": {"anyOf": [{"type": "string"}, {"type": "number"}, {"type": "boolean"}]},
}

#: `$inference_request`, as the OpenAPI request body of the infer endpoints (JSON, or JSON
#: followed by binary tensor data as `application/octet-stream`).
INFERENCE_REQUEST_BODY: dict[str, Any] = {
    "required": True,
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "required": ["inputs"],
                "properties": {
                    "id": {"type": "string"},
                    "parameters": {
                        **_PARAMETERS,
                        "description": "`signature_name`: the SignatureDef to call (default serving_default); "
                        "`binary_data_output`: every output as binary data.",
                    },
                    "inputs": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["name", "shape", "datatype"],
                            "properties": {
                                "name": {"type": "string"},
                                "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
                                "datatype": {
                                    "type": "string",
                                    "enum": [
                                        "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32",
                                        "INT64", "FP16", "FP32", "FP64", "BYTES", "BF16",
                                    ],
                                },  # fmt: skip
                                "parameters": {**_PARAMETERS, "description": "`binary_data_size`: bytes of raw data"},
                                "data": _TENSOR_DATA,
                            },
                        },
                    },
                    "outputs": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["name"],
                            "properties": {
                                "name": {"type": "string"},
                                "parameters": {**_PARAMETERS, "description": "`binary_data`: as binary data"},
                            },
                        },
                    },
                },
            }
        },
        "application/octet-stream": {
            "schema": {"type": "string", "format": "binary"},
            "description": "The JSON request (Inference-Header-Content-Length bytes), then each binary input's data.",
        },
    },
}
