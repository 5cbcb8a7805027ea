"""serving.util.process_executor: jobs in low-priority worker processes, their answers and
errors as if run here, bounded waiting, a worker dying mid-job, cancellation and closing.

Real worker processes; the jobs are functions every worker can import (``os``, ``time``, numpy,
the JSON codec). Each test is bounded in time (:data:`BOUND_S` per await).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time
import types
from collections.abc import Awaitable, Callable
from typing import TypeVar

import numpy as np
import pytest

from serving.util import json_tensor
from serving.util.errors import Code, ServingError
from serving.util.process_executor import ProcessExecutor
from tests.support import children_running

BOUND_S = 30.0
_T = TypeVar("_T")


def run_with_pool(
    test: Callable[[ProcessExecutor], Awaitable[_T]], processes: int = 1, max_queued: int = 4
) -> _T:
    """``test(pool)`` on a new loop with a started pool, closed afterwards."""

    async def main() -> _T:
        pool = ProcessExecutor(processes, max_queued=max_queued, name="test pool")
        await pool.start()
        try:
            return await asyncio.wait_for(test(pool), BOUND_S)
        finally:
            await asyncio.wait_for(pool.close(), BOUND_S)

    return asyncio.run(main())


def worker_pids(pool: ProcessExecutor) -> set[int]:
    return {worker.process.pid for worker in pool._workers}


def test_a_job_returns_its_result_and_arrays_come_back_writable() -> None:
    async def test(pool: ProcessExecutor) -> None:
        array = np.arange(12, dtype=np.float32).reshape(3, 4)
        negated = await pool.run(np.negative, array)
        assert negated.dtype == np.float32 and negated.shape == (3, 4)
        np.testing.assert_array_equal(negated, -array)
        negated[0, 0] = 1.0  # as writable as an array made here
        assert await pool.run(os.getpid) in worker_pids(pool)
        assert await pool.run(os.getpid) != os.getpid()

    run_with_pool(test)


def test_a_body_is_decoded_as_in_process() -> None:
    body = b'{"signature_name": "s", "instances": [[1.5, 2.0], [3.0, 4.25]]}'
    dtypes = {"s": {"x": "DT_FLOAT"}}

    async def test(pool: ProcessExecutor) -> json_tensor.PredictBody:
        return await pool.run(json_tensor.decode_predict_body, body, dtypes)

    decoded = run_with_pool(test)
    here = json_tensor.decode_predict_body(body, dtypes)
    assert decoded.signature_name == here.signature_name == "s"
    assert decoded.input_dtypes == here.input_dtypes
    assert decoded.tensors()[0] is here.tensors()[0] is json_tensor.JsonFormat.ROW
    np.testing.assert_array_equal(decoded.tensors()[1]["x"], here.tensors()[1]["x"])


def test_errors_come_back_with_their_code_and_message() -> None:
    async def test(pool: ProcessExecutor) -> None:
        with pytest.raises(ServingError) as parse_error:
            await pool.run(json_tensor.parse_json, b'{"instances": [1,')
        assert parse_error.value.code is Code.INVALID_ARGUMENT
        assert parse_error.value.message == "JSON Parse error: Invalid value. at offset: 17"
        # Decoding's error is kept for later, as the REST handler raises it after the lookup.
        decoded = await pool.run(
            json_tensor.decode_predict_body, b'{"instances": ["a"]}', {"serving_default": {"x": "DT_FLOAT"}}
        )
        with pytest.raises(ServingError) as decode_error:
            decoded.tensors()
        assert decode_error.value.code is Code.INVALID_ARGUMENT
        assert "is not of expected type: float" in decode_error.value.message
        with pytest.raises(ValueError, match="invalid literal"):
            await pool.run(int, "x")
        assert await pool.run(int, "7") == 7  # the worker is still there

    run_with_pool(test)


def test_workers_run_at_the_lowest_cpu_priority() -> None:
    async def test(pool: ProcessExecutor) -> tuple[int, int]:
        return await pool.run(os.nice, 0), await pool.run(os.sched_getscheduler, 0)

    niceness, policy = run_with_pool(test)
    assert niceness == 19
    assert policy == os.SCHED_IDLE  # Linux; where it is refused the worker keeps nice 19


def test_a_worker_dying_mid_job_fails_that_job_only_and_is_replaced() -> None:
    async def test(pool: ProcessExecutor) -> None:
        (first,) = worker_pids(pool)
        job = asyncio.ensure_future(pool.run(time.sleep, 60))
        await asyncio.sleep(0.5)
        os.kill(first, signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(ServingError) as died:
            await job
        assert time.monotonic() - started < 5.0
        assert died.value.code is Code.UNAVAILABLE
        assert "worker process died" in died.value.message and "SIGKILL" in died.value.message
        replacement = await pool.run(os.getpid)
        assert replacement != first and worker_pids(pool) == {replacement}

    run_with_pool(test)


def test_a_worker_that_died_idle_is_replaced_before_a_job_reaches_it() -> None:
    async def test(pool: ProcessExecutor) -> None:
        (first,) = worker_pids(pool)
        os.kill(first, signal.SIGKILL)
        await asyncio.sleep(0.5)  # reaped
        assert await pool.run(int, "3") == 3
        assert first not in worker_pids(pool)

    run_with_pool(test)


def test_beyond_the_queue_a_job_is_refused_at_once() -> None:
    async def test(pool: ProcessExecutor) -> None:
        running = asyncio.ensure_future(pool.run(time.sleep, 1.0))
        await asyncio.sleep(0.2)
        waiting = asyncio.ensure_future(pool.run(int, "1"))
        await asyncio.sleep(0.05)
        started = time.monotonic()
        with pytest.raises(ServingError) as refused:
            await pool.run(int, "2")
        assert time.monotonic() - started < 0.5
        assert refused.value.code is Code.UNAVAILABLE
        assert "already wait for a worker process" in refused.value.message
        assert await running is None and await waiting == 1

    run_with_pool(test, processes=1, max_queued=1)


def test_a_cancelled_job_kills_its_worker_and_the_pool_goes_on() -> None:
    async def test(pool: ProcessExecutor) -> None:
        (first,) = worker_pids(pool)
        job = asyncio.ensure_future(pool.run(time.sleep, 60))
        await asyncio.sleep(0.3)
        job.cancel()
        with pytest.raises(asyncio.CancelledError):
            await job
        assert await pool.run(int, "5") == 5
        assert first not in worker_pids(pool)

    run_with_pool(test)


def test_close_lets_the_job_in_flight_finish_and_the_workers_exit() -> None:
    async def main() -> None:
        pool = ProcessExecutor(2, max_queued=4, name="test pool")
        await pool.start()
        processes = [worker.process for worker in pool._workers]
        # Both workers up (their signal dispositions set): one job each at once.
        await asyncio.gather(pool.run(time.sleep, 0.2), pool.run(time.sleep, 0.2))
        job = asyncio.ensure_future(pool.run(time.sleep, 0.5))
        await asyncio.sleep(0.1)
        os.kill(processes[0].pid, signal.SIGTERM)  # ignored: the server decides when they end
        os.kill(processes[1].pid, signal.SIGTERM)
        await asyncio.wait_for(pool.close(), BOUND_S)
        assert await job is None
        assert all(process.returncode == 0 for process in processes)
        with pytest.raises(ServingError) as closed:
            await pool.run(int, "1")
        assert closed.value.code is Code.UNAVAILABLE

    asyncio.run(main())


def test_a_job_the_worker_cannot_unpickle_is_an_internal_error_and_the_worker_goes_on() -> None:
    # A function only this process has (a module made here): the worker cannot import it.
    here_only = types.ModuleType("made_in_the_test_process")
    exec("def answer():\n    return 42\n", here_only.__dict__)  # noqa: S102 - a fixed test function
    sys.modules[here_only.__name__] = here_only

    async def test(pool: ProcessExecutor) -> None:
        (worker,) = worker_pids(pool)
        with pytest.raises(ServingError) as info:
            await pool.run(here_only.answer)
        assert info.value.code is Code.INTERNAL
        assert "made_in_the_test_process" in info.value.message, info.value.message
        with pytest.raises(TypeError, match="cannot pickle"):  # refused before it reaches a worker
            await pool.run(len, threading.Lock())
        assert await pool.run(os.getpid) == worker  # the same worker, still in step

    try:
        run_with_pool(test)
    finally:
        del sys.modules[here_only.__name__]


def test_close_right_after_a_worker_died_waits_for_its_replacement_and_ends_it() -> None:
    async def main() -> None:
        pool = ProcessExecutor(1, max_queued=4, name="test pool")
        await pool.start()
        (first,) = worker_pids(pool)
        job = asyncio.ensure_future(pool.run(time.sleep, 60))
        await asyncio.sleep(0.3)
        os.kill(first, signal.SIGKILL)
        with pytest.raises(ServingError):
            await asyncio.wait_for(job, BOUND_S)
        assert pool._spawning  # the replacement is being started
        await asyncio.wait_for(pool.close(), BOUND_S)
        assert not pool._spawning
        assert worker_children() == set()

    asyncio.run(asyncio.wait_for(main(), 2 * BOUND_S))


def worker_children() -> set[int]:
    """This process's children that run the worker module, still running."""
    return children_running(os.getpid(), "serving.util.process_executor")


async def replaced(pool: ProcessExecutor, worker: int) -> None:
    """Until ``worker`` is gone from the pool and another is there (polled: the pool has no
    event for it)."""
    while worker in worker_pids(pool) or not worker_pids(pool):  # noqa: ASYNC110
        await asyncio.sleep(0.05)


def test_a_job_past_its_bound_is_unavailable_and_its_worker_replaced() -> None:
    async def main() -> None:
        pool = ProcessExecutor(1, max_queued=4, name="test pool", timeout_s=0.3)
        await pool.start()
        try:
            (first,) = worker_pids(pool)
            running = asyncio.ensure_future(pool.run(time.sleep, 20))
            queued = asyncio.ensure_future(pool.run(os.getpid))  # waits for the busy worker
            for job in (running, queued):
                with pytest.raises(ServingError) as caught:
                    await asyncio.wait_for(job, BOUND_S)
                assert caught.value.code == Code.UNAVAILABLE
                assert "no answer within 300 ms" in str(caught.value)
            await asyncio.wait_for(replaced(pool, first), BOUND_S)
            # The pool goes on; unbounded now, since a new worker's start-up (an interpreter
            # on a busy machine) may itself take longer than the bound.
            pool.timeout_s = None
            pid = await asyncio.wait_for(pool.run(os.getpid), BOUND_S)
            assert pid != first and pid in worker_pids(pool)
        finally:
            await asyncio.wait_for(pool.close(), BOUND_S)

    asyncio.run(main())


def test_a_bound_must_be_positive() -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        ProcessExecutor(1, max_queued=1, name="test pool", timeout_s=0)
