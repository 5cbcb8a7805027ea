"""``python -m serving``: tensorflow_model_server's command line.

    python -m serving --port=8500 --rest_api_port=8501 \\
        --model_name=half_plus_two --model_base_path=/models/half_plus_two
    python -m serving --rest_api_port=8501 --model_config_file=/models/models.config

Flags are parsed and the config is read and validated before TensorFlow is imported, so a bad
command line or config file fails in well under a second with one line on stderr and exit code 2
(flags) or 1 (config, start-up). Version labels in the config fail here too unless
``--allow_version_labels_for_unavailable_models`` is set, as in TF Serving (no version is
AVAILABLE before start-up; see :mod:`serving.core.version_labels`). A clean shutdown on SIGTERM/SIGINT
exits 0.
"""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Sequence
from types import FrameType

from serving.config.monitoring_config import prometheus_path
from serving.core.version_labels import update_model_version_label_map
from serving.model_servers import flags
from serving.model_servers.server_config import batching_options, load_config
from serving.util.errors import ServingError
from serving.util.lean_import import keep_optional_packages_out

_PROG = "python -m serving"


def _fail(message: str) -> None:
    print(f"{_PROG}: error: {' '.join(message.split())}", file=sys.stderr)


def _exit_cleanly(signum: int, frame: FrameType | None) -> None:
    """SIGTERM while TensorFlow imports or models are read: stop now, exit code 0."""
    raise SystemExit(0)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the model server; returns the exit code."""
    try:
        options = flags.parse_flags(sys.argv[1:] if argv is None else argv)
    except flags.FlagError as exc:
        _fail(str(exc))
        return 2
    if options.version:
        from importlib.metadata import version

        print(f"TensorFlow ModelServer: {version('tensorflow-serving-api')}-tfserve-split")
        print(f"TensorFlow Library: {version('tensorflow')}")
        return 0

    # Until the server's event loop takes the signals over, SIGTERM just ends start-up.
    signal.signal(signal.SIGTERM, _exit_cleanly)
    try:
        config = load_config(options)
        # ServerCore checks labels before loading anything: at start-up nothing is AVAILABLE yet.
        update_model_version_label_map(
            config,
            available={},
            current={},
            allow_version_labels_for_unavailable_models=(
                options.allow_version_labels_for_unavailable_models
            ),
        )
        # The other config files too, before TensorFlow loads (the server reads them again).
        batching_options(options)
        prometheus_path(options.monitoring_config_file)
    except ServingError as exc:
        _fail(exc.message)
        return 1

    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s.%(msecs)03d %(levelname).1s %(name)s] %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
    )
    keep_optional_packages_out()  # before TensorFlow is imported: saves ~135 MB of RSS
    from serving.model_servers import server  # imports TensorFlow: only now


    try:
        return server.run(options, config)
    except ServingError as exc:
        _fail(exc.message)
        return 1
    except KeyboardInterrupt:  # a signal before the loop installed its handlers
        return 130

