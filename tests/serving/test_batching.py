"""serving.batching.batching_session in process: the real scheduler and batch threads, a scripted servable.

The servable is a stand-in for :class:`serving.servables.tensorflow.servable.Servable` behind the same
``run_tensors`` seam (the Session interface), so batch formation, queue limits, deadlines and
failures can be driven deterministically: a gate holds the batch thread busy while the next
requests queue up. End-to-end batching through ``python -m serving`` is in
``test_batching_server.py``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

import numpy as np
import pytest

from serving.batching import batching_options
from serving.batching.batching_options import BatchingOptions
from serving.batching.batching_session import BatchingSession
from serving.core.servable_handle import ServableHandle
from serving.model_servers import server_config
from serving.model_servers.flags import parse_flags
from serving.util.errors import Code, ServingError
from serving.util.executor import BlockingExecutor
from serving.util.metrics import ServingMetrics
from tools.processes import run_to_exit, serving_command

_T = TypeVar("_T")
FETCHES = ("y:0", "tag:0")
GATE_TIMEOUT_S = 30.0


class ScriptedServable:
    """``run_tensors``: y = 2x + 1, tag = x's row as text; records each batch's rows.

    A row with a negative value makes the run fail with INVALID_ARGUMENT (a "bad request");
    while ``gate`` is set-able and clear, runs block, holding their batch thread.
    """

    def __init__(self) -> None:
        self.batches: list[int] = []
        self.gate = threading.Event()
        self.gate.set()
        self.running = threading.Event()
        self.unbatched_output = False

    def run_tensors(
        self,
        feeds: Mapping[str, np.ndarray],
        fetches: Sequence[str],
        timeout_ms: int | None = None,
    ) -> list[np.ndarray]:
        x = feeds["x:0"]
        self.batches.append(int(x.shape[0]))
        self.running.set()
        if not self.gate.wait(GATE_TIMEOUT_S):
            raise AssertionError("gate never opened")
        if (x < 0).any():
            raise ServingError(Code.INVALID_ARGUMENT, f"negative input in a batch of {len(x)}")
        if self.unbatched_output:
            return [np.float32(1.0) * np.ones(()), np.array(b"x", object)]
        tags = np.array([",".join(map(str, row.ravel().tolist())).encode() for row in x], object)
        return [2 * x + 1, tags]


@pytest.fixture
def executor() -> Iterator[BlockingExecutor]:
    pool = BlockingExecutor(1, "test-batch")
    yield pool
    pool.shutdown()


def _session(executor: BlockingExecutor, **options: object) -> BatchingSession:
    return BatchingSession(BatchingOptions(num_batch_threads=1, **options), executor)  # type: ignore[arg-type]


def _run(coroutine: Awaitable[_T]) -> _T:
    return asyncio.run(asyncio.wait_for(coroutine, 60))  # type: ignore[arg-type]


async def _until(condition: Callable[[], bool]) -> None:
    """Yield to the loop until ``condition`` holds (bounded)."""
    deadline = time.monotonic() + GATE_TIMEOUT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition never held")
        await asyncio.sleep(0.001)


def _call(
    session: BatchingSession,
    servable: ScriptedServable,
    rows: Sequence[Sequence[float]],
    timeout_ms: int | None = None,
) -> Awaitable[list[np.ndarray]]:
    handle = ServableHandle("m", 1, servable)
    feeds = {"x:0": np.array(rows, np.float32)}
    return session.run_tensors(handle, feeds, FETCHES, timeout_ms)


def _check(result: list[np.ndarray], rows: Sequence[Sequence[float]]) -> None:
    """Exactly the caller's rows: 2x + 1, and the tags of its own inputs."""
    x = np.array(rows, np.float32)
    np.testing.assert_array_equal(result[0], 2 * x + 1)
    assert result[1].tolist() == [",".join(map(str, row.tolist())).encode() for row in x]


async def _hold_thread(session: BatchingSession, servable: ScriptedServable) -> asyncio.Task:
    """Start a one-row call and wait until it occupies the (only) batch thread."""
    servable.gate.clear()
    first = asyncio.ensure_future(_call(session, servable, [[100.0]]))
    await _until(servable.running.is_set)
    return first


def test_requests_arriving_while_the_thread_is_busy_share_one_batch(
    executor: BlockingExecutor,
) -> None:
    servable = ScriptedServable()
    session = _session(executor)
    inputs = [[[float(i), float(i) + 0.5]] * (1 + i % 3) for i in range(6)]

    async def scenario() -> None:
        first = await _hold_thread(session, servable)
        calls = [asyncio.ensure_future(_call(session, servable, rows)) for rows in inputs]
        await asyncio.sleep(0)
        servable.gate.set()
        _check(await first, [[100.0]])
        for call, rows in zip(calls, inputs, strict=True):
            _check(await call, rows)

    _run(scenario())
    assert servable.batches == [1, sum(len(rows) for rows in inputs)]


def test_batches_hold_at_most_max_batch_size_rows(executor: BlockingExecutor) -> None:
    servable = ScriptedServable()
    session = _session(executor, max_batch_size=4)
    inputs = [[[float(i)]] * size for i, size in enumerate([2, 1, 3, 2, 4])]

    async def scenario() -> None:
        first = await _hold_thread(session, servable)
        calls = [asyncio.ensure_future(_call(session, servable, rows)) for rows in inputs]
        await asyncio.sleep(0)
        servable.gate.set()
        await first
        for call, rows in zip(calls, inputs, strict=True):
            _check(await call, rows)

    _run(scenario())
    # 2+1 fit, 3 does not fit after them, 3 and then 2 do not share, 4 alone: TF's Queue::Schedule.
    assert servable.batches == [1, 3, 3, 2, 4]


def test_a_full_queue_refuses_with_tf_servings_error(executor: BlockingExecutor) -> None:
    servable = ScriptedServable()
    session = _session(executor, max_batch_size=1, max_enqueued_batches=2)

    async def scenario() -> None:
        first = await _hold_thread(session, servable)
        queued = [asyncio.ensure_future(_call(session, servable, [[float(i)]])) for i in (1, 2)]
        await asyncio.sleep(0)
        with pytest.raises(ServingError) as info:
            await _call(session, servable, [[3.0]])
        assert (info.value.code, info.value.message) == (
            Code.UNAVAILABLE,
            "The batch scheduling queue to which this task was submitted is full",
        )
        servable.gate.set()
        await first
        for call, value in zip(queued, (1.0, 2.0), strict=True):
            _check(await call, [[value]])

    _run(scenario())


def test_a_request_larger_than_max_batch_size_is_refused(executor: BlockingExecutor) -> None:
    session = _session(executor, max_batch_size=2)
    with pytest.raises(ServingError) as info:
        _run(_call(session, ScriptedServable(), [[1.0], [2.0], [3.0]]))
    assert (info.value.code, info.value.message) == (
        Code.INVALID_ARGUMENT,
        "Task size 3 is larger than maximum input batch size 2",
    )


def test_unbatchable_feeds_get_tf_servings_errors(executor: BlockingExecutor) -> None:
    session = _session(executor)
    handle = ServableHandle("m", 1, ScriptedServable())
    with pytest.raises(ServingError) as info:
        _run(session.run_tensors(handle, {"x:0": np.float32(1) * np.ones(())}, FETCHES, None))
    assert info.value.message == "Batching Run() input tensors must have at least one dimension"


def test_a_bad_request_fails_alone(executor: BlockingExecutor) -> None:
    """A merged run that fails is retried per request: only the bad one gets the error."""
    servable = ScriptedServable()
    session = _session(executor)
    good = [[[1.0]], [[2.0], [3.0]], [[4.0]]]

    async def scenario() -> None:
        first = await _hold_thread(session, servable)
        calls = [asyncio.ensure_future(_call(session, servable, rows)) for rows in good]
        bad = asyncio.ensure_future(_call(session, servable, [[-1.0]]))
        await asyncio.sleep(0)
        servable.gate.set()
        await first
        for call, rows in zip(calls, good, strict=True):
            _check(await call, rows)
        with pytest.raises(ServingError) as info:
            await bad
        assert (info.value.code, info.value.message) == (
            Code.INVALID_ARGUMENT,
            "negative input in a batch of 1",  # its own run's error, not the batch's
        )

    _run(scenario())
    assert servable.batches == [1, 5, 1, 2, 1, 1]


def test_requests_of_other_shapes_are_queued_apart(executor: BlockingExecutor) -> None:
    servable = ScriptedServable()
    session = _session(executor)

    async def scenario() -> None:
        first = await _hold_thread(session, servable)
        narrow = [asyncio.ensure_future(_call(session, servable, [[float(i)]])) for i in range(3)]
        wide = asyncio.ensure_future(_call(session, servable, [[7.0, 8.0]]))
        await asyncio.sleep(0)
        servable.gate.set()
        await first
        for i, call in enumerate(narrow):
            _check(await call, [[float(i)]])
        _check(await wide, [[7.0, 8.0]])

    _run(scenario())
    assert sorted(servable.batches[1:]) == [1, 3]


def test_allowed_batch_sizes_pad_and_slice_off(executor: BlockingExecutor) -> None:
    servable = ScriptedServable()
    metrics = ServingMetrics()
    session = BatchingSession(
        BatchingOptions(num_batch_threads=1, max_batch_size=8, allowed_batch_sizes=(2, 8)),
        executor,
        metrics,
    )
    inputs = [[[1.0]], [[2.0], [3.0]]]

    async def scenario() -> None:
        first = await _hold_thread(session, servable)
        calls = [asyncio.ensure_future(_call(session, servable, rows)) for rows in inputs]
        await asyncio.sleep(0)
        servable.gate.set()
        _check(await first, [[100.0]])
        for call, rows in zip(calls, inputs, strict=True):
            _check(await call, rows)

    _run(scenario())
    assert servable.batches == [2, 8]  # 1 row padded to 2, 3 rows padded to 8
    page = metrics.render().decode()
    assert ":tensorflow:serving:batching_session:processed_batch_size_sum{} 10" in page
    assert (
        ':tensorflow:serving:batching_session:padding_size_sum{execution_batch_size="8"} 5' in page
    )


def test_variable_length_inputs_are_padded_into_one_batch(executor: BlockingExecutor) -> None:
    servable = ScriptedServable()
    session = _session(executor, pad_variable_length_inputs=True)

    async def scenario() -> list[list[np.ndarray]]:
        first = await _hold_thread(session, servable)
        calls = [
            asyncio.ensure_future(_call(session, servable, rows))
            for rows in ([[1.0, 2.0]], [[3.0, 4.0, 5.0, 6.0]], [[7.0]])
        ]
        await asyncio.sleep(0)
        servable.gate.set()
        await first
        return [await call for call in calls]

    short, longest, shortest = _run(scenario())
    assert servable.batches == [1, 3]
    # TF Serving's contract: outputs come back as long as the batch's longest input, and the
    # padding repeats each request's first element.
    np.testing.assert_array_equal(short[0], [[3.0, 5.0, 3.0, 3.0]])
    np.testing.assert_array_equal(longest[0], [[7.0, 9.0, 11.0, 13.0]])
    np.testing.assert_array_equal(shortest[0], [[15.0, 15.0, 15.0, 15.0]])


def test_an_open_batch_waits_batch_timeout_micros_for_company(executor: BlockingExecutor) -> None:
    servable = ScriptedServable()
    session = _session(executor, batch_timeout_micros=50_000, max_batch_size=3)

    async def scenario() -> None:
        started = time.monotonic()
        pair = [asyncio.ensure_future(_call(session, servable, [[float(i)]])) for i in (1, 2)]
        for i, call in enumerate(pair, start=1):
            _check(await call, [[float(i)]])
        assert time.monotonic() - started >= 0.05  # it waited for a third request
        trio = [asyncio.ensure_future(_call(session, servable, [[float(i)]])) for i in (3, 4, 5)]
        for i, call in enumerate(trio, start=3):
            _check(await call, [[float(i)]])  # full: runs without waiting for the timeout

    _run(scenario())
    assert servable.batches == [2, 3]


def test_a_request_whose_deadline_passes_in_the_queue_fails_alone(
    executor: BlockingExecutor,
) -> None:
    servable = ScriptedServable()
    session = _session(executor)

    async def scenario() -> None:
        first = await _hold_thread(session, servable)
        patient = asyncio.ensure_future(_call(session, servable, [[1.0]], timeout_ms=60_000))
        hasty = asyncio.ensure_future(_call(session, servable, [[2.0]], timeout_ms=1))
        expiry = time.monotonic() + 0.001
        await _until(lambda: time.monotonic() > expiry)
        servable.gate.set()
        await first
        _check(await patient, [[1.0]])
        with pytest.raises(ServingError) as info:
            await hasty
        assert (info.value.code, info.value.message) == (
            Code.RESOURCE_EXHAUSTED,
            "Run() timeout exceeded while waiting in batching queue",
        )

    _run(scenario())
    assert servable.batches == [1, 1]


def test_a_cancelled_request_is_left_out_of_its_batch(executor: BlockingExecutor) -> None:
    servable = ScriptedServable()
    session = _session(executor)

    async def scenario() -> None:
        first = await _hold_thread(session, servable)
        gone = asyncio.ensure_future(_call(session, servable, [[1.0], [1.0]]))
        kept = asyncio.ensure_future(_call(session, servable, [[2.0]]))
        await asyncio.sleep(0)
        gone.cancel()
        servable.gate.set()
        await first
        _check(await kept, [[2.0]])

    _run(scenario())
    assert servable.batches == [1, 1]


def test_unbatched_outputs_fail_every_request_of_the_batch(executor: BlockingExecutor) -> None:
    servable = ScriptedServable()
    servable.unbatched_output = True
    with pytest.raises(ServingError) as info:
        _run(_call(_session(executor), servable, [[1.0]]))
    assert (info.value.code, info.value.message) == (
        Code.FAILED_PRECONDITION,
        "Batched output tensor has 0 dimensions",
    )


def test_batch_threads_are_shared_round_robin_across_servables(
    executor: BlockingExecutor,
) -> None:
    """Two versions' queues, one thread: batches alternate between them (SharedBatchScheduler)."""
    one, two = ScriptedServable(), ScriptedServable()
    order: list[str] = []
    for name, servable in (("one", one), ("two", two)):
        run = servable.run_tensors

        def recorded(*args: object, _run: object = run, _name: str = name) -> list[np.ndarray]:
            order.append(_name)
            return _run(*args)  # type: ignore[operator]

        servable.run_tensors = recorded  # type: ignore[method-assign]
    session = _session(executor, max_batch_size=1, max_enqueued_batches=5)

    async def scenario() -> None:
        first = await _hold_thread(session, one)
        calls = [
            asyncio.ensure_future(_call(session, servable, [[float(i)]]))
            for i in range(3)
            for servable in (one, two)
        ]
        await asyncio.sleep(0)
        one.gate.set()
        await first
        await asyncio.gather(*calls)

    _run(scenario())
    assert order[1:] == ["two", "one"] * 3 or order[1:] == ["one", "two"] * 3


# ---- enable_large_batch_splitting ----------------------------------------------------------


def _splitting(
    executor: BlockingExecutor, metrics: ServingMetrics | None = None, **options: object
) -> BatchingSession:
    defaults: dict[str, object] = {
        "num_batch_threads": 1,
        "enable_large_batch_splitting": True,
        "max_batch_size": 16,
        "max_execution_batch_size": 4,
    }
    merged = {**defaults, **options}
    return BatchingSession(BatchingOptions(**merged), executor, metrics)  # type: ignore[arg-type]


def _histogram(metrics: ServingMetrics, name: str) -> dict[str, float]:
    """``le`` (and ``sum``/``count``) -> value of an unlabelled batching_session histogram."""
    prefix = f":tensorflow:serving:batching_session:{name}"
    values: dict[str, float] = {}
    for line in metrics.render().decode().splitlines():
        if line.startswith(f"{prefix}_bucket{{le="):
            values[line.split('"')[1]] = float(line.rsplit(" ", 1)[1])
        elif line.startswith((f"{prefix}_sum{{}}", f"{prefix}_count{{}}")):
            values[line.split("{")[0].rsplit("_", 1)[1]] = float(line.rsplit(" ", 1)[1])
    return values


def test_a_request_larger_than_max_execution_batch_size_is_split_and_rejoined(
    executor: BlockingExecutor,
) -> None:
    """10 rows, batches of at most 4: three runs (4, 4, 2), and the caller gets its 10 rows in
    order; the metrics see one 10-row input and three batches of at most 4 rows."""
    servable = ScriptedServable()
    metrics = ServingMetrics()
    session = _splitting(executor, metrics)
    rows = [[float(i), float(i) + 0.5] for i in range(10)]
    result = _run(_call(session, servable, rows))
    _check(result, rows)
    assert servable.batches == [4, 4, 2]
    processed = _histogram(metrics, "processed_batch_size")
    assert processed["count"] == 3 and processed["sum"] == 10
    assert processed["4"] == processed["+Inf"]  # no executed batch above 4 rows
    inputs = _histogram(metrics, "input_batch_size")
    assert inputs["count"] == 1 and inputs["sum"] == 10  # recorded once, unsplit


def test_a_split_request_first_fills_the_open_batch(executor: BlockingExecutor) -> None:
    """TF's eager split: a 5-row request behind a 3-row one in a batch of 4 gives 1 row to that
    batch and its other 4 to the next (InputSplitMetadata), each caller getting its own rows."""
    servable = ScriptedServable()
    session = _splitting(executor)
    small = [[1.0], [2.0], [3.0]]
    large = [[10.0 + i] for i in range(5)]

    async def scenario() -> None:
        first = await _hold_thread(session, servable)
        calls = [asyncio.ensure_future(_call(session, servable, rows)) for rows in (small, large)]
        await asyncio.sleep(0)
        servable.gate.set()
        _check(await first, [[100.0]])
        for call, rows in zip(calls, (small, large), strict=True):
            _check(await call, rows)

    _run(scenario())
    assert servable.batches == [1, 4, 4]


def test_split_parts_are_padded_to_allowed_batch_sizes(executor: BlockingExecutor) -> None:
    servable = ScriptedServable()
    metrics = ServingMetrics()
    session = _splitting(executor, metrics, allowed_batch_sizes=(2, 4))
    rows = [[float(i)] for i in range(5)]
    _check(_run(_call(session, servable, rows)), rows)
    assert servable.batches == [4, 2]  # parts of 4 and 1 rows, the second padded to 2
    processed = _histogram(metrics, "processed_batch_size")
    assert processed["4"] == processed["+Inf"] == 2


def test_a_failing_part_fails_the_split_request(executor: BlockingExecutor) -> None:
    servable = ScriptedServable()
    session = _splitting(executor)
    rows = [[1.0], [2.0], [3.0], [4.0], [-5.0], [6.0]]  # the bad row is in the second part
    with pytest.raises(ServingError) as info:
        _run(_call(session, servable, rows))
    assert (info.value.code, info.value.message) == (
        Code.INVALID_ARGUMENT,
        "negative input in a batch of 2",
    )
    assert servable.batches == [4, 2]


def test_a_split_request_beyond_the_queues_capacity_is_refused(
    executor: BlockingExecutor,
) -> None:
    """ValidateBatchTaskQueueCapacity with splitting: capacity is counted in rows of
    max_execution_batch_size, and a refused request leaves nothing queued."""
    servable = ScriptedServable()
    session = _splitting(executor, max_execution_batch_size=2, max_enqueued_batches=2)

    async def scenario() -> None:
        first = await _hold_thread(session, servable)
        queued = asyncio.ensure_future(_call(session, servable, [[1.0], [2.0], [3.0]]))
        await asyncio.sleep(0)  # parts of 2 and 1 rows: two batches, one row free
        with pytest.raises(ServingError) as info:
            await _call(session, servable, [[4.0], [5.0]])
        assert (info.value.code, info.value.message) == (
            Code.UNAVAILABLE,
            "The batch scheduling queue to which this task was submitted is full; task size is "
            "2 but scheduling capacity is only 1 (num_enqueued_batches=2, max_enqueued_batches=2, "
            "open_batch_size=1, max_execution_batch_size=2)",
        )
        fits = asyncio.ensure_future(_call(session, servable, [[6.0]]))
        servable.gate.set()
        await first
        _check(await queued, [[1.0], [2.0], [3.0]])
        _check(await fits, [[6.0]])

    _run(scenario())
    assert servable.batches == [1, 2, 2]


def test_a_cancelled_split_request_leaves_its_parts_out(executor: BlockingExecutor) -> None:
    servable = ScriptedServable()
    session = _splitting(executor)

    async def scenario() -> None:
        first = await _hold_thread(session, servable)
        gone = asyncio.ensure_future(_call(session, servable, [[1.0]] * 6))
        await asyncio.sleep(0)
        kept = asyncio.ensure_future(_call(session, servable, [[2.0]]))
        await asyncio.sleep(0)
        gone.cancel()
        servable.gate.set()
        await first
        _check(await kept, [[2.0]])

    _run(scenario())
    assert servable.batches == [1, 1]


def test_a_request_larger_than_max_batch_size_is_refused_when_splitting(
    executor: BlockingExecutor,
) -> None:
    with pytest.raises(ServingError) as info:
        _run(_call(_splitting(executor), ScriptedServable(), [[1.0]] * 17))
    assert (info.value.code, info.value.message) == (
        Code.INVALID_ARGUMENT,
        "Task size 17 is larger than maximum input batch size 16",
    )


# ---- options ---------------------------------------------------------------------------------


def test_defaults_without_a_parameters_file_are_tf_servings() -> None:
    options = BatchingOptions.from_parameters(None, default_num_batch_threads=3)
    assert options == BatchingOptions(
        max_batch_size=1000,
        batch_timeout_micros=0,
        max_enqueued_batches=10,
        num_batch_threads=3,
        thread_pool_name="model_server_batch_threads",
    )


def test_parameters_file_fields(tmp_path: Path) -> None:
    path = tmp_path / "batching.config"
    path.write_text(
        "max_batch_size { value: 128 }\n"
        "batch_timeout_micros { value: 500 }\n"
        "max_enqueued_batches { value: 4 }\n"
        'thread_pool_name { value: "pool" }\n'
        "allowed_batch_sizes: 32 allowed_batch_sizes: 128\n"
        "pad_variable_length_inputs: true\n"
    )
    options = server_config.batching_options(
        parse_flags(
            ["--model_base_path=/m", "--enable_batching", f"--batching_parameters_file={path}"]
        )
    )
    assert options == BatchingOptions(
        max_batch_size=128,
        batch_timeout_micros=500,
        max_enqueued_batches=4,
        num_batch_threads=options.num_batch_threads if options else 0,
        thread_pool_name="pool",
        allowed_batch_sizes=(32, 128),
        pad_variable_length_inputs=True,
    )
    assert options is not None and options.num_batch_threads >= 1  # the schedulable CPUs
    assert options.execution_batch_size_limit == 128  # no splitting: max_batch_size
    assert server_config.batching_options(parse_flags(["--model_base_path=/m"])) is None


def test_parameters_file_with_large_batch_splitting(tmp_path: Path) -> None:
    path = tmp_path / "batching.config"
    path.write_text(
        "max_batch_size { value: 256 }\n"
        "enable_large_batch_splitting { value: true }\n"
        "max_execution_batch_size { value: 32 }\n"
        "allowed_batch_sizes: 8 allowed_batch_sizes: 32\n"
    )
    flags = ["--model_base_path=/m", "--enable_batching", f"--batching_parameters_file={path}"]
    options = server_config.batching_options(parse_flags(flags))
    assert options is not None
    assert (options.max_batch_size, options.execution_batch_size_limit) == (256, 32)
    assert options.enable_large_batch_splitting and options.allowed_batch_sizes == (8, 32)
    # Without max_execution_batch_size a batch holds max_batch_size rows, as without splitting;
    # without enable_large_batch_splitting, max_execution_batch_size is ignored (as TF does).
    path.write_text("max_batch_size { value: 64 } enable_large_batch_splitting { value: true }")
    options = server_config.batching_options(parse_flags(flags))
    assert options is not None and options.execution_batch_size_limit == 64
    path.write_text("max_batch_size { value: 64 } max_execution_batch_size { value: 8 }")
    options = server_config.batching_options(parse_flags(flags))
    assert options is not None and options.execution_batch_size_limit == 64


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("num_batch_threads { value: 0 }", "num_batch_threads must be positive; was 0"),
        ("max_batch_size { value: 0 }", "max_batch_size must be positive; was 0"),
        (
            "batch_timeout_micros { value: -1 }",
            "batch_timeout_micros must be non-negative; was -1",
        ),
        (
            "max_enqueued_batches { value: -2 }",
            "max_enqueued_batches must be non-negative; was -2",
        ),
        (
            "max_batch_size { value: 8 } allowed_batch_sizes: [4, 2, 8]",
            "allowed_batch_sizes entries must be monotonically increasing",
        ),
        (
            "max_batch_size { value: 8 } allowed_batch_sizes: 4",
            (
                "Last entry in allowed_batch_sizes must match max_batch_size; last entry was 4; "
                "expected 8"
            ),
        ),
        # With splitting: CreateBasicBatchingSession's, then SharedBatchScheduler::AddQueue's.
        (
            "enable_large_batch_splitting { value: true } max_batch_size { value: 8 } "
            "max_execution_batch_size { value: 4 } allowed_batch_sizes: [2, 2, 4]",
            "allowed_batch_sizes entries must be monotonically increasing",
        ),
        (
            "enable_large_batch_splitting { value: true } max_batch_size { value: 8 } "
            "max_execution_batch_size { value: 4 } allowed_batch_sizes: [2, 16]",
            (
                "Last entry in allowed_batch_sizes must be less than or equal to max_batch_size; "
                "last entry was 16; expected 8"
            ),
        ),
        (
            "enable_large_batch_splitting { value: true } max_batch_size { value: 8 } "
            "max_execution_batch_size { value: 4 } allowed_batch_sizes: [2, 8]",
            (
                "Last entry in allowed_batch_sizes must be equal to max_execution_batch_size; "
                "last entry was 8; expected 4"
            ),
        ),
        (
            "enable_large_batch_splitting { value: true } max_batch_size { value: 8 } "
            "allowed_batch_sizes: [2, 4]",  # max_execution_batch_size defaults to max_batch_size
            (
                "Last entry in allowed_batch_sizes must be equal to max_execution_batch_size; "
                "last entry was 4; expected 8"
            ),
        ),
        (
            "enable_large_batch_splitting { value: true } max_batch_size { value: 8 } "
            "max_execution_batch_size { value: 16 }",
            # TF appends the flag (1) and both values to the message, unseparated.
            (
                "When enable_large_batch_splitting is true, input_batch_size_limit must be "
                "greater than or equal to max_execution_batch_size.1816"
            ),
        ),
        (
            "enable_large_batch_splitting { value: true } max_enqueued_batches { value: 0 }",
            "max_enqueued_batches must be positive; was 0",
        ),
        (
            "enable_large_batch_splitting { value: true } max_execution_batch_size { value: 0 }",
            "max_execution_batch_size must be positive; was 0",
        ),
    ],
)
def test_bad_parameters_are_refused_with_tf_servings_messages(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "batching.config"
    path.write_text(text)
    flags = parse_flags(
        ["--model_base_path=/m", "--enable_batching", f"--batching_parameters_file={path}"]
    )
    with pytest.raises(ServingError) as info:
        server_config.batching_options(flags)
    assert (info.value.code, info.value.message) == (Code.INVALID_ARGUMENT, message)


def test_a_malformed_parameters_file_is_invalid_argument(tmp_path: Path) -> None:
    path = tmp_path / "batching.config"
    path.write_text("max_batch_size: 12")  # a wrapper message, not a scalar
    with pytest.raises(ServingError) as info:
        batching_options.read_batching_parameters_file(str(path))
    assert info.value.message.startswith(f"Invalid protobuf file: '{path}'")
    with pytest.raises(ServingError) as info:
        batching_options.read_batching_parameters_file(str(tmp_path / "missing"))
    assert "Could not read batching parameters file" in info.value.message


def test_a_bad_parameters_file_fails_start_up_in_one_line(tmp_path: Path) -> None:
    """Checked before TensorFlow loads: exit code 1 and TF Serving's message, fast."""
    path = tmp_path / "batching.config"
    path.write_text("max_batch_size { value: 0 }")
    done = run_to_exit(
        serving_command(model_base_path="/models/m", enable_batching=True, batching_parameters_file=path)
    )
    assert done.returncode == 1
    assert done.stderr == "python -m serving: error: max_batch_size must be positive; was 0\n"
