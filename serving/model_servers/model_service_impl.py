"""``tensorflow.serving.ModelService`` on ``grpc.aio``: TF Serving's ``model_service_impl.cc``.

GetModelStatus (:mod:`serving.model_servers.get_model_status_impl`) and
HandleReloadConfigRequest (:meth:`ServableManager.reload_config
<serving.core.manager.ServableManager.reload_config>`, off the event loop).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from tensorflow_serving.apis import (
    get_model_status_pb2,
    model_management_pb2,
    model_service_pb2_grpc,
)
from tensorflow_serving.config.model_server_config_pb2 import ModelServerConfig

from serving.core.manager import ServableManager
from serving.model_servers.get_model_status_impl import get_model_status
from serving.util import proto_codec
from serving.util.errors import Code, ServingError

__all__ = ["ModelService", "ReloadConfig"]

_log = logging.getLogger(__name__)

ReloadConfig = Callable[[ModelServerConfig], Awaitable[None]]


class ModelService(model_service_pb2_grpc.ModelServiceServicer):  # type: ignore[misc]  # the wheel has no types
    """``tensorflow.serving.ModelService``.

    ``reload_config`` applies a new ``ModelServerConfig`` (``ServerCore::ReloadConfig``) and
    raises :class:`ServingError` when it is refused.
    """

    def __init__(self, manager: ServableManager, reload_config: ReloadConfig) -> None:
        self._manager = manager
        self._reload_config = reload_config

    async def GetModelStatus(  # noqa: N802
        self,
        request: get_model_status_pb2.GetModelStatusRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> get_model_status_pb2.GetModelStatusResponse:
        """``GetModelStatus``: every version's state (or the requested one's), latest first."""
        proto_codec.require_model_spec(request)
        spec = proto_codec.model_spec_from_proto(request.model_spec)
        return get_model_status(self._manager, spec)

    async def HandleReloadConfigRequest(  # noqa: N802
        self,
        request: model_management_pb2.ReloadConfigRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> model_management_pb2.ReloadConfigResponse:
        """``HandleReloadConfigRequest``: only a ``model_config_list`` config is accepted.

        On success the response's ``status`` is OK; a refused config is the call's error status
        (TF Serving also fills ``status``, which gRPC does not deliver with an error).
        """
        config = request.config
        if config.WhichOneof("config") != "model_config_list":
            raise ServingError(
                Code.INVALID_ARGUMENT,
                "ServerModelConfig type not supported by HandleReloadConfigRequest. Only "
                "ModelConfigList is currently supported",
            )
        for index, model in enumerate(config.model_config_list.config):
            _log.info(
                "Config entry index: %d path: %s name: %s platform: %s",
                index,
                model.base_path,
                model.name,
                model.model_platform,
            )
        await self._reload_config(config)
        response = model_management_pb2.ReloadConfigResponse()
        response.status.error_code = Code.OK
        return response
