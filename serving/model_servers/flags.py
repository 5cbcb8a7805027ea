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
* Request limits TF Serving does not have (it reads any REST body and head, however large or
  slow): ``--rest_api_max_body_bytes``, ``--rest_api_max_header_bytes``,
  ``--rest_api_body_read_timeout_in_ms``, ``--rest_api_max_buffered_body_bytes``,
  ``--rest_api_shutdown_body_read_timeout_in_ms``, ``--max_request_elements``; see
  :class:`~serving.util.request_limits.RequestLimits`. gRPC's message limit stays TF Serving's.
* Flags for features not built (platform config, GPU memory...) are accepted and
  stored so existing command lines keep working; :func:`unimplemented_flags` names the ones set.

Parsing is pure (no TensorFlow import), so a bad flag fails in milliseconds. Errors are raised as
:class:`FlagError` with a one-line message; ``--help`` prints usage and exits 0 (argparse).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any, NoReturn

import cpu_quota
from serving.util.request_limits import RequestLimits

__all__ = [
    "FlagError",
    "ServerOptions",
    "grpc_channel_arguments",
    "parse_flags",
    "request_limits",
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


def _flag(default: Any, help: str) -> Any:  # noqa: A002 - argparse's word
    """A :class:`ServerOptions` field: its default and its ``--help`` text (the one description)."""
    return field(default=default, metadata={"help": help})


#: The request limits' defaults (flags of ours: TF Serving has none of these). The body limit is
#: the largest Predict the API tier can send for a request its own limits let in: an OIP request
#: of `OIP__MAX_BODY_BYTES` (4 MiB) with binary data grows as TF Serving's columnar JSON (a float32
#: written as a double's shortest text, `false` for a BOOL byte, brackets per row): measured, 4 MiB
#: of FP32 rows of 11 became 19.4 MiB, of FP32 [N, 1] 21.3 MiB, of BOOL [N, 1] 30.0 MiB; 64 MiB,
#: the buffered-body budget, leaves room for that. What a large body costs the others is bounded
#: by the JSON worker processes (`--rest_api_num_json_processes`), which parse bodies of 64 KiB and
#: more off the event loop at the lowest CPU priority: measured on a shared 2-core machine, a
#: 1 MiB fraud body (7,300 rows) takes ~10-12 ms to parse, a 16 MiB one ~240 ms. The head limit
#: is 4x what most HTTP servers allow (nginx 8 KiB per line, Node 16 KiB). The element cap (64 MiB
#: of float32; 100 images of 224x224x3) is what bounds a gRPC request's tensors before they are
#: allocated.
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_HEADER_BYTES = 64 * 1024
DEFAULT_BODY_READ_TIMEOUT_MS = 30_000
DEFAULT_MAX_REQUEST_ELEMENTS = 16 * 1024 * 1024
DEFAULT_MAX_BUFFERED_BODY_BYTES = 64 * 1024 * 1024
DEFAULT_SHUTDOWN_BODY_READ_TIMEOUT_MS = 5_000


@dataclass(frozen=True)
class ServerOptions:
    """Every flag of the model server, with TF Serving's defaults; each field's ``help`` is its
    ``--help`` text, in TF Serving's words (``main.cc``) where the flag is TF Serving's."""

    port: int = _flag(
        8500, "TCP port to listen on for gRPC/HTTP API. Disabled if port set to zero."
    )
    grpc_host: str = _flag(
        "0.0.0.0", "(ours) Address to bind the gRPC port to; TF Serving always binds 0.0.0.0."
    )
    grpc_socket_path: str = _flag(
        "",
        "If non-empty, listen to a UNIX socket for gRPC API on the given path. Can be either "
        "relative or absolute path.",
    )
    grpc_channel_arguments: str = _flag(
        "",
        "A comma separated list of arguments to be passed to the grpc server. (e.g. "
        "grpc.max_connection_age_ms=2000) Integers are passed as ints, after the defaults; "
        "messages are accepted up to 2 GiB both ways (TF Serving's INT_MAX), lower it with "
        "grpc.max_receive_message_length=N.",
    )
    grpc_max_threads: int = _flag(
        0,
        "Max grpc server threads to handle grpc messages. Here: most RPCs handled at once, "
        "more get RESOURCE_EXHAUSTED (0 = no cap).",
    )
    grpc_response_tensor_content: bool = _flag(
        False,
        "(ours) Write numeric Predict outputs to tensor_content instead of the typed *_val "
        "fields (TF Serving's default), cheaper for large outputs.",
    )
    rest_api_port: int = _flag(
        8501,
        "Port to listen on for HTTP/REST API. If set to zero HTTP/REST API will not be "
        "exported. This port must be different than the one specified in --port.",
    )
    rest_api_host: str = _flag(
        "0.0.0.0", "(ours) Address to bind the HTTP/REST port to; TF Serving always binds 0.0.0.0."
    )
    session_run_inline_below_us: int = _flag(
        0,
        "(ours) Without --enable_batching: run a Session whose recent runs (per servable version "
        "and batch size) took less than this many microseconds on the event loop instead of a "
        "request thread, saving two thread wake-ups per request for small models. 0: never.",
    )
    rest_api_socket_path: str = _flag(
        "",
        "(ours) If non-empty, also serve the HTTP/REST API on a UNIX socket at this path (as "
        "--grpc_socket_path does for gRPC); a client on the same host skips the TCP stack.",
    )
    rest_api_num_threads: int = _flag(
        0,
        "Number of threads for HTTP/REST API processing. If not set, will be auto set based "
        "on number of CPUs.",
    )
    rest_api_timeout_in_ms: int = _flag(
        30000, "Timeout for HTTP/REST API calls. (Bounds each Session run; <= 0: none.)"
    )
    rest_api_enable_cors_support: bool = _flag(False, "Enable CORS headers in response")
    rest_api_num_json_processes: int = _flag(
        1,
        "(ours) Worker processes, at the lowest CPU priority, that parse and decode HTTP/REST "
        "request bodies of 64 KiB and more and encode answers of 4,096 output elements and "
        "more, so that one client's large requests do not slow the others; while all are busy "
        "64 more such requests may wait, then 503. 0: on the request threads instead.",
    )
    rest_api_json_process_timeout_in_ms: int = _flag(
        10000,
        "(ours) The longest a request waits for the JSON worker processes, queued and "
        "running: at the lowest CPU priority they may get no CPU while normal-priority "
        "processes keep every core busy; past it the request is answered 503. <= 0: no bound.",
    )
    rest_api_max_body_bytes: int = _flag(
        DEFAULT_MAX_BODY_BYTES,
        "(ours) Largest HTTP/REST request body, in bytes; a larger one is answered 413 "
        "before it is read past the limit, and its connection closed. 0: no limit.",
    )
    rest_api_max_header_bytes: int = _flag(
        DEFAULT_MAX_HEADER_BYTES,
        "(ours) Largest HTTP/REST request head (request line and headers), in bytes; a "
        "larger one is answered 431 before it is parsed past the limit, and its connection "
        "closed. When this is above 64 KiB, a URL over 65,535 bytes is answered 414 (the HTTP "
        "parser's own limit); under it such a URL makes the head too large first (431).",
    )
    rest_api_body_read_timeout_in_ms: int = _flag(
        DEFAULT_BODY_READ_TIMEOUT_MS,
        "(ours) Time a client has to send a request's head, and then its whole body, over "
        "HTTP/REST, in milliseconds; past it the request is answered 408 and its connection "
        "closed. 0: no timeout (as in TF Serving, a client may send as slowly as it likes).",
    )
    rest_api_max_buffered_body_bytes: int = _flag(
        DEFAULT_MAX_BUFFERED_BODY_BYTES,
        "(ours) Most bytes of HTTP/REST request bodies being received at once, over all "
        "connections (bodies under 64 KiB are not counted); a body that does not fit, by its "
        "Content-Length or as a chunked body grows, is answered 503 at once and its connection "
        "closed. Bodies larger than this are never accepted. 0: no limit.",
    )
    rest_api_shutdown_body_read_timeout_in_ms: int = _flag(
        DEFAULT_SHUTDOWN_BODY_READ_TIMEOUT_MS,
        "(ours) Once the server is shutting down (SIGTERM), time an HTTP/REST request still "
        "receiving its body has left to receive it, in milliseconds; then it is answered 503 "
        "and its connection closed, so a slow client cannot hold the shutdown. Requests that "
        "have their body finish. 0: closed at once.",
    )
    max_request_elements: int = _flag(
        DEFAULT_MAX_REQUEST_ELEMENTS,
        "(ours) Most values a request may carry, over REST and gRPC: the elements of all "
        "its input tensors (Predict) or its tf.Examples (Classify, Regress, MultiInference); "
        "more is refused (REST 413, gRPC RESOURCE_EXHAUSTED) before the tensors are "
        "allocated. 0: no limit.",
    )
    model_config_file: str = _flag(
        "",
        "If non-empty, read an ascii ModelServerConfig protobuf from the supplied file name, "
        "and serve the models in that file. This config file can be used to specify multiple "
        "models to serve and other advanced parameters including non-default version policy. "
        "(If used, --model_name, --model_base_path are ignored.)",
    )
    model_config_file_poll_wait_seconds: int = _flag(
        0,
        "Interval in seconds between each poll of the filesystem for model_config_file. If "
        "unset or set to zero, poll will be done exactly once and not periodically.",
    )
    model_name: str = _flag(
        "default", "name of model (ignored if --model_config_file flag is set)"
    )
    model_base_path: str = _flag(
        "", "path to export (ignored if --model_config_file flag is set, otherwise required)"
    )
    saved_model_tags: str = _flag(
        "serve",
        "Comma-separated set of tags corresponding to the meta graph def to load from "
        "SavedModel.",
    )
    tensorflow_session_parallelism: int = _flag(
        0,
        "Number of threads to use for running a Tensorflow session. Auto-configured by "
        "default (here: from the CPUs the container may use).",
    )
    tensorflow_intra_op_parallelism: int = _flag(
        0,
        "Number of threads to use to parallelize the execution of an individual op. "
        "Auto-configured by default.",
    )
    tensorflow_inter_op_parallelism: int = _flag(
        0,
        "Controls the number of operators that can be executed simultaneously. "
        "Auto-configured by default.",
    )
    allow_version_labels_for_unavailable_models: bool = _flag(
        False,
        "If true, allows assigning unused version labels to models that are not available "
        "yet.",
    )
    enable_signature_method_name_check: bool = _flag(
        False,
        "Enable method_name check for SignatureDef. Disable this if serving native TF2 "
        "regression/classification models.",
    )
    enable_batching: bool = _flag(False, "enable batching")
    batching_parameters_file: str = _flag(
        "",
        "If non-empty, read an ascii BatchingParameters protobuf from the supplied file name "
        "and use the contained values instead of the defaults.",
    )
    enable_model_warmup: bool = _flag(
        True,
        "Enables model warmup, which triggers lazy initializations (such as TF optimizations) "
        "at load time, to reduce first request latency.",
    )
    num_request_iterations_for_warmup: int = _flag(
        0,
        "Number of times a request is iterated during warmup replay. This value is used only "
        "if > 0.",
    )
    file_system_poll_wait_seconds: int = _flag(
        1,
        "Interval in seconds between each poll of the filesystem for new model version. If "
        "set to zero poll will be exactly done once and not periodically.",
    )
    max_num_load_retries: int = _flag(
        5,
        "maximum number of times it retries loading a model after the first failure, before "
        "giving up. If set to 0, a load is attempted only once. Default: 5",
    )
    load_retry_interval_micros: int = _flag(
        60_000_000,
        "The interval, in microseconds, between each servable load retry. If set negative, "
        "it doesn't wait. Default: 1 minute",
    )
    num_load_threads: int = _flag(
        0,
        "The number of threads in the thread-pool used to load servables. If set as 0, we "
        "don't use a thread-pool, and servable loads are performed serially.",
    )
    monitoring_config_file: str = _flag(
        "",
        "If non-empty, read an ascii MonitoringConfig protobuf from the supplied file name",
    )
    platform_config_file: str = _flag(
        "",
        "If non-empty, read an ascii PlatformConfigMap protobuf from the supplied file name. "
        "(Accepted; only the tensorflow platform exists here.)",
    )
    per_process_gpu_memory_fraction: float = _flag(
        0.0,
        "Fraction that each process occupies of the GPU memory space. (Accepted; CPU only.)",
    )
    ssl_config_file: str = _flag(
        "",
        "If non-empty, read an ascii SSLConfig protobuf from the supplied file name and set "
        "up a secure gRPC channel",
    )
    version: bool = _flag(False, "Display version")


# Flags whose non-default values change nothing yet (warned about at start-up).
_UNIMPLEMENTED = (
    "platform_config_file",
    "per_process_gpu_memory_fraction",
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's exits; ours raises
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
    for option in fields(ServerOptions):
        default = getattr(defaults, option.name)
        flag = f"--{option.name}"
        text = f"{option.metadata['help']} (default: {default!r})"
        if isinstance(default, bool):
            parser.add_argument(
                flag,
                type=_parse_bool,
                nargs="?",
                const=True,
                default=default,
                metavar="BOOL",
                help=text.replace("%", "%%"),
            )
        else:
            parser.add_argument(
                flag, type=type(default), default=default, help=text.replace("%", "%%")
            )
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
    for name in (
        "rest_api_max_body_bytes",
        "rest_api_max_header_bytes",
        "rest_api_body_read_timeout_in_ms",
        "rest_api_max_buffered_body_bytes",
        "rest_api_shutdown_body_read_timeout_in_ms",
        "max_request_elements",
    ):
        if getattr(options, name) < 0:
            raise FlagError(f"--{name} must be >= 0")
    budget, max_body = options.rest_api_max_buffered_body_bytes, options.rest_api_max_body_bytes
    if budget and max_body and budget < max_body:
        raise FlagError(
            "--rest_api_max_buffered_body_bytes must be at least --rest_api_max_body_bytes "
            "(or 0): a larger body would never be accepted"
        )
    if options.rest_api_max_header_bytes < 1024:
        raise FlagError("--rest_api_max_header_bytes must be at least 1024")
    if options.rest_api_num_threads < 0:
        raise FlagError("--rest_api_num_threads must be >= 0")
    if options.session_run_inline_below_us < 0:
        raise FlagError("--session_run_inline_below_us must be >= 0")
    if options.rest_api_num_json_processes < 0:
        raise FlagError("--rest_api_num_json_processes must be >= 0")
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


def request_limits(options: ServerOptions) -> RequestLimits:
    """The request limits the flags set (0 in a flag: that limit is off)."""
    return RequestLimits(
        max_body_bytes=options.rest_api_max_body_bytes or None,
        max_header_bytes=options.rest_api_max_header_bytes,
        read_timeout_s=(options.rest_api_body_read_timeout_in_ms / 1000) or None,
        max_elements=options.max_request_elements or None,
        max_buffered_body_bytes=options.rest_api_max_buffered_body_bytes or None,
        shutdown_read_timeout_s=options.rest_api_shutdown_body_read_timeout_in_ms / 1000,
    )


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
