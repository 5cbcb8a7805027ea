"""JSON logs for the API tier: one JSON object per line on stderr.

Every record of the `api` logger tree is written as one line:

    {"ts": "2026-11-29T14:03:00.123Z", "level": "INFO", "logger": "api.access",
     "msg": "POST /v1/fraud/score 200", "request_id": "…", "method": "POST",
     "path": "/v1/fraud/score", "route": "/v1/fraud/score", "status": 200,
     "duration_ms": 3.512, "model_name": "fraud", "model_version": 1,
     "client": "127.0.0.1:51234", "credential": "key:ci-smoke"}

`ts` is UTC with milliseconds; the fields after `msg` are whatever the caller passed in
`extra=` (the loop monitor passes the route and how long the loop was blocked).

The access log line (`"logger": "api.access"`, one per request, written by
`api.request.middleware`) has the same shape but is written by `AccessLog`, not through the
`logging` module: building a `LogRecord`, finding the caller and formatting cost about
40 microseconds a line here, a quarter of a request's whole budget at the API's
ceiling; `AccessLog` writes the same object for about 4. `ACCESS_LOG=false` turns it off.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Final, TextIO

import orjson

ACCESS_LOGGER: Final = "api.access"

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD_ATTRS: Final = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__.keys() | {"message", "asctime"}
)


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object: ts, level, logger, msg, then the extras."""

    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.fromtimestamp(record.created, tz=UTC)
        out: dict[str, object] = {
            "ts": ts.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD_ATTRS and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc_info"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


class AccessLog:
    """Writes one JSON access-log line per request, in `JsonFormatter`'s shape.

    Args:
        enabled: False makes `write` a no-op.
        stream: where lines go; None means whatever `sys.stderr` is at write time.

    Called on the event loop only (one thread), so it needs no lock; one `write` per
    line, which stderr (line-buffered) turns into one write(2).
    """

    def __init__(self, *, enabled: bool = True, stream: TextIO | None = None) -> None:
        self.enabled = enabled
        self._stream = stream
        self._second = -1
        self._prefix = ""

    def _timestamp(self, now: float) -> str:
        second = int(now)
        if second != self._second:  # formatting the date once a second is enough
            self._second = second
            self._prefix = datetime.fromtimestamp(second, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")
        return f"{self._prefix}.{int((now - second) * 1000):03d}Z"

    def write(self, msg: str, fields: Mapping[str, object]) -> None:
        """Write `{"ts", "level": "INFO", "logger": "api.access", "msg", **fields}` as a line."""
        if not self.enabled:
            return
        line = orjson.dumps(
            {
                "ts": self._timestamp(time.time()),
                "level": "INFO",
                "logger": ACCESS_LOGGER,
                "msg": msg,
                **fields,
            },
            default=str,
            option=orjson.OPT_APPEND_NEWLINE,
        )
        (self._stream or sys.stderr).write(line.decode())


def configure_logging(*, level: str = "INFO", stream: TextIO | None = None) -> None:
    """Send the `api` logger tree to `stream` (stderr) as JSON lines.

    Idempotent: replaces the handler it installed before, so building several apps in
    one process (tests) does not duplicate lines. Leaves the root logger and uvicorn's
    and gunicorn's loggers alone.

    Args:
        level: level of the `api` loggers (a `logging` level name).
        stream: where to write; stderr by default.
    """
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter())
    handler.set_name("api-json")
    root = logging.getLogger("api")
    for old in [h for h in root.handlers if h.get_name() == "api-json"]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    root.propagate = False
