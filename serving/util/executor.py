"""The one way blocking work leaves the event loop.

``Session.run`` and model loads block; they run on a thread pool through
:meth:`BlockingExecutor.run`, never on the loop (TensorFlow releases the GIL while it computes, so
the pool runs sessions in parallel). REST requests use a pool of ``--rest_api_num_threads``
threads (TF Serving's ``RequestExecutor`` of the same size); loads use their own pool so a slow
load never starves requests.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

__all__ = ["BlockingExecutor"]

_P = ParamSpec("_P")
_T = TypeVar("_T")


class BlockingExecutor:
    """A named thread pool with an ``await``-able :meth:`run`."""

    def __init__(self, max_workers: int, name: str) -> None:
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=name)
        self.max_workers = max_workers

    async def run(self, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """Run ``fn(*args, **kwargs)`` on the pool and await its result (or exception)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    def submit(self, fn: Callable[_P, object], /, *args: _P.args, **kwargs: _P.kwargs) -> None:
        """Run ``fn(*args, **kwargs)`` on the pool without awaiting it (fire and forget).

        For callers that hand results back to the loop themselves
        (``loop.call_soon_threadsafe``) and so skip the per-call asyncio future of :meth:`run`.
        ``fn`` must handle its own exceptions: nothing looks at the pool's future.
        """
        self._pool.submit(fn, *args, **kwargs)

    def shutdown(self, wait: bool = True) -> None:
        """Stop accepting work; with ``wait``, block until running calls finish."""
        self._pool.shutdown(wait=wait, cancel_futures=not wait)
