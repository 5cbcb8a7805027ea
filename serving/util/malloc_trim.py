"""Giving the heap back after large requests: glibc's ``malloc_trim``.

A large request's memory is freed once it is answered, but glibc keeps part of it mapped for
reuse, so the process's RSS stays grown. Measured on a shared 2-core machine with the example
models: twenty gRPC Predict requests of 17M empty strings (34 MB each, ~800 MB once parsed,
refused for ``--max_request_elements``) left RSS ~150 MB above where it started, and
``malloc_trim(0)`` brought it back to +83 MB in 2.5-7 ms; after 1.4M-row fraud predictions
(62 MB of ``tensor_content``) it gave back ~65-85 MB. Trimming after small requests would cost
those milliseconds for nothing, so it runs once, shortly after the large ones end. (Most of what
stays after a very large *allowed* batch is TensorFlow's own: with oneDNN's kernels on, ~500 MB
more than without; ``malloc_trim`` cannot return it.)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading
from collections.abc import Callable

__all__ = ["LARGE_REQUEST_BYTES", "MallocTrimmer"]

_log = logging.getLogger(__name__)

#: A request of this many bytes or more counts as large: its parse alone can take hundreds of MB.
LARGE_REQUEST_BYTES = 16 * 1024 * 1024

_DELAY_S = 1.0  # after the request's handler returns, time for gRPC to send and free it


def _libc_malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or ``None`` where the C library has none (musl, macOS)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None)
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    trimmed: Callable[[int], int] = trim
    return trimmed


class MallocTrimmer:
    """Calls ``malloc_trim(0)`` on its own thread ``delay_s`` seconds after a large request ended,
    once for several ending together. A no-op without glibc. Thread-safe."""

    def __init__(self, delay_s: float = _DELAY_S) -> None:
        self._trim = _libc_malloc_trim()
        self._delay_s = delay_s
        self._lock = threading.Lock()
        self._pending = False
        self._released = 0  # bytes passed to released() since the last trim they caused

    def large_request_done(self) -> None:
        """A large request has been answered: trim soon (unless a trim is already due)."""
        if self._trim is None:
            return
        with self._lock:
            if self._pending:
                return
            self._pending = True
        timer = threading.Timer(self._delay_s, self._run)
        timer.daemon = True
        timer.start()

    def released(self, nbytes: int) -> None:
        """``nbytes`` of request memory were freed: trim once :data:`LARGE_REQUEST_BYTES` of them
        add up (many medium requests, such as REST bodies, can leave as much behind as one large)."""
        if self._trim is None or nbytes <= 0:
            return
        with self._lock:
            self._released += nbytes
            if self._released < LARGE_REQUEST_BYTES:
                return
            self._released = 0
        self.large_request_done()

    def _run(self) -> None:
        with self._lock:
            self._pending = False
        assert self._trim is not None
        self._trim(0)  # ctypes releases the GIL meanwhile
        _log.debug("malloc_trim after a large request")
