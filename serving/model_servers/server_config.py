"""What the flags point at, read and checked: the model config and the batching parameters.

``Server::BuildAndStart``'s reading of its options (``model_servers/server.cc``): the
``--model_config_file`` (or the single model ``--model_name`` / ``--model_base_path`` describe)
and, with ``--enable_batching``, the ``--batching_parameters_file``. Nothing here imports
TensorFlow, so :mod:`~serving.model_servers.main` checks them before it loads and a bad file
fails start-up at once.
"""

from __future__ import annotations

from serving.batching.batching_options import BatchingOptions, read_batching_parameters_file
from serving.config.model_server_config import (
    ModelServerConfig,
    build_single_model_config,
    read_config_file,
    validate_config,
)
from serving.model_servers.flags import ServerOptions, schedulable_cpus

__all__ = ["batching_options", "load_config"]


def load_config(options: ServerOptions) -> ModelServerConfig:
    """The config the flags describe, validated: the file if given, else the single model."""
    if options.model_config_file:
        config = read_config_file(options.model_config_file)
    else:
        config = build_single_model_config(options.model_name, options.model_base_path)
    validate_config(config)
    return config


def batching_options(options: ServerOptions) -> BatchingOptions | None:
    """The server's batching options from its flags; ``None`` without ``--enable_batching``.

    ``--batching_parameters_file`` is read when given (else TF Serving's defaults, batch threads
    named ``model_server_batch_threads``); unset ``num_batch_threads`` is the schedulable CPUs
    (:func:`~serving.model_servers.flags.schedulable_cpus`). A file given without ``--enable_batching`` is
    ignored, as TF Serving ignores it. Raises ``INVALID_ARGUMENT`` for a bad file or values.
    """
    if not options.enable_batching:
        return None
    parameters = (
        read_batching_parameters_file(options.batching_parameters_file)
        if options.batching_parameters_file
        else None
    )
    return BatchingOptions.from_parameters(
        parameters, default_num_batch_threads=schedulable_cpus()
    )
