"""``ParseProtoTextFile`` (TF Serving's ``util/proto_util.h``): a text-format proto file, read.

Every config file the server takes is one: ``--model_config_file``, ``--batching_parameters_file``,
``--monitoring_config_file``, ``--ssl_config_file``.
"""

from __future__ import annotations

from typing import TypeVar

from google.protobuf import text_format
from google.protobuf.message import Message

from serving.util.errors import Code, ServingError

__all__ = ["read_text_proto_file"]

MessageT = TypeVar("MessageT", bound=Message)


def read_text_proto_file(path: str, message: MessageT, what: str) -> MessageT:
    """Parse the text-format proto file at ``path`` into ``message`` (``ParseProtoTextFile``).

    ``what`` names the file in errors (``model config``, ``batching parameters``). Raises
    ``INVALID_ARGUMENT``: ``Could not read <what> file '<path>': <reason>`` or ``Invalid protobuf
    file: '<path>': <parser detail>``.
    """
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ServingError(Code.INVALID_ARGUMENT, f"Could not read {what} file '{path}': {reason}") from None
    try:
        return text_format.Parse(text, message)
    except text_format.ParseError as exc:
        detail = " ".join(str(exc).split())
        raise ServingError(Code.INVALID_ARGUMENT, f"Invalid protobuf file: '{path}': {detail}") from None
