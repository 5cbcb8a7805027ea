"""`DirectSession` with `--session_run_inline_below_us`: short runs on the event loop, long ones
on the request threads (a fake servable; no TensorFlow)."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np

from serving.core.servable_handle import ServableHandle
from serving.servables.tensorflow.serving_session import DirectSession
from serving.util.executor import BlockingExecutor


class FakeServable:
    """Sleeps `seconds` per run and remembers the thread each run was on."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.threads: list[int] = []

    def run_tensors(self, feeds, fetches, timeout_ms=None):  # type: ignore[no-untyped-def]
        self.threads.append(threading.get_ident())
        if self.seconds:
            time.sleep(self.seconds)
        return [feeds["x"] * 2]


def run(session: DirectSession, servable: FakeServable, calls: int, rows: int = 1) -> int:
    """`calls` runs in one loop; how many ran on the loop's own thread."""
    handle = ServableHandle("m", 1, servable)
    feeds = {"x": np.ones((rows, 3), np.float32)}

    async def main() -> int:
        loop_thread = threading.get_ident()
        for _ in range(calls):
            (out,) = await session.run_tensors(handle, feeds, ["y"], None)
            assert out.shape == (rows, 3)
        return sum(1 for t in servable.threads if t == loop_thread)

    return asyncio.run(main())


def test_off_by_default_every_run_goes_to_the_threads() -> None:
    executor = BlockingExecutor(1, "t")
    try:
        assert run(DirectSession(executor), FakeServable(0.0), 10) == 0
    finally:
        executor.shutdown()


def test_short_runs_go_inline_after_the_first_is_measured_on_a_thread() -> None:
    executor = BlockingExecutor(1, "t")
    try:
        inline = run(DirectSession(executor, inline_below_s=0.005), FakeServable(0.0), 10)
        assert inline == 9  # the first run measures the cost, on a thread
    finally:
        executor.shutdown()


def test_long_runs_stay_on_the_threads() -> None:
    executor = BlockingExecutor(1, "t")
    try:
        assert run(DirectSession(executor, inline_below_s=0.001), FakeServable(0.003), 5) == 0
    finally:
        executor.shutdown()


def test_an_inlined_key_is_rechecked_on_a_thread_now_and_then() -> None:
    executor = BlockingExecutor(1, "t")
    try:
        calls = 1 + 2 * DirectSession.RECHECK_EVERY
        inline = run(DirectSession(executor, inline_below_s=0.005), FakeServable(0.0), calls)
        assert inline == calls - 3  # the first, and two rechecks
    finally:
        executor.shutdown()


def test_each_batch_size_is_judged_on_its_own() -> None:
    executor = BlockingExecutor(1, "t")
    session = DirectSession(executor, inline_below_s=0.005)
    try:
        assert run(session, FakeServable(0.0), 3, rows=1) == 2
        assert run(session, FakeServable(0.0), 3, rows=64) == 2  # measured once more, for 64 rows
    finally:
        executor.shutdown()
