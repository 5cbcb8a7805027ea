"""Per-client rate limits: a token bucket per (client, path pattern), shared by every worker.

Each rule of `RATE_LIMITS__ROUTES` is a bucket of `burst` tokens refilled at `rate` tokens a
second; a request takes one, or is refused with the time until one is there (`Retry-After`).
The client is the credential id (`key:<id>`, `jwt:<subject>`) or, on a request without one, the
client address (`addr:<ip>`; behind a proxy, gunicorn's `forwarded_allow_ips` makes it the
`X-Forwarded-For` address).

Across workers. The kernel hands connections to whichever gunicorn worker accepts first and a
client's keep-alive connection stays with one, so a limit counted per worker lets a client
through up to N times its rate. The buckets therefore live in one shared table,
`SharedBuckets`: a `memfd` (no file on disk, so a read-only root filesystem is fine) mapped
shared, made by the app in gunicorn's master under `preload_app` and inherited by every worker
at fork, as the in-flight board is. A worker updates a bucket under an `fcntl` record lock on
that memfd: the kernel releases such a lock when its holder dies, so a worker killed while
holding it (OOM, SIGKILL) cannot stall the others, which a `multiprocessing.Lock` (a semaphore
left taken) would. The lock is held for one bucket update. CPU per request, measured with
`python -m bench.front_door` on 2 busy cores (load average 6): the two `fcntl` calls 1.5
microseconds, the keyed fingerprint 0.7, a whole bucket update 3.9, the middleware's check
with auth off 4.1 (5.4 when it refuses), 4.6 with two processes contending for the table:
a fifth of the 20 microsecond budget. (`os.fork`-shared memory with no lock at all would need
an atomic compare-and-swap, which Python does not have.)

The table. `slots` buckets of 24 bytes (key fingerprint, tokens, last update on the monotonic
clock, which Linux shares between processes). A bucket's slot is found by a keyed BLAKE2b
fingerprint of (pattern, client) -- keyed with a secret drawn at start, so a client cannot
choose ids that collide -- probing at most `PROBES` slots. Slots are never emptied, only
reused: when none of a key's probes is free, the one updated longest ago is given to the new
key (it has most likely refilled to a full bucket anyway, which is what a new bucket holds).
Memory is therefore fixed (`RATE_LIMITS__MAX_BUCKETS` x 24 bytes) however many client
addresses come.

Without preload (one uvicorn process, or gunicorn with `preload_app = False`) each process makes
its own table, and the limit is per process.
"""

from __future__ import annotations

import fcntl
import hashlib
import math
import mmap
import os
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from api.config.security import RateLimit, RateLimitSettings
from api.security.paths import PathTable

PROBES: Final = 8  # slots looked at for one key
_SLOT_BYTES: Final = 24


def _shared_file(size: int) -> int:
    """A file descriptor of `size` zero bytes that no path names: a memfd, else an unlinked temp file."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("api-rate-limits", os.MFD_CLOEXEC)
    else:  # pragma: no cover - not Linux
        fd, path = tempfile.mkstemp(prefix="api-rate-limits-")
        os.unlink(path)
    os.ftruncate(fd, size)
    return fd


class SharedBuckets:
    """Token buckets in memory shared by forked processes (see module doc).

    Args:
        slots: buckets held at most (>= `PROBES`).
        clock: monotonic seconds, the same in every process (tests pass their own).
    """

    def __init__(self, slots: int, clock: Callable[[], float] = time.monotonic) -> None:
        if slots < PROBES:
            raise ValueError(f"at least {PROBES} slots")
        self.slots = slots
        self._clock = clock
        self._fd = _shared_file(slots * _SLOT_BYTES)
        self._memory = mmap.mmap(self._fd, slots * _SLOT_BYTES, flags=mmap.MAP_SHARED)
        view = memoryview(self._memory)
        self._keys = view[: 8 * slots].cast("Q")
        self._tokens = view[8 * slots : 16 * slots].cast("d")
        self._stamps = view[16 * slots :].cast("d")
        self._secret = os.urandom(16)
        # fcntl record locks belong to a process, not a thread: threads of one worker (a gRPC
        # server's thread pool) are kept apart by this lock, which dies with its process too.
        self._thread_lock = threading.Lock()

    def fingerprint(self, key: bytes) -> int:
        """The bucket key's 64-bit fingerprint (never 0, which marks a free slot)."""
        digest = hashlib.blake2b(key, digest_size=8, key=self._secret).digest()
        return int.from_bytes(digest, "little") or 1

    def take(self, key: bytes, rate: float, burst: float) -> float:
        """Take one token from `key`'s bucket (`rate` tokens/s, at most `burst`).

        Returns:
            0.0 when a token was taken; else the seconds until one will be there (> 0).
        """
        fp = self.fingerprint(key)
        slots = self.slots
        first = fp % slots
        keys, tokens, stamps = self._keys, self._tokens, self._stamps
        with self._thread_lock:
            fcntl.lockf(self._fd, fcntl.LOCK_EX)
            try:
                now = self._clock()  # read under the lock: updates stay in time order
                slot = -1
                oldest = first
                for probe in range(PROBES):
                    i = first + probe
                    if i >= slots:
                        i -= slots
                    held = keys[i]
                    if held == fp:
                        slot = i
                        level = tokens[i] + (now - stamps[i]) * rate
                        if level > burst:
                            level = burst
                        break
                    if held == 0:
                        slot, level = i, burst
                        keys[i] = fp
                        break
                    if stamps[i] < stamps[oldest]:
                        oldest = i
                else:
                    slot, level = oldest, burst
                    keys[slot] = fp
                stamps[slot] = now
                if level >= 1.0:
                    tokens[slot] = level - 1.0
                    return 0.0
                tokens[slot] = level
                return (1.0 - level) / rate
            finally:
                fcntl.lockf(self._fd, fcntl.LOCK_UN)


@dataclass(frozen=True, slots=True)
class Limited:
    """A request over its rate limit.

    Attributes:
        pattern: the rule's path pattern.
        limit: the rule.
        retry_after_s: whole seconds until the client's bucket has a token again (>= 1),
            for `Retry-After` (RFC 9110 10.2.3: an integer).
    """

    pattern: str
    limit: RateLimit
    retry_after_s: int


class RateLimiter:
    """The rate-limit rules and their shared buckets (made before gunicorn forks its workers).

    Args:
        settings: `RATE_LIMITS__...`; at least one rule.
    """

    def __init__(self, settings: RateLimitSettings) -> None:
        self._rules = PathTable(settings.routes)
        self.buckets = SharedBuckets(settings.max_buckets)

    def check(self, path: str, client: str) -> Limited | None:
        """Count one request of `client` on `path`: None when it may go on (or no rule
        covers `path`), else why not."""
        rule = self._rules.match(path)
        if rule is None:
            return None
        pattern, limit = rule
        wait = self.buckets.take(f"{pattern}\0{client}".encode("utf-8", "surrogatepass"), limit.rate, limit.burst)
        if wait == 0.0:
            return None
        return Limited(pattern, limit, max(1, math.ceil(wait)))
