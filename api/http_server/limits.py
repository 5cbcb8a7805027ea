"""What one API worker allows a client connection, and the process's file-descriptor limit.

Stdlib only (with `http_hardening.limits`, stdlib only too): `gunicorn.conf.py` calls
`raise_open_files_limit` in the master before anything else, and the worker builds
`ConnectionLimits` from gunicorn's settings after fork.
"""

from __future__ import annotations

import logging
import resource
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from http_hardening.admission import INTERVAL_S, TARGET_S, AdmissionLimits
from http_hardening.limits import LINGER_DECLARED_MAX_BYTES, LINGER_MAX_BYTES, LINGER_S, HttpLimits

logger = logging.getLogger("api.http_server")

HEADER_TIMEOUT_ENV: Final = "API_HEADER_TIMEOUT_S"
MAX_HEADER_BYTES_ENV: Final = "API_MAX_HEADER_BYTES"
SHUTDOWN_DRAIN_ENV: Final = "API_SHUTDOWN_DRAIN_S"
ADMISSION_TARGET_ENV: Final = "API_ADMISSION_TARGET_MS"
ADMISSION_INTERVAL_ENV: Final = "API_ADMISSION_INTERVAL_MS"

# Descriptors a worker needs besides client connections: its pools to the serving replicas
# (SERVING_MAX_CONNECTIONS each, 128 by default: three replicas take 384), the events file,
# prometheus-client's multiprocess files, the event loop's own, logging. The connection cap
# is held this far below the open-files limit, so accept() never fails with EMFILE (asyncio
# and uvloop then stop accepting for a while and every new client waits, unanswered).
FD_RESERVE: Final = 512


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """Limits on each client connection of one worker (`api.http_server.ApiHttpProtocol`).

    Attributes:
        max_request_line: bytes of the request target (URL) at most; more is 414.
            gunicorn's `limit_request_line` (default 4094).
        max_header_fields: header fields per request at most; more is 431.
            gunicorn's `limit_request_fields` (default 100).
        max_header_field_size: bytes of one field (name and value) at most; more is 431.
            gunicorn's `limit_request_field_size` (default 8190).
        max_header_bytes: bytes of the whole request head (request line and every field)
            at most; more is 431. `API_MAX_HEADER_BYTES` (default 32768, nginx's 4 x 8k).
            It also bounds what a connection can make the worker hold and parse: httptools
            joins a header that arrives over several reads by copying it whole each time
            (measured: 16 / 32 / 64 MB heads took 0.2 / 0.8 / 3.1 s of one core).
        header_timeout_s: seconds from a request's first byte until its head is complete;
            later is 408 and the connection closes (slow clients, slowloris).
            `API_HEADER_TIMEOUT_S` (default 10).
        max_connections: open client connections per worker at most. When one more arrives,
            the connection idle longest (no request in progress) is closed to make room;
            with none idle the new one is closed. gunicorn's `worker_connections` (default
            1000), held `FD_RESERVE` below the open-files limit.
        linger_s: after an answer sent before the request's body was read (413, 431, 408),
            how long the rest is read and discarded, seconds, so the client reads the
            answer instead of a connection reset (`http_hardening.limits.LINGER_S`, the
            model server's too).
        linger_max_bytes: ... and how many bytes at most (`LINGER_MAX_BYTES`), unless the
            request announced more: then up to `linger_declared_max_bytes` of what it
            announced (`LINGER_DECLARED_MAX_BYTES`).
        shutdown_drain_s: at graceful shutdown, how long a connection without a request in
            progress stays open, seconds: a request the client sent just before it learnt of
            the shutdown is answered (with `Connection: close`) instead of being reset; then
            the connection closes. `API_SHUTDOWN_DRAIN_S` (default 1), at most half of
            gunicorn's `graceful_timeout`, so what arrives in the window has time to finish.
        admission_target_s: controlled-delay admission (`http_hardening.admission`): a
            request that waited at most this long since its bytes reached the host is fresh,
            seconds. `API_ADMISSION_TARGET_MS` (default 50); 0 turns admission off.
        admission_interval_s: a queue above the target this long is standing: from then on
            only fresh requests are admitted, the others answered 503 `overloaded` before
            any work; also the longest wait admitted in a burst, seconds.
            `API_ADMISSION_INTERVAL_MS` (default 200).
    """

    max_request_line: int = 4094
    max_header_fields: int = 100
    max_header_field_size: int = 8190
    max_header_bytes: int = 32768
    header_timeout_s: float = 10.0
    max_connections: int = 1000
    linger_s: float = LINGER_S
    linger_max_bytes: int = LINGER_MAX_BYTES
    linger_declared_max_bytes: int = LINGER_DECLARED_MAX_BYTES
    shutdown_drain_s: float = 1.0
    admission_target_s: float = TARGET_S
    admission_interval_s: float = INTERVAL_S

    def http_limits(self, exempt_paths: frozenset[str] = frozenset()) -> HttpLimits:
        """What the shared protocol (`http_hardening.protocol`) enforces of these: all but the
        connection cap, which `api.http_server.connections` holds. No shutdown body timeout:
        a request's deadline bounds its body (`api.request.admission.rules`), and gunicorn's
        `graceful_timeout` the whole shutdown. `exempt_paths` are never refused by admission
        (the probes)."""
        admission = (
            AdmissionLimits(self.admission_target_s, self.admission_interval_s, exempt_paths)
            if self.admission_target_s > 0
            else None
        )
        return HttpLimits(
            max_header_bytes=self.max_header_bytes,
            max_target_bytes=self.max_request_line,
            max_header_fields=self.max_header_fields,
            max_header_field_size=self.max_header_field_size,
            header_timeout_s=self.header_timeout_s,
            linger_s=self.linger_s,
            linger_max_bytes=self.linger_max_bytes,
            linger_declared_max_bytes=self.linger_declared_max_bytes,
            shutdown_drain_s=self.shutdown_drain_s,
            admission=admission,
        )

    @classmethod
    def from_gunicorn(cls, cfg: Any, env: Mapping[str, str]) -> ConnectionLimits:
        """The limits from gunicorn's settings object (`worker.cfg`) and `env`.

        A gunicorn limit of 0 means "unlimited" there; here it keeps the default, so a head
        is always bounded. The connection cap is clamped to the open-files limit
        (`fd_bounded`).
        """

        def positive(value: int, default: int) -> int:
            return value if value > 0 else default

        base = cls()
        limits = cls(
            max_request_line=positive(cfg.limit_request_line, base.max_request_line),
            max_header_fields=positive(cfg.limit_request_fields, base.max_header_fields),
            max_header_field_size=positive(cfg.limit_request_field_size, base.max_header_field_size),
            max_header_bytes=int(env.get(MAX_HEADER_BYTES_ENV, base.max_header_bytes)),
            header_timeout_s=float(env.get(HEADER_TIMEOUT_ENV, base.header_timeout_s)),
            max_connections=positive(cfg.worker_connections, base.max_connections),
            shutdown_drain_s=min(
                float(env.get(SHUTDOWN_DRAIN_ENV, base.shutdown_drain_s)), cfg.graceful_timeout / 2
            ),
            admission_target_s=float(env.get(ADMISSION_TARGET_ENV, base.admission_target_s * 1000)) / 1000,
            admission_interval_s=float(env.get(ADMISSION_INTERVAL_ENV, base.admission_interval_s * 1000)) / 1000,
        )
        return limits.fd_bounded()

    def fd_bounded(self, open_files: int | None = None) -> ConnectionLimits:
        """These limits with `max_connections` at most `open_files - FD_RESERVE` (>= 1).

        Args:
            open_files: the soft RLIMIT_NOFILE; read from the process when None.
        """
        if open_files is None:
            open_files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if open_files == resource.RLIM_INFINITY:
            return self
        cap = max(1, open_files - FD_RESERVE)
        if cap >= self.max_connections:
            return self
        logger.warning(
            "worker_connections %d lowered to %d: the open-files limit is %d",
            self.max_connections,
            cap,
            open_files,
        )
        return replace(self, max_connections=cap)


def raise_open_files_limit() -> tuple[int, int]:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit; children inherit it.

    Container runtimes commonly start processes with a soft limit of 1024 and a far higher
    hard one; an unprivileged process may raise its own soft limit up to the hard one.

    Returns:
        (soft before, soft now).
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard or (soft == resource.RLIM_INFINITY):
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:  # e.g. hard above the kernel's nr_open
        logger.warning("could not raise the open-files limit from %d to %d: %s", soft, hard, exc)
        return soft, soft
    return soft, hard
