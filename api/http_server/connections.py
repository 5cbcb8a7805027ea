"""The open client connections of one worker: the cap, who makes room, and what was closed.

One `ConnectionRegistry` per uvicorn server (per worker process). Each connection tells it
when it opens, when a request starts (it is busy until its response is complete), when it is
idle again and when it is gone. A connection without a request in progress -- idle between
requests, never having sent a byte, still sending its head, or lingering after a refusal --
holds nothing of the app's and may be closed to make room: nginx does the same with its
idle keep-alive connections when it runs out of `worker_connections`. Closures the server
decides (refusals, timeouts, evictions) are counted in `api_connections_closed_total` and
logged, at most one summary line per `LOG_INTERVAL_S`; closures counted after a summary are
logged when the interval ends, not at the next closure, which may come much later.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections import Counter
from typing import TYPE_CHECKING, Final, Protocol

from api.observability.metrics import ConnectionMetrics

if TYPE_CHECKING:
    from uvicorn.server import ServerState

logger = logging.getLogger("api.http_server")

LOG_INTERVAL_S: Final = 10.0
#: `api_queue_delay_seconds` is the shortest wait of a request in each window this long, seconds.
QUEUE_DELAY_WINDOW_S: Final = 1.0


class Closable(Protocol):
    """What the registry needs of a connection: a way to close it."""

    def close_connection(self, reason: str) -> None: ...


class ConnectionRegistry:
    """Open connections of one server, and which of them may be closed to make room.

    Args:
        max_connections: open connections at most (>= 1).
        metrics: where closures are counted; a fresh `ConnectionMetrics` when None.
    """

    def __init__(self, max_connections: int, metrics: ConnectionMetrics | None = None) -> None:
        self.max_connections = max_connections
        self.metrics = metrics if metrics is not None else ConnectionMetrics()
        self.open: set[Closable] = set()
        # Insertion-ordered: the first is the one that has held nothing the longest.
        # Lingering connections (already answered, closing) are given up before idle ones.
        self._lingering: dict[Closable, None] = {}
        self._idle: dict[Closable, None] = {}
        self._unlogged: Counter[str] = Counter()
        self._logged_at = 0.0
        self._flush: asyncio.TimerHandle | None = None
        self._shortest_wait = float("inf")  # of the requests in the current window
        self._window: asyncio.TimerHandle | None = None

    def waited(self, sojourn_s: float) -> None:
        """A request's head is complete, `sojourn_s` seconds after it reached the host.

        `api_queue_delay_seconds` is the shortest such wait in each `QUEUE_DELAY_WINDOW_S`:
        above the admission target, every request of that second waited in a standing
        queue (CoDel's measure, robust to one slow request); 0 once a window has none.
        """
        if sojourn_s < self._shortest_wait:
            self._shortest_wait = sojourn_s
        if self._window is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # outside a server (unit tests)
                return
            self._window = loop.call_later(QUEUE_DELAY_WINDOW_S, self._window_ended)

    def _window_ended(self) -> None:
        shortest = self._shortest_wait
        self.metrics.queue_delay.set(0.0 if shortest == float("inf") else max(0.0, shortest))
        self._shortest_wait = float("inf")
        self._window = None
        if shortest != float("inf"):
            # One more window, so that a second without requests sets 0; after it, the next
            # request arms the window again.
            self._window = asyncio.get_running_loop().call_later(QUEUE_DELAY_WINDOW_S, self._window_ended)

    def admit(self, conn: Closable) -> bool:
        """Register a new connection; False when it must be closed (at the cap, none idle).

        At the cap, the connection that has been without a request the longest is closed
        first to make room.
        """
        if len(self.open) >= self.max_connections:
            victim = next(iter(self._lingering), None) or next(iter(self._idle), None)
            if victim is None:
                self.closed("refused_at_limit")
                return False
            self.gone(victim)
            victim.close_connection("evicted")
        self.open.add(conn)
        self._idle[conn] = None
        return True

    def idle(self, conn: Closable) -> None:
        """`conn` holds no request (a response completed, or a new head began): last in line."""
        if conn in self.open:
            self._idle.pop(conn, None)
            self._idle[conn] = None

    def busy(self, conn: Closable) -> None:
        """`conn` has a request in the app: never closed to make room."""
        self._idle.pop(conn, None)

    def lingering(self, conn: Closable) -> None:
        """`conn` was answered and is closing: the first to go if room is needed."""
        if conn in self.open:
            self._idle.pop(conn, None)
            self._lingering[conn] = None

    def gone(self, conn: Closable) -> None:
        """`conn` is closed (idempotent)."""
        self.open.discard(conn)
        self._idle.pop(conn, None)
        self._lingering.pop(conn, None)

    def closed(self, reason: str) -> None:
        """Count a connection the server closed or refused; log a summary at most every `LOG_INTERVAL_S`."""
        self.metrics.closed(reason)
        self._unlogged[reason] += 1
        wait_s = LOG_INTERVAL_S - (time.monotonic() - self._logged_at)
        if wait_s <= 0:
            self._log_summary()
        elif self._flush is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # called outside a server (unit tests): the next closure logs
                return
            self._flush = loop.call_later(wait_s, self._log_summary)

    def _log_summary(self) -> None:
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        if not self._unlogged:
            return
        counts = ", ".join(f"{r}={n}" for r, n in sorted(self._unlogged.items()))
        logger.warning(
            "closed client connections: %s (%d open, limit %d)",
            counts,
            len(self.open),
            self.max_connections,
            extra={"closed": dict(self._unlogged), "open": len(self.open)},
        )
        self._unlogged.clear()
        self._logged_at = time.monotonic()


_registries: weakref.WeakKeyDictionary[ServerState, ConnectionRegistry] = weakref.WeakKeyDictionary()


def registry_for(server_state: ServerState, max_connections: int) -> ConnectionRegistry:
    """The registry of the server that owns `server_state` (made on its first connection)."""
    registry = _registries.get(server_state)
    if registry is None:
        registry = _registries[server_state] = ConnectionRegistry(max_connections)
    return registry
