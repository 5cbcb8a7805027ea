"""Codec between the client's types and TF Serving's REST JSON (api_rest.md).

Requests use the columnar format, `{"signature_name": ..., "inputs": {name: nested
lists}}`, whose answer is `{"outputs": {name: nested lists}}`, or `{"outputs": nested
lists}` when the signature has a single output (kept under the name ""). TF Serving
writes non-finite floats as the bare tokens `NaN`, `Infinity` and `-Infinity`, which
strict JSON parsers (orjson) reject: `loads` falls back to the standard library's
parser for those bodies. Pure: no I/O, no HTTP client import.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import orjson

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
    nest,
)


def loads(content: bytes) -> Any:
    """Parse a JSON body, accepting TF Serving's `NaN` / `Infinity` / `-Infinity`.

    Raises:
        ValueError: not JSON even with those tokens.
    """
    try:
        return orjson.loads(content)
    except orjson.JSONDecodeError:
        return json.loads(content)  # Python's parser maps the three tokens to floats


def predict_body(request: PredictRequest) -> bytes:
    """The JSON body of `POST /v1/models/...:predict`, columnar format.

    DT_STRING values (bytes) travel as `{"b64": ...}`, which TF Serving decodes for any
    string input; non-finite floats as the bare tokens `NaN`, `Infinity` and `-Infinity`,
    which it reads (orjson would write them as `null`). A body with neither is written by
    orjson alone.
    """
    inputs = {name: _json_values(tensor) for name, tensor in request.inputs.items()}
    body = {"signature_name": request.model_spec.signature_name, "inputs": inputs}
    if not any(t.dtype in _FLOATS and not _finite(t.values) for t in request.inputs.values()):
        return orjson.dumps(body)
    # Python's encoder writes the three tokens (allow_nan); only such rare bodies pay for it.
    return json.dumps(body, separators=(",", ":")).encode("ascii")


_FLOATS = frozenset({DataType.DT_FLOAT, DataType.DT_DOUBLE, DataType.DT_HALF, DataType.DT_BFLOAT16})


def _finite(values: Sequence[Scalar]) -> bool:
    return all(math.isfinite(v) for v in values if isinstance(v, float))


def _json_values(tensor: Tensor) -> object:
    """The tensor's values nested by its shape (`nest` slices lists and `array.array`s alike)."""
    if tensor.dtype is not DataType.DT_STRING:
        return tensor.to_nested()
    encoded = [{"b64": base64.b64encode(value).decode("ascii")} for value in tensor.values if isinstance(value, bytes)]
    if len(encoded) != len(tensor.values):
        raise TypeError("a DT_STRING tensor's values must be bytes")
    return nest(encoded, tensor.shape)  # type: ignore[arg-type]  # nest only slices and lists its items


def model_path(name: str, version: int | None = None, label: str | None = None) -> str:
    """`/v1/models/{name}[/versions/{v} | /labels/{l}]` (name and label URL-path-escaped, as
    TF Serving's REST API URL-decodes both: http_rest_api_util.cc `ParseModelInfo`)."""
    path = f"/v1/models/{quote(name, safe='')}"
    if version is not None:
        path += f"/versions/{version}"
    elif label is not None:
        path += f"/labels/{quote(label, safe='')}"
    return path


def predict_path(request: PredictRequest) -> str:
    """`/v1/models/{name}[/versions/{v} | /labels/{l}]:predict`."""
    spec = request.model_spec
    return model_path(spec.name, spec.version, spec.version_label) + ":predict"


def predict_response(answer: Any, request: PredictRequest) -> PredictResponse:
    """Decode a predict answer; keeps only `request.output_filter` outputs when set.

    Raises:
        ServingBadResponse: no `outputs`, or an output that is not a rectangular array.
    """
    outputs = answer.get("outputs") if isinstance(answer, dict) else None
    if outputs is None:
        raise ServingBadResponse("serving's predict answer has no 'outputs'")
    named = outputs if isinstance(outputs, dict) else {"": outputs}
    if request.output_filter and isinstance(outputs, dict):
        named = {k: v for k, v in named.items() if k in request.output_filter}
    return PredictResponse({name: tensor_from_json(name, value) for name, value in named.items()})


def tensor_from_json(name: str, value: Any) -> Tensor:
    """Nested lists (or a scalar) from TF Serving's JSON as a `Tensor` (dtype None).

    Numbers stay Python ints or floats (NaN and infinities included), strings become
    UTF-8 bytes, `{"b64": ...}` objects their decoded bytes.

    Raises:
        ServingBadResponse: a ragged array or a value of another JSON type.
    """
    shape: list[int] = []
    probe = value
    while isinstance(probe, list):
        shape.append(len(probe))
        if not probe:
            break
        probe = probe[0]
    flat: list[Scalar] = []
    _flatten(name, value, shape, 0, flat)
    return Tensor(tuple(shape), flat)


def _flatten(name: str, value: Any, shape: list[int], depth: int, out: list[Scalar]) -> None:
    if depth == len(shape):
        out.append(_scalar(name, value))
        return
    if not isinstance(value, list) or len(value) != shape[depth]:
        raise ServingBadResponse(f"serving answered output '{name}' as a ragged array")
    for item in value:
        _flatten(name, item, shape, depth + 1, out)


def _scalar(name: str, value: Any) -> Scalar:
    if isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, dict) and isinstance(value.get("b64"), str):
        try:
            return base64.b64decode(value["b64"], validate=True)
        except ValueError:
            pass
    raise ServingBadResponse(f"serving answered output '{name}' with a non-tensor value")


def model_status(answer: Any) -> ModelStatus:
    """Decode `GET /v1/models/{name}` (GetModelStatusResponse in proto3 JSON).

    Raises:
        ServingBadResponse: not that message.
    """
    entries = answer.get("model_version_status") if isinstance(answer, dict) else None
    if not isinstance(entries, list):
        raise ServingBadResponse("serving's model status answer has no 'model_version_status'")
    versions = []
    try:
        for entry in entries:
            status = entry.get("status") or {}
            versions.append(
                VersionStatus(
                    version=int(entry["version"]),  # int64: a JSON string in proto3 JSON
                    state=str(entry.get("state", "UNKNOWN")),
                    error_message=str(status.get("error_message", "")),
                )
            )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ServingBadResponse(f"serving's model status answer is malformed ({exc!r})") from exc
    return ModelStatus(tuple(versions))


def model_metadata(answer: Any, version: int | None) -> ModelMetadata:
    """Decode `GET /v1/models/{name}[/versions/{v} | /labels/{l}]/metadata` (TF Serving's JSON:
    `model_spec` with the version serving resolved, and the SignatureDefMap in proto3 JSON with
    the proto's field names, under `metadata.signature_def.signature_def`).

    Args:
        answer: the parsed body.
        version: the version asked for, used when the answer's `model_spec` has none.

    Raises:
        ServingBadResponse: not that message, or no version in it or in the request.
    """
    try:
        spec = answer.get("model_spec") or {}
        # int64 in proto3 JSON: a string (get_model_metadata_impl.cc sets it to the resolved version).
        resolved = spec.get("version")
        version = int(resolved) if resolved is not None else version
        if version is None:
            raise ValueError("no model_spec.version in the answer")
        signature_defs = answer["metadata"]["signature_def"]["signature_def"]
        signatures = {
            key: SignatureInfo(
                inputs=_tensor_infos(signature.get("inputs", {})),
                outputs=_tensor_infos(signature.get("outputs", {})),
                method_name=str(signature.get("method_name", "")),
            )
            for key, signature in signature_defs.items()
        }
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ServingBadResponse(f"serving's model metadata answer is malformed ({exc!r})") from exc
    return ModelMetadata(version, signatures)


def _tensor_infos(entries: dict[str, Any]) -> dict[str, TensorInfo]:
    infos = {}
    for alias, info in entries.items():
        shape_json = info.get("tensor_shape", {})
        shape = (
            None
            if shape_json.get("unknown_rank", False)
            else tuple(int(dim.get("size", -1)) for dim in shape_json.get("dim", []))
        )
        # A dtype this client has no member for (DT_HALF, DT_RESOURCE, ...) reads as
        # DT_INVALID: it matches no declared input, which readiness then reports.
        dtype = DataType.__members__.get(str(info.get("dtype", "")), DataType.DT_INVALID)
        infos[alias] = TensorInfo(dtype, shape, str(info.get("name", "")))
    return infos


def error_message(content: bytes, fallback: str) -> str:
    """TF Serving's `{"error": "..."}` text, else the body itself (else `fallback`)."""
    try:
        body = loads(content)
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        return str(body["error"])
    return content[:500].decode("utf-8", "replace") or fallback
