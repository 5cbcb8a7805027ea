"""Serving's model config (`--model_config_file`, TF Serving's `ModelServerConfig`), read without TensorFlow.

    python -m api.config.serving_config models.config      # prints each model's name, one
    per line

`run-server.sh` waits for exactly the models the config names. The file is a
`tensorflow.serving.ModelServerConfig` in the protobuf text format; it is parsed by
protobuf's own `text_format` into the project's copy of that message (`api.protos`, the
same field names and numbers as TF Serving's), not by a parser of our own: that gives
the very grammar and field checks `tensorflow_model_server` applies (comments, the
`config {…}`, `config: {…}` and `config <…>` forms, escapes, a config on one line, an
unknown field refused with its line and column), and protobuf is already installed
wherever the API runs (its gRPC client needs it). TF Serving's own generated module
would do as well, but it ships in `tensorflow-serving-api`, which depends on TensorFlow
(a 2.2 GB install): run-server.sh runs with the API's environment, which may have
neither when the model server is `tensorflow_model_server`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from google.protobuf import text_format

from api.protos.tensorflow_serving.config import model_server_config_pb2


class ModelConfigError(ValueError):
    """The file is not a `ModelServerConfig` with a list of models."""


def parse_model_server_config(text: str) -> model_server_config_pb2.ModelServerConfig:
    """Parse `text` (protobuf text format) as a `ModelServerConfig`.

    Raises:
        ModelConfigError: not that message (the parser's message, with line and column).
    """
    try:
        return text_format.Parse(text, model_server_config_pb2.ModelServerConfig())
    except text_format.ParseError as exc:
        raise ModelConfigError(str(exc)) from exc


def model_names(text: str) -> list[str]:
    """The `name` of every `model_config_list.config`, in order.

    Raises:
        ModelConfigError: the text does not parse, it has no `model_config_list` (a
            `custom_model_config` names no models), or a config has no name.
    """
    config = parse_model_server_config(text)
    if config.WhichOneof("config") != "model_config_list":
        raise ModelConfigError("no model_config_list: the config names no models")
    names = [model.name for model in config.model_config_list.config]
    if not names:
        raise ModelConfigError("model_config_list has no config")
    if not all(names):
        raise ModelConfigError("a model config has no name")
    return names


def served_models(path: Path | None) -> list[str] | None:
    """The model names of the config file at `path` (`SERVING_MODEL_CONFIG_FILE`), for messages;
    None when there is no path or the file cannot be read or parsed (the message then goes
    without them)."""
    if path is None:
        return None
    try:
        return model_names(path.read_text())
    except (OSError, UnicodeDecodeError, ModelConfigError):
        return None


def main(argv: list[str]) -> int:
    """`python -m api.config.serving_config FILE`: the model names, one per line; exit 2 on error."""
    if len(argv) != 1:
        print("usage: python -m api.config.serving_config MODEL_CONFIG_FILE", file=sys.stderr)
        return 2
    try:
        names = model_names(Path(argv[0]).read_text())
    except (OSError, UnicodeDecodeError, ModelConfigError) as exc:
        print(f"{argv[0]}: {exc}", file=sys.stderr)
        return 2
    print("\n".join(names))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
