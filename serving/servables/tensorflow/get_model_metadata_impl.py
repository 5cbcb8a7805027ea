"""Model status and model metadata: TF Serving's ``GetModelStatus`` and ``GetModelMetadata``.

Both build the real ``tensorflow.serving`` response protos, so a gRPC front end returns them as
they are and the REST front end renders them with ``google.protobuf.json_format`` the way TF
Serving's ``ToJsonString`` (``model_servers/http_rest_api_util.cc``) does:

* status (``model_servers/get_model_status_impl.cc``)::

    {"model_version_status": [{"version": "1", "state": "AVAILABLE",
                               "status": {"error_code": "OK", "error_message": ""}}]}

  versions latest first; a version whose load failed shows ``"state": "END"`` and its error.
  A version label in the request is ignored (all versions are listed), as in TF Serving.
* metadata (``servables/tensorflow/get_model_metadata_impl.cc``)::

    {"model_spec": {"name": "m", "signature_name": "", "version": "1"},
     "metadata": {"signature_def": {"signature_def": {"serving_default": {...}}}}}

  with proto field names preserved and default values printed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson
from google.protobuf import json_format
from tensorflow_serving.apis.get_model_metadata_pb2 import GetModelMetadataResponse, SignatureDefMap
from tensorflow_serving.apis.get_model_status_pb2 import GetModelStatusResponse

from serving.apis import ModelSpec
from serving.core.manager import ServableManager
from serving.util.errors import Code, ServingError

__all__ = [
    "SIGNATURE_DEF_FIELD",
    "get_model_metadata",
    "get_model_status",
    "model_metadata_json",
    "model_status_json",
]

#: ``GetModelMetadataImpl::kSignatureDef``: the only metadata field there is.
SIGNATURE_DEF_FIELD = "signature_def"


def get_model_status(manager: ServableManager, spec: ModelSpec) -> GetModelStatusResponse:
    """``GetModelStatusWithModelSpec``.

    Raises ``NOT_FOUND``: ``Could not find version <v> of model <name>`` /
    ``Could not find any versions of model <name>``.
    """
    states = manager.version_states(spec.name)
    if spec.version is not None:
        if spec.version not in states:
            raise ServingError(
                Code.NOT_FOUND, f"Could not find version {spec.version} of model {spec.name}"
            )
        states = {spec.version: states[spec.version]}
    elif not states:
        raise ServingError(Code.NOT_FOUND, f"Could not find any versions of model {spec.name}")
    response = GetModelStatusResponse()
    for version, state in states.items():
        entry = response.model_version_status.add()
        entry.version = version
        entry.state = int(state.state)
        entry.status.SetInParent()  # always present: {"error_code": "OK", "error_message": ""}
        if state.health is not None:
            entry.status.error_code = int(state.health.code)
            entry.status.error_message = state.health.message
    return response


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


def _to_dict(message: Any, *, preserve_names: bool) -> dict[str, Any]:
    result: dict[str, Any] = json_format.MessageToDict(
        message,
        always_print_fields_with_no_presence=True,
        preserving_proto_field_name=preserve_names,
    )
    return result


def model_status_json(response: GetModelStatusResponse) -> bytes:
    """The REST body for a status response (``ToJsonString(GetModelStatusResponse)``)."""
    return orjson.dumps(_to_dict(response, preserve_names=False))


def model_metadata_json(response: GetModelMetadataResponse) -> bytes:
    """The REST body for a metadata response (``ToJsonString(GetModelMetadataResponse)``)."""
    signature_defs = SignatureDefMap()
    if not response.metadata[SIGNATURE_DEF_FIELD].Unpack(signature_defs):
        raise ServingError(Code.INTERNAL, "Failed to unpack 'Any' object to 'SignatureDefMap'.")
    body = {
        "model_spec": _to_dict(response.model_spec, preserve_names=True),
        "metadata": {SIGNATURE_DEF_FIELD: _to_dict(signature_defs, preserve_names=True)},
    }
    return orjson.dumps(body)
