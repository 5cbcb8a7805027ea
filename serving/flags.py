"""``tensorflow_model_server``'s command-line flags, parsed into :class:`ServerOptions`.

Same names, defaults and meaning as TF Serving's ``tensorflow_serving/model_servers/main.cc``;
both ``--flag=value`` and ``--flag value`` are accepted, booleans also as a bare ``--flag``.
Differences, on purpose:

* ``--rest_api_port`` defaults to 8501 (the binary's default is 0; TF Serving's Docker image
  passes 8501). ``--rest_api_port=0`` disables REST, as in TF Serving.
* ``--rest_api_host`` (extra): the REST bind address, default ``0.0.0.0`` like TF Serving.
* ``--rest_api_port`` equal to ``--port`` is an error here (TF Serving logs it and skips REST).
* ``--tensorflow_intra_op_parallelism`` / ``--tensorflow_inter_op_parallelism`` each fall back to
  ``--tensorflow_session_parallelism`` when 0 (TF Serving uses them only when both are set).
* Flags for features not built yet (batching, config polling, monitoring, TLS...) are accepted and
  stored so existing command lines keep working; :func:`unimplemented_flags` names the ones set.

Parsing is pure (no TensorFlow import), so a bad flag fails in milliseconds. Errors are raised as
:class:`FlagError` with a one-line message; ``--help`` prints usage and exits 0 (argparse).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass, fields

__all__ = [
    "FlagError",
    "ServerOptions",
    "parse_flags",
    "rest_api_num_threads",
    "saved_model_tags",
    "session_threads",
    "unimplemented_flags",
]


class FlagError(Exception):
    """A bad command line; the message is one line."""


def _default_num_threads() -> int:
    """TF Serving: ``4 * NumSchedulableCPUs()``."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return 4 * cpus


@dataclass(frozen=True)
class ServerOptions:
    """Every flag of the model server, with TF Serving's defaults."""

    port: int = 8500
    """gRPC port (stored; the gRPC front end is added later on this port)."""
    grpc_socket_path: str = ""
    """gRPC UNIX socket path (stored for the gRPC front end)."""
    grpc_channel_arguments: str = ""
    """gRPC channel arguments ``key=value,...`` (stored for the gRPC front end)."""
    grpc_max_threads: int = 0
    """gRPC server thread cap (stored for the gRPC front end)."""
    rest_api_port: int = 8501
    """HTTP/REST port; 0 disables the REST API."""
    rest_api_host: str = "0.0.0.0"
    """HTTP/REST bind address (extra flag; TF Serving always binds 0.0.0.0)."""
    rest_api_num_threads: int = 0
    """Threads running TensorFlow sessions for REST requests (0 -> 4 x schedulable CPUs)."""
    rest_api_timeout_in_ms: int = 30000
    """``Session.run`` timeout per REST request (``RunOptions.timeout_in_ms``); <= 0: none."""
    rest_api_enable_cors_support: bool = False
    """Add CORS headers to REST responses and answer pre-flight ``OPTIONS`` requests."""
    model_config_file: str = ""
    """A text-format ``ModelServerConfig``; when set, model_name/base_path are ignored."""
    model_config_file_poll_wait_seconds: int = 0
    """Config reload interval (accepted; reloading is not implemented yet)."""
    model_name: str = "default"
    """The single model's name when serving from ``--model_base_path``."""
    model_base_path: str = ""
    """The single model's base path (absolute), holding numeric version directories."""
    saved_model_tags: str = "serve"
    """Comma-separated MetaGraph tags to load from each SavedModel."""
    tensorflow_session_parallelism: int = 0
    """Default for both thread-pool sizes below (0 = TensorFlow's own choice)."""
    tensorflow_intra_op_parallelism: int = 0
    """Threads inside one op (``ConfigProto.intra_op_parallelism_threads``); 0 = default."""
    tensorflow_inter_op_parallelism: int = 0
    """Ops run concurrently (``ConfigProto.inter_op_parallelism_threads``); 0 = default."""
    allow_version_labels_for_unavailable_models: bool = False
    """Let version labels point at versions that are not AVAILABLE."""
    enable_signature_method_name_check: bool = False
    """Reject predict calls on signatures whose method_name is not predict/classify/regress."""
    enable_batching: bool = False
    """Server-side batching (accepted; not implemented yet)."""
    batching_parameters_file: str = ""
    """BatchingParameters text proto (accepted; not implemented yet)."""
    enable_model_warmup: bool = True
    """Replay ``assets.extra/tf_serving_warmup_requests`` (accepted; not implemented yet)."""
    file_system_poll_wait_seconds: int = 1
    """Version directory polling interval (accepted; versions are read once at start-up for now)."""
    max_num_load_retries: int = 5
    """Load retries (accepted; a failed load is not retried yet)."""
    load_retry_interval_micros: int = 60_000_000
    """Delay between load retries (accepted)."""
    num_load_threads: int = 0
    """Model-loading threads (accepted; versions load one at a time for now)."""
    monitoring_config_file: str = ""
    """MonitoringConfig text proto (accepted; metrics are not implemented yet)."""
    platform_config_file: str = ""
    """PlatformConfigMap text proto (accepted; only the ``tensorflow`` platform exists)."""
    per_process_gpu_memory_fraction: float = 0.0
    """GPU memory fraction (accepted; CPU only)."""
    ssl_config_file: str = ""
    """SSLConfig text proto for gRPC (accepted; stored for the gRPC front end)."""
    version: bool = False
    """Print the version and exit."""


# Flags whose non-default values change nothing yet (warned about at start-up).
_UNIMPLEMENTED = (
    "model_config_file_poll_wait_seconds",
    "enable_batching",
    "batching_parameters_file",
    "max_num_load_retries",
    "load_retry_interval_micros",
    "num_load_threads",
    "monitoring_config_file",
    "platform_config_file",
    "per_process_gpu_memory_fraction",
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]  # argparse's exits; ours raises
        raise FlagError(message)


def _parse_bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"invalid boolean value: {text!r}")


def _build_parser() -> _Parser:
    parser = _Parser(
        prog="python -m serving",
        description="A TensorFlow-Serving-compatible model server on the TensorFlow runtime.",
        allow_abbrev=False,
    )
    defaults = ServerOptions()
    for field in fields(ServerOptions):
        default = getattr(defaults, field.name)
        flag = f"--{field.name}"
        if isinstance(default, bool):
            parser.add_argument(
                flag, type=_parse_bool, nargs="?", const=True, default=default, metavar="BOOL"
            )
        else:
            parser.add_argument(flag, type=type(default), default=default)
    return parser


def parse_flags(argv: Sequence[str]) -> ServerOptions:
    """Parse and check a command line (without the program name).

    Raises :class:`FlagError` for unknown flags, bad values, ports out of range, ``--port`` equal
    to ``--rest_api_port``, and (unless ``--version``) neither ``--model_config_file`` nor
    ``--model_base_path`` given -- TF Serving's message ``Both server_options.model_base_path and
    server_options.model_config_file are empty!``.
    """
    namespace = _build_parser().parse_args(list(argv))
    options = ServerOptions(**vars(namespace))
    if options.version:
        return options
    for name in ("port", "rest_api_port"):
        value = getattr(options, name)
        if not 0 <= value <= 65535:
            raise FlagError(f"--{name}={value} is not a valid port")
    if options.rest_api_port and options.rest_api_port == options.port:
        raise FlagError(
            "--rest_api_port cannot be same as --port. "
            "Please use a different port for HTTP/REST API."
        )
    if options.rest_api_num_threads < 0:
        raise FlagError("--rest_api_num_threads must be >= 0")
    for name in (
        "tensorflow_session_parallelism",
        "tensorflow_intra_op_parallelism",
        "tensorflow_inter_op_parallelism",
    ):
        if getattr(options, name) < 0:
            raise FlagError(f"--{name} must be >= 0")
    if not options.model_base_path and not options.model_config_file:
        raise FlagError(
            "Both server_options.model_base_path and server_options.model_config_file are empty!"
        )
    if not [tag for tag in options.saved_model_tags.split(",") if tag]:
        raise FlagError("--saved_model_tags must name at least one tag")
    return options


def rest_api_num_threads(options: ServerOptions) -> int:
    """The effective REST thread count (0 means 4 x schedulable CPUs)."""
    return options.rest_api_num_threads or _default_num_threads()


def session_threads(options: ServerOptions) -> tuple[int, int]:
    """(intra_op, inter_op) thread-pool sizes for every Session; 0 lets TensorFlow choose."""
    fallback = options.tensorflow_session_parallelism
    return (
        options.tensorflow_intra_op_parallelism or fallback,
        options.tensorflow_inter_op_parallelism or fallback,
    )


def saved_model_tags(options: ServerOptions) -> tuple[str, ...]:
    """The MetaGraph tag-set to load."""
    return tuple(tag for tag in options.saved_model_tags.split(",") if tag)


def unimplemented_flags(options: ServerOptions) -> list[str]:
    """Flags set to non-default values that have no effect yet."""
    defaults = ServerOptions()
    return [name for name in _UNIMPLEMENTED if getattr(options, name) != getattr(defaults, name)]
