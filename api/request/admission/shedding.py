"""Deadline-aware load shedding: refuse at once what could not be answered in time.

A request whose remaining budget is shorter than what the model currently takes would most
likely run out of time while serving works on it -- and serving would still do the work (TF
Serving does not cancel a call whose client went away), taking capacity from requests that
could make it. Under overload that is how latency feeds on itself. So before each call,
`ServedModel` (`api.inference.served_model`) compares the request's remaining budget with
the model's current latency, the median duration of its recent calls in this worker
(`LatencyEstimate`; a call that ran out of time counts with the time it took, a lower bound,
so an overload in which almost nothing succeeds is still seen), and refuses a request that
has less left at once: 504 `deadline_exceeded`, without calling serving.

The median forgets: calls older than `window_s` drop out, and with fewer than
`min_samples` recent calls nothing is refused. So when everything is being refused (no
new successes), the estimate empties within `window_s` and calls go through again and
measure the model afresh; shedding never locks itself in.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from typing import Final

WINDOW_S: Final = 5.0
MIN_SAMPLES: Final = 20
MAX_SAMPLES: Final = 256
# The median of up to MAX_SAMPLES floats is a sort (about 10 microseconds): redone after
# this many new samples or this long, not on every request.
REFRESH_EVERY: Final = 16
REFRESH_S: Final = 0.1


class LatencyEstimate:
    """The median duration of a model's recent calls, seconds.

    Args:
        window_s: calls older than this are forgotten, seconds.
        min_samples: fewer recent calls than this: no estimate (None).
        max_samples: recent calls kept at most.
    """

    def __init__(
        self, *, window_s: float = WINDOW_S, min_samples: int = MIN_SAMPLES, max_samples: int = MAX_SAMPLES
    ) -> None:
        self._window_s = window_s
        self._min_samples = min_samples
        self._samples: deque[tuple[float, float]] = deque(maxlen=max_samples)  # (ended at, seconds)
        self._median: float | None = None
        self._computed_at = float("-inf")
        self._new = 0

    def record(self, seconds: float, *, now: float | None = None) -> None:
        """One call took `seconds` (succeeded, or ran out of time after that long)."""
        self._samples.append((time.monotonic() if now is None else now, seconds))
        self._new += 1

    def median(self, *, now: float | None = None) -> float | None:
        """The median of the calls of the last `window_s`, or None with too few of them."""
        now = time.monotonic() if now is None else now
        if self._new >= REFRESH_EVERY or now - self._computed_at >= REFRESH_S:
            samples = self._samples
            while samples and now - samples[0][0] > self._window_s:
                samples.popleft()
            recent = [seconds for _, seconds in samples]
            self._median = statistics.median(recent) if len(recent) >= self._min_samples else None
            self._computed_at = now
            self._new = 0
        return self._median
