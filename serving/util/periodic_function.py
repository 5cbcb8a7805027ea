"""A function called periodically on its own thread: TF Serving's ``util/periodic_function.h``.

Drives the background polls -- the file-system source (``--file_system_poll_wait_seconds``) and
the config file (``--model_config_file_poll_wait_seconds``). As in TF Serving, the interval runs
from the start of one call to the start of the next (a call longer than the interval is followed
by the next at once), and calls never overlap. Deadlines use ``time.monotonic()``; :meth:`stop`
interrupts the wait at once (a call under way finishes first).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

__all__ = ["PeriodicFunction"]

_log = logging.getLogger(__name__)


class PeriodicFunction:
    """Call ``function()`` every ``interval_s`` seconds on a daemon thread until :meth:`stop`.

    ``initial_delay_s`` is the wait before the first call. An exception from ``function`` is
    logged and the schedule goes on, as a poll that fails once must not end polling.
    """

    def __init__(
        self,
        function: Callable[[], object],
        interval_s: float,
        *,
        name: str,
        initial_delay_s: float = 0.0,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self._function = function
        self._interval_s = interval_s
        self._initial_delay_s = initial_delay_s
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        """Start the thread (once)."""
        self._thread.start()

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop calling; wait up to ``timeout_s`` (``None``: forever) for a call under way."""
        self._stopped.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        next_start = time.monotonic() + self._initial_delay_s
        while not self._stopped.wait(max(0.0, next_start - time.monotonic())):
            next_start = time.monotonic() + self._interval_s
            try:
                self._function()
            except Exception:  # noqa: BLE001 - keep polling; the failure is logged
                _log.exception("%s failed", self._thread.name)
