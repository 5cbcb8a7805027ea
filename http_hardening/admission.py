"""Admission from the accept queue on: how long a request waited before the server read it,
and whether it is still worth serving (controlled delay).

Stdlib only. A request's wait starts when its bytes reach the host, not when the server gets
round to them: under overload most of it is spent in the kernel, first in the listening
socket's accept queue, then in the connection's receive buffer, while the event loop works
on what it already took. `arrival` reads that moment from the kernel (`TCP_INFO`'s
`tcpi_last_data_recv`: milliseconds since the last segment of data arrived on the
connection, counted in jiffies, so 1-4 ms coarse), so a request's age includes the queue
it waited in; the server's deadline and its admission both run from there.

`ControlledDelay` is the admission: the controlled-delay queue of Facebook's "Fail at
Scale" (Maurer, 2015), after CoDel (Nichols and Jacobson, "Controlling Queue Delay", 2012).
A queue that empties now and then is a burst being absorbed; one that has not emptied for a
whole `interval_s` is a standing queue, which only makes every answer later. CoDel's test
for it: every request for `interval_s` waited longer than `target_s` (the shortest wait of
the interval, its minimum sojourn, stayed above the target). So:

- while no standing queue is seen, every request is admitted (the app still drops one that
  waited its whole budget): a burst, or one slow turn of the loop (a collection, a long
  callback), costs latency, not answers;
- once requests have waited above `target_s` for `interval_s` (overload), only a request
  that waited at most `target_s` is admitted, and the others are answered 503 at once,
  before any work, which drains the queue fast (a refusal costs a fraction of a scored
  request) until a request waits less than `target_s` again and the standing queue is gone.

Facebook's servers also bound the wait outside overload (to the interval, 100 ms); here the
request's own budget (seconds) does, in the app: the queue can stand at most one interval
before refusals start, so the requests admitted waited about `interval_s` at most anyway.

Shedding by the wait, not by a count, keeps the requests that are served fresh: those
admitted under overload waited at most `target_s`, so their budget is nearly whole, and
the server's goodput stays at its capacity instead of being spent on answers whose clients
have given up (congestion collapse). Adaptive LIFO (the paper's second half) reorders an
application's queue so the newest request goes first when it is long; this server has no
application queue to reorder (a request is admitted straight into work or refused, and the
in-flight limit refuses rather than queues), and the kernel's accept queue is FIFO and
cannot be reordered. With the wait bounded by `target_s` under overload, LIFO would only add
unfairness between requests of the same age.

Measured on the API (one worker on one CPU, loopback, Intel Xeon with AVX-512, see
`docs/hardening.md`): a refusal costs about 20 µs of the worker's CPU (14 µs user, 6 µs
system; 10 µs of it the protocol's Python), a scored request about 0.4 ms of it; on an older
machine with 2 workers on 2 shared cores, 0.1 ms against 2-4 ms.
"""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "ARRIVAL_EXTENSION",
    "INTERVAL_S",
    "KEEP_ALIVE_BODY_BYTES",
    "TARGET_S",
    "AdmissionLimits",
    "ControlledDelay",
    "arrival",
    "arrival_of",
]

#: A request that waited this long is fresh, seconds. The paper's 5 ms is for C++ servers
#: whose requests take microseconds. A Python worker saturated but keeping up (a closed loop
#: of 32 connections over 2 workers, 2-4 ms per request) holds a queue of 30-60 ms that
#: answers everything in time; with 10 ms, the first requests after a worker started (its
#: cold paths take 100-300 ms) were refused on a busy machine (tests/api/test_gunicorn.py).
#: 50 ms is 2.5-5 % of a 1-2 s budget; the kernel's clock for `TCP_INFO` ticks every 4 ms.
TARGET_S: Final = 0.050
#: How long the queue may stay above `TARGET_S` before it is a standing queue, seconds (the
#: paper's and CoDel's 100 ms, doubled with the target). At 3x capacity the queue grows two
#: seconds of work per second, so requests admitted at the end of an interval waited about
#: `TARGET_S + 2 * INTERVAL_S` (0.45 s): within a 1 s budget.
INTERVAL_S: Final = 0.200

#: A refused request's body up to this size is read (and discarded) so that its connection
#: stays open: a score request's body (about 1 KiB) arrives with its head. Larger ones are
#: refused before they are read (a body of 1 MB takes a loop turn or more to arrive).
KEEP_ALIVE_BODY_BYTES: Final = 64 * 1024

_TCP_INFO_BYTES: Final = 104  # enough of `struct tcp_info` for the field below
_LAST_DATA_RECV: Final = struct.Struct("I")  # u32 tcpi_last_data_recv, milliseconds
_LAST_DATA_RECV_OFFSET: Final = 52  # 8 bytes of u8 fields, 11 u32 before it


@dataclass(frozen=True, slots=True)
class AdmissionLimits:
    """Controlled-delay admission of one server (`ControlledDelay`).

    Attributes:
        target_s: a request that waited at most this long is fresh, seconds (`TARGET_S`).
        interval_s: a queue above `target_s` for this long is standing; also the longest
            wait admitted while it is not, seconds (`INTERVAL_S`).
        exempt_paths: request paths never refused for their wait (the probes).
        keep_alive_body_bytes: a refused request announcing at most this body
            (`Content-Length`) is answered once its body is read, on a connection kept
            open; a larger one, or a chunked one, at once, and its connection closed
            unread (`KEEP_ALIVE_BODY_BYTES`).
    """

    target_s: float = TARGET_S
    interval_s: float = INTERVAL_S
    exempt_paths: frozenset[str] = frozenset()
    keep_alive_body_bytes: int = KEEP_ALIVE_BODY_BYTES


class ControlledDelay:
    """Whether a request that waited `sojourn_s` is admitted (see the module doc).

    One per server (per worker process), shared by its connections; not thread-safe (one
    event loop calls it).

    Attributes:
        limits: the target and interval.
    """

    def __init__(self, limits: AdmissionLimits) -> None:
        self.limits = limits
        # Since when every request has waited above the target (None: the last one did not).
        self._above_since: float | None = None

    def overloaded(self, now: float) -> bool:
        """Every request for a whole interval waited above the target: a standing queue."""
        return self._above_since is not None and now - self._above_since >= self.limits.interval_s

    def admit(self, sojourn_s: float, now: float) -> bool:
        """True to serve a request that waited `sojourn_s` seconds (at `now`, monotonic)."""
        if sojourn_s <= self.limits.target_s:
            self._above_since = None
            return True
        if self._above_since is None:
            self._above_since = now
            return True
        return not self.overloaded(now)


def arrival(sock: Any, now: float | None = None) -> float:
    """When the last data on TCP socket `sock` reached the host, on `time.monotonic()`'s clock.

    Read at a request's first bytes, it is when they arrived (a head sent in one segment, or
    a whole pipelined batch); for a connection's first request it includes its time in the
    listening socket's accept queue. `now` when the socket has no `TCP_INFO` (a Unix-domain
    socket, another OS) or the call fails. Never later than `now`.
    """
    now = time.monotonic() if now is None else now
    if sock is None:
        return now
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_BYTES)
    except (OSError, AttributeError, ValueError):
        return now
    if len(info) < _LAST_DATA_RECV_OFFSET + 4:
        return now
    (ago_ms,) = _LAST_DATA_RECV.unpack_from(info, _LAST_DATA_RECV_OFFSET)
    return now - float(ago_ms) / 1000.0


#: The ASGI scope extension under which the server passes a request's arrival to the app:
#: `scope["extensions"][ARRIVAL_EXTENSION]["monotonic"]`, seconds on `time.monotonic()`'s
#: clock (`arrival`), so the request's deadline runs from it (`arrival_of`).
ARRIVAL_EXTENSION: Final = "tfserve.arrival"


def arrival_of(scope: Any, default: float) -> float:
    """The request's arrival the server put in `scope` (`ARRIVAL_EXTENSION`), else `default`."""
    extensions = scope.get("extensions")
    if extensions:
        found = extensions.get(ARRIVAL_EXTENSION)
        if found is not None:
            return float(found["monotonic"])
    return default
