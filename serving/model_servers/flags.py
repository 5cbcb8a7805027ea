"""``tensorflow_model_server``'s command-line flags, parsed into :class:`ServerOptions`.

Same names, defaults and meaning as TF Serving's ``tensorflow_serving/model_servers/main.cc``;
both ``--flag=value`` and ``--flag value`` are accepted, booleans also as a bare ``--flag``.
Differences, on purpose:

* ``--rest_api_port`` defaults to 8501 (the binary's default is 0; TF Serving's Docker image
  passes 8501). ``--rest_api_port=0`` disables REST, as in TF Serving.
* ``--rest_api_host`` (extra): the REST bind address, default ``0.0.0.0`` like TF Serving.
* ``--rest_api_port`` equal to ``--port`` is an error here (TF Serving logs it and skips REST).
* ``--tensorflow_intra_op_parallelism`` / ``--tensorflow_inter_op_parallelism`` each fall back to
  ``--tensorflow_session_parallelism`` when 0 (TF Serving uses them only when both are set), and
  then to the CPUs the container may use (:func:`schedulable_cpus`: cgroup quota and affinity),
  where TensorFlow would size its pools from the host's cores -- the usual oversubscription trap
  of TF Serving in a CPU-limited container.
* Defaults that TF Serving derives from the machine's CPUs (``--rest_api_num_threads``, the
  batch threads) use :func:`schedulable_cpus` too.
* Flags for features not built (platform config, GPU memory...) are accepted and
  stored so existing command lines keep working; :func:`unimplemented_flags` names the ones set.

Parsing is pure (no TensorFlow import), so a bad flag fails in milliseconds. Errors are raised as
:class:`FlagError` with a one-line message; ``--help`` prints usage and exits 0 (argparse).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, fields

import cpu_quota

__all__ = [
    "FlagError",
    "ServerOptions",
    "grpc_channel_arguments",
    "parse_flags",
    "rest_api_num_threads",
    "saved_model_tags",
    "schedulable_cpus",
    "session_threads",
    "unimplemented_flags",
]


class FlagError(Exception):
    """A bad command line; the message is one line."""


def schedulable_cpus() -> int:
    """TF Serving's ``NumSchedulableCPUs()`` / ``port::MaxParallelism()``, container-aware.

    Whole CPUs this process may use: the affinity mask, capped by the cgroup CPU quota (v2
    ``cpu.max``, v1 CFS quota/period) rounded up -- see :mod:`cpu_quota`.
    """
    return cpu_quota.available_cpus()


def _default_num_threads() -> int:
    """TF Serving: ``4 * NumSchedulableCPUs()``."""
    return 4 * schedulable_cpus()


@dataclass(frozen=True)
class ServerOptions:
    """Every flag of the model server, with TF Serving's defaults."""

    port: int = 8500
    """gRPC port (PredictionService, ModelService); 0 disables the TCP listener."""
    grpc_host: str = "0.0.0.0"
    """gRPC bind address (extra flag; TF Serving always binds 0.0.0.0)."""
    grpc_socket_path: str = ""
    """Also serve gRPC on this UNIX socket (``unix:<path>``)."""
    grpc_channel_arguments: str = ""
    """gRPC server arguments ``key=value,...`` (integers passed as ints), applied after the
    defaults, e.g. ``grpc.max_receive_message_length=67108864`` to lower the INT_MAX limit."""
    grpc_max_threads: int = 0
    """Most RPCs handled at once; more get ``RESOURCE_EXHAUSTED`` as gRPC's thread quota gives
    (0 = no cap; TF Serving's default is 4 x schedulable CPUs, threads that also run sessions)."""
    grpc_response_tensor_content: bool = False
    """Write numeric Predict outputs to ``tensor_content`` (TF Serving's ``kAsProtoContent``)
    instead of the typed ``*_val`` fields (``kAsProtoField``, TF Serving's default); extra flag."""
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
    """Re-read ``--model_config_file`` and reload it every N seconds (0: read once, at start)."""
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
    """Merge concurrent requests into batches (:mod:`serving.batching.batching_session`)."""
    batching_parameters_file: str = ""
    """``BatchingParameters`` text proto for ``--enable_batching`` (default: TF Serving's)."""
    enable_model_warmup: bool = True
    """Replay ``assets.extra/tf_serving_warmup_requests`` before a version becomes AVAILABLE."""
    num_request_iterations_for_warmup: int = 0
    """Times each warmup record is replayed (used when > 0; otherwise once)."""
    file_system_poll_wait_seconds: int = 1
    """Seconds between polls of each base path for version directories (0: poll once)."""
    max_num_load_retries: int = 5
    """Retries of a failed version load before it is END with the error (0: one attempt)."""
    load_retry_interval_micros: int = 60_000_000
    """Wait between load retries, in microseconds (negative: no wait)."""
    num_load_threads: int = 0
    """Threads loading versions concurrently (0 or 1: one at a time)."""
    monitoring_config_file: str = ""
    """``MonitoringConfig`` text proto: serve Prometheus metrics on the REST port
    (:mod:`serving.util.metrics`)."""
    platform_config_file: str = ""
    """PlatformConfigMap text proto (accepted; only the ``tensorflow`` platform exists)."""
    per_process_gpu_memory_fraction: float = 0.0
    """GPU memory fraction (accepted; CPU only)."""
    ssl_config_file: str = ""
    """``SSLConfig`` text proto: serve gRPC over TLS (see :mod:`serving.model_servers.prediction_service_impl`)."""
    version: bool = False
    """Print the version and exit."""


# Flags whose non-default values change nothing yet (warned about at start-up).
_UNIMPLEMENTED = (
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
    if options.grpc_max_threads < 0:
        raise FlagError("--grpc_max_threads must be >= 0")
    grpc_channel_arguments(options)  # raises FlagError for a malformed list
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


def grpc_channel_arguments(options: ServerOptions) -> list[tuple[str, int | str]]:
    """``--grpc_channel_arguments`` as gRPC options: ``parseGrpcChannelArgs`` of TF Serving's
    server.cc -- split on ``,`` then on the first ``=``; a value that parses as a 32-bit integer
    is passed as an int, anything else as a string. Empty items are skipped.

    Raises :class:`FlagError` for an item without ``=`` or with an empty key (TF Serving
    crashes on those).
    """
    arguments: list[tuple[str, int | str]] = []
    for item in options.grpc_channel_arguments.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise FlagError(f"--grpc_channel_arguments: expected key=value, got {item!r}")
        value = value.strip()
        try:
            number = int(value)
        except ValueError:
            arguments.append((key, value))
            continue
        arguments.append((key, number) if -(2**31) <= number < 2**31 else (key, value))
    return arguments


def session_threads(options: ServerOptions) -> tuple[int, int]:
    """(intra_op, inter_op) thread-pool sizes for every Session.

    Each is its own flag, else ``--tensorflow_session_parallelism``, else
    :func:`schedulable_cpus` -- never 0, which would let TensorFlow size both pools from the
    host's cores whatever the container's CPU quota.
    """
    fallback = options.tensorflow_session_parallelism or schedulable_cpus()
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
