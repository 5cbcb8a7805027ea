"""The request's time budget: one `Deadline` from arrival to the wire.

Every request gets a budget (`REQUEST_TIMEOUT_S`); a caller may lower it, never raise it,
with the `X-Request-Timeout-Ms` header (read by `api.request.admission.rules`). The deadline
is fixed when the request arrives, so receiving the body, validation and feature extraction
spend from the same budget as the call to serving, whose timeout is whatever is left: every
call of this package takes the deadline and makes what is left of it the gRPC deadline or
the REST call's timeout. A request whose budget runs out is answered 504
(`DeadlineExceeded`, or `ServingTimeout` once the call to serving is under way) instead of
waiting on.

All times are `time.monotonic()` seconds: wall-clock jumps (NTP) must not shorten or
stretch a budget.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass


class DeadlineExceeded(Exception):
    """The request's budget ran out before it could be answered (HTTP 504).

    Attributes:
        message: where it ran out, safe to show to callers.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True, slots=True)
class Deadline:
    """A point in time on the monotonic clock by which an answer is due.

    Attributes:
        expires_at: `time.monotonic()` value, seconds.
    """

    expires_at: float

    @classmethod
    def after(cls, seconds: float, *, now: float | None = None) -> Deadline:
        """The deadline `seconds` from `now` (default: `time.monotonic()`)."""
        return cls((time.monotonic() if now is None else now) + seconds)

    def remaining(self, *, now: float | None = None) -> float:
        """Seconds left; negative once expired."""
        return self.expires_at - (time.monotonic() if now is None else now)

    def expired(self, *, now: float | None = None) -> bool:
        """True when no time is left."""
        return self.remaining(now=now) <= 0.0

    def budget(self, cap_s: float) -> float:
        """Seconds one step may take from now: what is left, at most `cap_s`; <= 0 once expired."""
        return min(self.expires_at - time.monotonic(), cap_s)

    def timeout(self) -> asyncio.Timeout:
        """`asyncio.timeout` that fires at this deadline (at once when it has passed).

        `async with deadline.timeout(): ...` raises `TimeoutError` out of the block then.
        A relative delay, not `asyncio.timeout_at(expires_at)`: uvloop's `loop.time()` is
        libuv's cached millisecond clock, not `time.monotonic()`.
        """
        return asyncio.timeout(max(0.0, self.expires_at - time.monotonic()))

    def check(self, what: str) -> float:
        """Seconds left before `what`; raises `DeadlineExceeded` naming `what` if none.

        Call before starting work that cannot finish in no time (e.g. the serving call),
        so an expired request is shed at once instead of being sent on.
        """
        left = self.remaining()
        if left <= 0.0:
            raise DeadlineExceeded(f"request deadline exceeded before {what}")
        return left
