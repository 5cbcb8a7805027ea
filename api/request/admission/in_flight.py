"""Requests in flight across the workers of one gunicorn master, for the admission limit.

Each worker has its own event loop and its own connections, and the kernel hands new
connections to whichever worker accepts first: a burst can land mostly on one. A limit
counted per worker then refuses requests while the other workers have room (measured with
two workers of 64: the first 503 came at 111-121 requests in flight, not 128). So the
count is shared: the app (built in the master under gunicorn's `preload_app`) maps one
page of anonymous shared memory, inherited by every worker at fork, with one slot per
worker (its pid and its count). A worker writes only its own slot; everyone reads all.

A request is admitted while the total in flight is below `per_worker` times the number of
live workers, and its own worker holds fewer than twice its share (so one event loop is
never given every request). A worker claims a slot when its app starts, seen by the others
at their next request; the slot of a worker that died is freed by the next look for dead
ones (at most once a second).

Without preload each worker builds its own app, sees only itself, and the limit is per
worker, as it was.

**No lock a dead worker can hold.** The request path takes no lock at all: a worker
writes only its own slot's count, and a count is one aligned 8-byte word, which the CPU
writes whole (a reader sees the old or the new value, never half of each). Only changing
the table -- taking a slot, freeing a dead worker's -- needs one writer at a time (two
workers must not take the same free slot), and that is a POSIX record lock (`fcntl`) on
the memory's own file (a `memfd`): the kernel releases it when its holder dies, however
it dies, so a worker SIGKILLed in the middle of a change leaves nothing held (a
`multiprocessing.Lock`, a semaphore in shared memory, stayed taken for good: every other
worker's next look at the table, on the request path, blocked, `/healthz` with it, and
respawned workers blocked in `claim`). On the request path that lock is only tried
(`LOCK_NB`): when another worker holds it, the look for dead workers waits for the next
request instead of this one waiting. A change interrupted half-way by its holder's death
leaves at worst a slot with a pid and no count, or a count with no pid: the next look
frees the first (its pid is dead) and the second is not counted (only slots with a pid
are).
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Final

SLOTS: Final = 64  # workers per master at most
REFRESH_S: Final = 1.0  # how often dead workers' slots are looked for


class InFlightBoard:
    """Shared counts of requests in flight, one slot per worker (see module doc).

    Args:
        per_worker: each worker's share of requests in flight (`MAX_IN_FLIGHT_REQUESTS`).
    """

    def __init__(self, per_worker: int) -> None:
        self.per_worker = per_worker
        # Shared, in a memfd that forked workers inherit: one memory, and the file the
        # table's record lock is taken on. Words: the table's generation (bumped whenever a
        # slot is taken or freed), then each slot's pid, then its count.
        size = (1 + 2 * SLOTS) * 8
        self._fd = os.memfd_create("api-in-flight", os.MFD_CLOEXEC)
        os.ftruncate(self._fd, size)
        self._memory = mmap.mmap(self._fd, size, flags=mmap.MAP_SHARED)
        words = memoryview(self._memory).cast("q")
        self._generation = words[:1]
        self._pids = words[1 : 1 + SLOTS]
        self._counts = words[1 + SLOTS :]
        self._slot = -1
        self._owner = 0  # the pid that claimed `_slot` (a forked copy must claim its own)
        self._live: list[int] = []
        self._seen_generation = -1
        self._looked_at = float("-inf")

    def claim(self) -> None:
        """Take a free slot for this process (at app start, in each worker)."""
        pid = os.getpid()
        with self._table(wait=True):
            self._free_dead_slots()
            free = [i for i in range(SLOTS) if self._pids[i] == 0]
            if not free:
                raise RuntimeError(f"more than {SLOTS} workers share one in-flight board")
            self._slot = free[0]
            self._pids[self._slot] = pid
            self._counts[self._slot] = 0
            self._generation[0] += 1
        self._owner = pid
        self._look(force=True)
        global _claimed
        _claimed = self

    def release(self) -> None:
        """Give the slot back (at app shutdown)."""
        if self._owner == os.getpid() and self._slot >= 0:
            with self._table(wait=True):
                self._counts[self._slot] = 0
                self._pids[self._slot] = 0
                self._generation[0] += 1
            self._slot = -1
        global _claimed
        if _claimed is self:
            _claimed = None

    def full(self) -> bool:
        """True when one more request must be refused."""
        if self._owner != os.getpid():
            self.claim()
        self._look()
        counts = self._counts
        total = sum(counts[i] for i in self._live)
        return total >= self.per_worker * len(self._live) or counts[self._slot] >= 2 * self.per_worker

    def enter(self) -> None:
        """One more request in flight in this worker."""
        self._counts[self._slot] += 1

    def leave(self) -> None:
        """One request fewer in flight in this worker."""
        self._counts[self._slot] -= 1

    def totals(self) -> tuple[int, int]:
        """(requests in flight in every live worker, the admission limit), for messages."""
        self._look()
        return sum(self._counts[i] for i in self._live), self.per_worker * len(self._live)

    def refusal_detail(self) -> str:
        """What a request refused at the limit is told (the 503's `detail`): the totals and the
        per-worker share, e.g. "at the limit of requests in flight (64 of 64, 64 per worker)"."""
        busy, limit = self.totals()
        return f"at the limit of requests in flight ({busy} of {limit}, {self.per_worker} per worker)"

    def _look(self, *, force: bool = False) -> None:
        """Refresh the live slots: at once when a slot was taken or freed, and look for dead
        workers at most once a `REFRESH_S`."""
        now = time.monotonic()
        dead_check = force or now - self._looked_at >= REFRESH_S
        if dead_check or self._generation[0] != self._seen_generation:
            if dead_check:
                with self._table(wait=False) as held:
                    if held:  # else another worker is changing it: look again next request
                        self._free_dead_slots()
                        self._looked_at = now
            # Read without the lock: a slot taken or freed meanwhile bumps the generation
            # again, and the next request reads the table anew.
            self._seen_generation = self._generation[0]
            self._live = [i for i in range(SLOTS) if self._pids[i] != 0]

    @contextmanager
    def _table(self, *, wait: bool) -> Iterator[bool]:
        """Hold the table for a change: a POSIX record lock on the memfd, released by the
        kernel if this process dies holding it. Yields False when `wait` is False and
        another process holds it."""
        try:
            fcntl.lockf(self._fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if wait or exc.errno not in (errno.EACCES, errno.EAGAIN):
                raise
            yield False
            return
        try:
            yield True
        finally:
            fcntl.lockf(self._fd, fcntl.LOCK_UN)

    def _free_dead_slots(self) -> None:
        for i in range(SLOTS):
            pid = self._pids[i]
            if pid and not process_alive(pid):
                self._counts[i] = 0
                self._pids[i] = 0
                self._generation[0] += 1


#: The ASGI scope extension under which the HTTP server hands the app a request's slot on the
#: board, taken when its head was admitted: `scope["extensions"][RESERVATION_EXTENSION]`, a
#: `Reservation`.
RESERVATION_EXTENSION: Final = "tfserve.in_flight"


class Reservation:
    """One request's place on the board, taken by the HTTP server when it admits the head.

    Why: the server checks the limit at each request's head (`api.http_server.protocol`), but
    the app counts a request only when its task runs, a loop turn or more later. Every head
    read in between passed the check against the same count, so under overload the app then
    refused hundreds of them per second, each after the work of starting it (measured at 3x
    capacity, one worker: 18,322 app-level 503s in 20 s beside 67,030 refused at the head;
    about a seventh of the worker's time). Counted at the head, the next head sees it.

    Whoever ends the request gives the place back: the app when it `take`s the reservation
    (it then leaves the board when its request ends, as for one it counted itself), else the
    server when the response completes or the connection is lost (`release`), so a request
    whose app never ran (a bare app, a connection lost first) holds nothing.

    Args:
        board: the board of this process (`claimed_board`); one place is taken on it now.
    """

    __slots__ = ("_board", "_held")

    def __init__(self, board: InFlightBoard) -> None:
        board.enter()
        self._board = board
        self._held = True

    def take(self) -> bool:
        """The app takes the place over (it calls `InFlightBoard.leave` when done); False
        when it was given back already (the connection was lost before the app ran)."""
        held = self._held
        self._held = False
        return held

    def finish(self) -> None:
        """The app that took the place is done with its request: give it back."""
        self._board.leave()

    def release(self) -> None:
        """Give the place back, unless the app took it (idempotent)."""
        if self._held:
            self._held = False
            self._board.leave()


def reservation_of(scope: Mapping[str, Any]) -> Reservation | None:
    """The `Reservation` the HTTP server put in `scope` (`RESERVATION_EXTENSION`), if any."""
    extensions = scope.get("extensions")
    if not extensions:
        return None
    found = extensions.get(RESERVATION_EXTENSION)
    return found if isinstance(found, Reservation) else None


# The board this process's app claimed a slot on (one app per worker), for the HTTP server's
# connections, which refuse at the limit from a request's head (`api.http_server.protocol`).
_claimed: InFlightBoard | None = None


def claimed_board() -> InFlightBoard | None:
    """The board this process's app claimed a slot on (`InFlightBoard.claim`), if any and if
    claimed in this process (a forked child must claim its own)."""
    board = _claimed
    if board is None or board._owner != os.getpid():
        return None
    return board


def process_alive(pid: int) -> bool:
    """Whether process `pid` exists (signal 0; one of another user's counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
