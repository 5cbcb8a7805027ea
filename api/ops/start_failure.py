"""The reason the API could not start, kept so that it is the last line printed.

    API_START_FAILURE_FILE=/tmp/api-start-failure gunicorn -c gunicorn.conf.py 'api.app:create_app()'

A start-up mistake (a route module that does not import, a route whose model serving lacks
or whose signature does not fit) is found in gunicorn's master (building the app) or in a
worker's lifespan (asking serving). Either way other lines follow it: the worker's exit,
gunicorn's "Shutting down: Master" and "Reason: Worker failed to boot.", then run-server.sh
stopping serving. So the one-line reason is also written to the file `API_START_FAILURE_FILE`
names, and whoever started the API prints it last: gunicorn's master as it exits
(`gunicorn.conf.py` makes the file when the variable is unset), run-server.sh after it has
stopped both tiers. The line ends with the fix (`api.inference.readiness.require_models`,
`api.config.enabled_routes`). Stdlib only: gunicorn.conf.py and run-server.sh's readiness
wait use it too.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final

FILE_ENV: Final = "API_START_FAILURE_FILE"
#: What the last line printed starts with, before the reason.
PREFIX: Final = "api: cannot start: "


def record(reason: str, environ: Mapping[str, str] = os.environ) -> None:
    """Write `reason` (one line) to the file `API_START_FAILURE_FILE` names; nothing without one.

    A file that cannot be written is left alone: the reason is in the log above anyway.
    """
    path = environ.get(FILE_ENV)
    if not path:
        return
    try:
        Path(path).write_text(" ".join(reason.split()) + "\n")
    except OSError:
        pass


def recorded(environ: Mapping[str, str] = os.environ) -> str | None:
    """The reason recorded, or None (no file, or an empty one)."""
    path = environ.get(FILE_ENV)
    if not path:
        return None
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return text or None


def last_line(reason: str) -> str:
    """The line printed last: `api: cannot start: <reason>`."""
    return PREFIX + " ".join(reason.split())
