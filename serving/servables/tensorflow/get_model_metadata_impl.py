"""Model metadata: TF Serving's ``GetModelMetadata`` (``servables/tensorflow/get_model_metadata_impl.cc``).

:func:`get_model_metadata` builds the real ``tensorflow.serving.GetModelMetadataResponse``, so the
gRPC front end returns it as it is; :func:`model_metadata_json` renders it for REST with
``google.protobuf.json_format`` the way TF Serving's ``ToJsonString``
(``model_servers/http_rest_api_util.cc``) does, proto field names preserved and default values
printed::

    {"model_spec": {"name": "m", "signature_name": "", "version": "1"},
     "metadata": {"signature_def": {"signature_def": {"serving_default": {...}}}}}
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson
from google.protobuf import json_format
from tensorflow_serving.apis.get_model_metadata_pb2 import GetModelMetadataResponse, SignatureDefMap

from serving.apis import ModelSpec
from serving.core.manager import ServableManager
from serving.util.errors import Code, ServingError

__all__ = ["SIGNATURE_DEF_FIELD", "get_model_metadata", "model_metadata_json"]

#: ``GetModelMetadataImpl::kSignatureDef``: the only metadata field there is.
SIGNATURE_DEF_FIELD = "signature_def"


def get_model_metadata(
    manager: ServableManager,
    spec: ModelSpec,
    metadata_fields: Iterable[str] = (SIGNATURE_DEF_FIELD,),
) -> GetModelMetadataResponse:
    """``GetModelMetadataWithModelSpec``: the servable's SignatureDefs.

    Raises ``INVALID_ARGUMENT`` for no or unknown ``metadata_fields`` (TF Serving's messages) and
    the manager's lookup errors (``Servable not found for request: ...``).
    """
    fields = list(metadata_fields)
    if not fields:
        raise ServingError(
            Code.INVALID_ARGUMENT,
            "GetModelMetadataRequest must specify at least one metadata_field",
        )
    for field in fields:
        if field != SIGNATURE_DEF_FIELD:
            raise ServingError(Code.INVALID_ARGUMENT, f"Metadata field {field} is not supported")
    signature_defs = SignatureDefMap()
    with manager.acquire(spec) as handle:
        for name, signature in handle.servable.signature_defs.items():
            signature_defs.signature_def[name].CopyFrom(signature)
    response = GetModelMetadataResponse()
    response.model_spec.name = handle.name
    response.model_spec.version.value = handle.version
    response.metadata[SIGNATURE_DEF_FIELD].Pack(signature_defs)
    return response


def _to_dict(message: Any) -> dict[str, Any]:
    result: dict[str, Any] = json_format.MessageToDict(
        message,
        always_print_fields_with_no_presence=True,
        preserving_proto_field_name=True,
    )
    return result


def model_metadata_json(response: GetModelMetadataResponse) -> bytes:
    """The REST body for a metadata response (``ToJsonString(GetModelMetadataResponse)``)."""
    signature_defs = SignatureDefMap()
    if not response.metadata[SIGNATURE_DEF_FIELD].Unpack(signature_defs):
        raise ServingError(Code.INTERNAL, "Failed to unpack 'Any' object to 'SignatureDefMap'.")
    body = {
        "model_spec": _to_dict(response.model_spec),
        "metadata": {SIGNATURE_DEF_FIELD: _to_dict(signature_defs)},
    }
    return orjson.dumps(body)
