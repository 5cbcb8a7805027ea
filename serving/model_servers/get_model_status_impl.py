"""Model status: TF Serving's ``GetModelStatus`` (``model_servers/get_model_status_impl.cc``).

:func:`get_model_status` builds the real ``tensorflow.serving.GetModelStatusResponse`` from the
manager's :class:`~serving.core.servable_state.ServableState` of each version, so the gRPC front
end returns it as it is; :func:`model_status_json` renders it for REST with
``google.protobuf.json_format`` the way TF Serving's ``ToJsonString``
(``model_servers/http_rest_api_util.cc``) does::

    {"model_version_status": [{"version": "1", "state": "AVAILABLE",
                               "status": {"error_code": "OK", "error_message": ""}}]}

Versions latest first; a version whose load failed shows ``"state": "END"`` and its error. A
version label in the request is ignored (all versions are listed), as in TF Serving.
"""

from __future__ import annotations

import orjson
from google.protobuf import json_format
from tensorflow_serving.apis.get_model_status_pb2 import GetModelStatusResponse

from serving.apis import ModelSpec
from serving.core.manager import ServableManager
from serving.util.errors import Code, ServingError

__all__ = ["get_model_status", "model_status_json"]


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


def model_status_json(response: GetModelStatusResponse) -> bytes:
    """The REST body for a status response (``ToJsonString(GetModelStatusResponse)``)."""
    return orjson.dumps(
        json_format.MessageToDict(response, always_print_fields_with_no_presence=True)
    )
