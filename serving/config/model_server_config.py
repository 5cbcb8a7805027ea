"""The model server's configuration: a ``tensorflow.serving.ModelServerConfig`` proto.

``--model_config_file`` is read in protobuf text format, exactly like TF Serving's
``ParseProtoTextFile`` in ``model_servers/main.cc``::

    model_config_list {
      config {
        name: "half_plus_two"
        base_path: "/models/half_plus_two"
        model_platform: "tensorflow"
        model_version_policy { all {} }          # optional; default: latest 1
        version_labels { key: "stable" value: 1 }  # optional
      }
    }

Without it, ``--model_name`` / ``--model_base_path`` build the same proto
(``BuildSingleModelConfig``, :func:`serving.model_servers.server_config.load_config` chooses).
:func:`validate_config` applies ``ServerCore``'s checks
(``model_servers/server_core.cc``) with its messages: unique names, absolute base paths, platform
``tensorflow``. Errors are :class:`~serving.util.errors.ServingError` with code ``INVALID_ARGUMENT``
and a one-line message. The config protos import without TensorFlow, so this is fast.
"""

from __future__ import annotations

from tensorflow_serving.config import model_server_config_pb2
from tensorflow_serving.config.model_server_config_pb2 import ModelConfig, ModelServerConfig

from serving.util.errors import Code, ServingError
from serving.util.proto_util import read_text_proto_file

__all__ = [
    "TENSORFLOW_PLATFORM",
    "ModelServerConfig",
    "build_single_model_config",
    "read_config_file",
    "validate_config",
]

#: ``kTensorFlowModelPlatform``: the only platform this server runs.
TENSORFLOW_PLATFORM = "tensorflow"


def _invalid(message: str) -> ServingError:
    return ServingError(Code.INVALID_ARGUMENT, message)


def read_config_file(path: str) -> ModelServerConfig:
    """Parse a text-format ``ModelServerConfig`` file.

    Raises ``INVALID_ARGUMENT``: ``Invalid protobuf file: '<path>': <parser detail>`` (TF Serving's
    message plus the parser's reason), or ``Could not read model config file '<path>': <reason>``.
    """
    return read_text_proto_file(path, ModelServerConfig(), "model config")


def build_single_model_config(model_name: str, model_base_path: str) -> ModelServerConfig:
    """``BuildSingleModelConfig``: one model on the ``tensorflow`` platform, default policy."""
    config = ModelServerConfig()
    model = config.model_config_list.config.add()
    model.name = model_name
    model.base_path = model_base_path
    model.model_platform = TENSORFLOW_PLATFORM
    return config


def validate_config(config: ModelServerConfig) -> None:
    """``ServerCore::ReloadConfig`` checks, with TF Serving's messages.

    * ``custom_model_config`` is not supported;
    * ``Illegal to list model <name> multiple times in config list``;
    * ``Expected model <name> to have an absolute path or URI; got base_path()=<path>``;
    * ``Illegal setting neither ModelServerConfig::model_type (deprecated) nor
      ModelServerConfig::model_platform.`` / ``Model <name> requests unsupported platform <p>``.

    An empty config is valid: the server starts with no models, as TF Serving does.
    """
    choice = config.WhichOneof("config")
    if choice == "custom_model_config":
        raise _invalid("ModelServer does not yet support custom model config.")
    if choice is None:
        return
    seen: set[str] = set()
    for model in config.model_config_list.config:
        if model.name in seen:
            raise _invalid(f"Illegal to list model {model.name} multiple times in config list")
        seen.add(model.name)
    for model in config.model_config_list.config:
        if not _is_absolute_path_or_uri(model.base_path):
            raise _invalid(
                f"Expected model {model.name} to have an absolute path or URI; "
                f"got base_path()={model.base_path}"
            )
    for model in config.model_config_list.config:
        _check_platform(model)


def _check_platform(model: ModelConfig) -> None:
    """``GetPlatform`` plus ``CreateStoragePathRoutes``' unsupported-platform check."""
    if model.model_type != model_server_config_pb2.MODEL_TYPE_UNSPECIFIED:
        if model.model_platform:
            raise _invalid(
                "Illegal setting both ModelServerConfig::model_type (deprecated) and "
                "ModelServerConfig::model_platform."
            )
        if model.model_type != model_server_config_pb2.TENSORFLOW:
            raise _invalid(
                f"ModelServerConfig::model_type choice {model.model_type} not supported."
            )
        return
    if not model.model_platform:
        raise _invalid(
            "Illegal setting neither ModelServerConfig::model_type (deprecated) nor "
            "ModelServerConfig::model_platform."
        )
    if model.model_platform != TENSORFLOW_PLATFORM:
        raise _invalid(f"Model {model.name} requests unsupported platform {model.model_platform}")


def _is_absolute_path_or_uri(path: str) -> bool:
    """Not ``UriIsRelativePath``: a scheme (``gs://``) or an absolute path."""
    return "://" in path or path.startswith("/")
