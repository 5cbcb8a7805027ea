"""Open-loop load for the chaos run: requests due on a fixed timetable, each one's fate recorded.

Request k is due at start + k / rate (or, with `poisson_seed`, at the k-th arrival of a
Poisson process of that rate: bursts as from many independent clients) whatever the server
does (a slow server does not slow the sender down, as it would in a closed loop), sent over
a pool of connections (httpx; some kept alive, the others new for each request), and its
latency runs from its due time. Every request ends in exactly one outcome:

- `ok`: a 200 within the budget (from its due time);
- `late`: a 200 after the budget;
- `status <n>`: any other HTTP status;
- `refused` / `connect_timeout`: no connection (nothing was sent; safe to retry);
- `lost`: sent, then no answer -- a reset, a close or a timeout before any response.

Runs in its own thread with its own event loop, so the caller can inject faults meanwhile.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass
class LoadResult:
    """Outcomes of one load run."""

    sent: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    latencies_200_s: list[float] = field(default_factory=list)  # from due time, every 200

    @property
    def within_budget(self) -> int:
        return self.outcomes["ok"]

    @property
    def lost(self) -> int:
        return self.outcomes["lost"]

    def failed(self) -> dict[str, int]:
        """Outcomes other than ok and lost, by kind (`503`, `504`, `late`, `refused`, ...)."""
        return {k: v for k, v in sorted(self.outcomes.items()) if k not in ("ok", "lost")}


class OpenLoopLoad:
    """POST `bodies` (cycled) to `url` at `rate` per second for `seconds`, in a thread.

    Args:
        url: where to POST.
        bodies: JSON bodies, used in turn.
        rate: requests per second.
        seconds: how long requests are started.
        budget_s: an answer later than this after its due time is `late`.
        budgets_s: per-request budgets instead (request k: `budgets_s[k % len]`), each sent
            as `X-Request-Timeout-Ms`.
        poisson_seed: Poisson arrivals from this seed instead of evenly spaced ones.
        connections: the client's pool size.
        keepalive: connections kept open between requests; the others close after their
            answer, so new connections keep being made, as from many clients.
    """

    def __init__(
        self,
        url: str,
        bodies: Sequence[dict[str, Any]],
        *,
        rate: float,
        seconds: float,
        budget_s: float,
        connections: int = 32,
        keepalive: int = 8,
        budgets_s: Sequence[float] = (),
        poisson_seed: int | None = None,
    ) -> None:
        self.url = url
        self.bodies = bodies
        self.rate = rate
        self.seconds = seconds
        self.budget_s = budget_s
        self.connections = connections
        self.keepalive = keepalive
        self.budgets_s = budgets_s
        self.poisson_seed = poisson_seed
        self.result = LoadResult()
        self.started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> OpenLoopLoad:
        self._thread.start()
        self.started.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.join()

    def join(self) -> LoadResult:
        """Wait until every request has its outcome.

        Raises:
            RuntimeError: the load itself failed (not a request: those are outcomes).
        """
        self._thread.join(self.seconds + self.budget_s + 30)
        if self._error is not None:
            raise RuntimeError("the load generator failed") from self._error
        return self.result

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # handed to join(), in the caller's thread
            self._error = exc
            self.started.set()

    async def _main(self) -> None:
        limits = httpx.Limits(max_connections=self.connections, max_keepalive_connections=self.keepalive)
        # Long enough that only a hang trips it; the pool wait counts against the budget.
        timeout = httpx.Timeout(max((self.budget_s, *self.budgets_s)) + 4.0, pool=self.seconds + 10.0)
        async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
            tasks = []
            start = time.monotonic()
            self.started.set()
            k = 0
            arrivals = random.Random(self.poisson_seed)
            offset = 0.0
            while True:
                if self.poisson_seed is None:
                    offset = k / self.rate
                else:
                    offset += arrivals.expovariate(self.rate)
                if offset >= self.seconds:
                    break
                due = start + offset
                delay = due - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                budget_s = self.budgets_s[k % len(self.budgets_s)] if self.budgets_s else self.budget_s
                body = self.bodies[k % len(self.bodies)]
                tasks.append(asyncio.create_task(self._one(client, body, due, budget_s)))
                k += 1
            await asyncio.gather(*tasks)

    async def _one(self, client: httpx.AsyncClient, body: dict[str, Any], due: float, budget_s: float) -> None:
        self.result.sent += 1
        headers = {"x-request-timeout-ms": str(round(budget_s * 1000))} if self.budgets_s else None
        try:
            response = await client.post(self.url, json=body, headers=headers)
        except httpx.ConnectError:
            outcome = "refused"
        except httpx.ConnectTimeout:
            outcome = "connect_timeout"
        except (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError, httpx.TimeoutException):
            outcome = "lost"
        else:
            latency = time.monotonic() - due
            if response.status_code != 200:
                outcome = str(response.status_code)
            else:
                self.result.latencies_200_s.append(latency)
                outcome = "ok" if latency <= budget_s else "late"
        self.result.outcomes[outcome] += 1
