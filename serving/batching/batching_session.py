"""Server-side batching (``--enable_batching``): TF Serving's ``BatchingSession``, on asyncio.

TF Serving wraps each servable's Session in a ``BatchingSession`` whose ``Run()`` queues the
call in a ``SharedBatchScheduler`` queue and blocks until a batch thread has run the merged batch
(``tensorflow_serving/batching/batching_session.cc``, ``.../shared_batch_scheduler.h``, the
batching guide ``tensorflow_serving/batching/README.md``). :class:`BatchingSession` does the same
behind the :class:`~serving.servables.tensorflow.serving_session.Session` interface, so Predict
(and any other caller of a Session) batches without knowing it:

* every call becomes a *task* in a queue keyed by servable version, feeds, fetches and the
  feeds' dtypes and shapes except the batch dimension (only ranks with
  ``pad_variable_length_inputs``), so requests that could not be concatenated never share a batch;
* a queue has one open batch that tasks join while it holds at most ``max_batch_size`` rows, and
  closed batches waiting for a thread; a task that does not fit the open batch closes it, unless
  ``max_enqueued_batches`` batches are already waiting: then the call fails at once with
  ``UNAVAILABLE`` ``The batch scheduling queue to which this task was submitted is full``;
* ``num_batch_threads`` threads (a :class:`~serving.util.executor.BlockingExecutor`) take batches from
  the queues round-robin: a closed batch at once, the open batch once it is full or its first
  task has waited ``batch_timeout_micros``. With the default timeout 0 a lone request runs at once
  and requests arriving while every batch thread is busy pile into the next batch -- the batch
  size adapts to the load;
* the batch thread merges the tasks' feeds (:mod:`serving.batching.batching_util`, padding to
  ``allowed_batch_sizes`` and, with ``pad_variable_length_inputs``, dimensions 1+), runs one
  ``Session.run`` and hands every caller exactly its own rows. TensorFlow releases the GIL while
  it computes, so the event loop keeps parsing the next requests meanwhile;
* with ``enable_large_batch_splitting`` (TF Serving's eager split, ``Queue::Schedule`` with
  ``split_input_task_func`` = ``SplitInputTask``), ``max_batch_size`` bounds one request and
  ``max_execution_batch_size`` (default: ``max_batch_size``) one executed batch. A request larger
  than the open batch's free rows is split: its first part fills the open batch, the next ones
  fill new batches of ``max_execution_batch_size`` rows, and once every part has run the caller
  gets each output's parts concatenated in order -- exactly its rows, as if unsplit. A part that
  fails fails the request (the first failing part's error, in part order). The queue refuses a
  request larger than its remaining capacity (``max_enqueued_batches`` batches of
  ``max_execution_batch_size`` rows) with TF Serving's ``UNAVAILABLE`` ``The batch scheduling
  queue to which this task was submitted is full; task size is ...``. ``allowed_batch_sizes``
  must then end at ``max_execution_batch_size``, so no executed batch -- padding included -- is
  larger.

With tracing (:mod:`serving.util.tracing`), each request's wait in its queue is a ``batch queue``
span and each merged run a ``Session run`` span, a child of the batch's first sampled request and
linked to the others; both are recorded on the batch thread, from the times kept anyway.

Queue bookkeeping runs on the event loop (no locks; deadlines on :func:`time.monotonic`); only
merge, run, split and the per-request metrics run on the batch threads, which hand results back
with ``call_soon_threadsafe`` (one wake-up of the loop per batch). Calls are awaited, so a waiting
request holds no thread -- unlike TF Serving's blocking ``Run()``, where the batch size is capped
by the number of request threads.

Differences from TF Serving, each to keep one request's failure its own:

* A merged run that fails with an error a request's data can cause (``INVALID_ARGUMENT``,
  ``FAILED_PRECONDITION``, ``OUT_OF_RANGE``) is retried task by task, so each caller gets the
  answer its request alone would get (TF Serving fails every task of the batch with the
  batch's error -- one bad request fails its neighbours). Requests are also queued by shape,
  where TF Serving fails mismatched ones at merge time with ``FAILED_PRECONDITION`` ``Tensors with
  name ... have different shapes and padding is turned off``.
* A task whose own deadline (``timeout_ms``) passed while queued fails alone with
  ``RESOURCE_EXHAUSTED`` ``Run() timeout exceeded while waiting in batching queue`` (TF Serving
  only fails when every task of the batch expired); the merged run gets the longest of the tasks'
  timeouts, not reduced by the time spent queued.
* With ``enable_large_batch_splitting`` and no ``max_execution_batch_size``, batches hold up to
  the effective ``max_batch_size`` (1000 when unset); TF Serving takes the unset field's value, 0,
  and its scheduler cannot form a batch then. A non-positive ``max_execution_batch_size`` is
  refused (TF Serving has no check for it).

Traps kept from TF Serving (the contract): requests whose inputs have no batch dimension (scalars)
or disagree on it fail with TF Serving's ``Batching Run() input tensors must have ...`` errors once
batching is on; every output must be batched along dimension 0 like the inputs; padding repeats
real rows and values (see :mod:`serving.batching.batching_util`), and variable-length outputs come back
padded to the longest request of the batch.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from serving.batching import batching_util
from serving.batching.batching_options import BatchingOptions
from serving.core.servable_handle import ServableHandle
from serving.servables.tensorflow.serving_session import TensorRunner
from serving.util.errors import Code, ServingError, from_exception
from serving.util.executor import BlockingExecutor

if TYPE_CHECKING:
    from opentelemetry.context import Context

    from serving.util.metrics import ServingMetrics
    from serving.util.tracing import ServingTracing

__all__ = ["BatchingSession"]

_log = logging.getLogger(__name__)

# ---- the queues (SharedBatchScheduler, internal::Queue) --------------------------------------

_QUEUE_FULL = "The batch scheduling queue to which this task was submitted is full"
_EXPIRED_IN_QUEUE = "Run() timeout exceeded while waiting in batching queue"

Result = list[np.ndarray] | ServingError
# Errors one request's data can cause; a merged run failing with one is retried task by task.
# (Not DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED...: retrying those alone would only multiply them.)
_REQUEST_ERRORS = frozenset({Code.INVALID_ARGUMENT, Code.FAILED_PRECONDITION, Code.OUT_OF_RANGE})


class _Task:
    """One ``run_tensors`` call waiting for its batch (``BatchingSessionTask``), or one part of a
    call split across batches (a task TF Serving marks ``is_partial``).

    ``input_size`` is the rows the ``input_batch_size`` metric records for it: the call's rows
    (on its first part when split), ``None`` for the other parts.
    """

    __slots__ = ("deadline", "enqueued", "feeds", "future", "input_size", "size", "timeout_ms", "trace")

    def __init__(
        self,
        feeds: Mapping[str, np.ndarray],
        size: int,
        timeout_ms: int | None,
        future: asyncio.Future[list[np.ndarray]],
        *,
        enqueued: float | None = None,
        input_size: int | None = None,
    ) -> None:
        self.feeds = feeds
        self.size = size
        self.timeout_ms = timeout_ms if timeout_ms and timeout_ms > 0 else None
        self.future = future
        # Parts keep the call's enqueue time, as SplitInputTask copies enqueue_time_micros.
        self.enqueued = time.monotonic() if enqueued is None else enqueued
        self.deadline = (
            self.enqueued + self.timeout_ms / 1000 if self.timeout_ms is not None else None
        )
        self.input_size = input_size
        self.trace: Context | None = None  # the caller's trace context, when tracing


class _Batch:
    """Tasks that will run as one ``Session.run``."""

    __slots__ = ("opened", "size", "tasks")

    def __init__(self) -> None:
        self.tasks: list[_Task] = []
        self.size = 0
        self.opened = 0.0

    def add(self, task: _Task) -> None:
        if not self.tasks:
            self.opened = task.enqueued
        self.tasks.append(task)
        self.size += task.size


# What requests must share to be merged: the servable version (by identity), the fetches and,
# per feed, its name, dtype and shape without the batch dimension (only the rank with padding).
_QueueKey = tuple[int, tuple[str, ...], tuple[tuple[str, np.dtype, object], ...]]


class _Queue:
    """``internal::Queue``: one open batch plus closed batches waiting for a thread."""

    __slots__ = ("closed", "fetches", "handle", "open")

    def __init__(self, handle: ServableHandle, fetches: tuple[str, ...]) -> None:
        self.handle = handle  # keeps the servable alive while the queue holds tasks
        self.fetches = fetches
        self.closed: collections.deque[_Batch] = collections.deque()
        self.open = _Batch()

    def idle(self) -> bool:
        """Nothing queued: the queue may be dropped (a batch it handed out runs on regardless)."""
        return not self.closed and not self.open.tasks


class BatchingSession:
    """A :class:`~serving.servables.tensorflow.serving_session.Session` that merges concurrent calls into batches.

    One per server: its queues and ``num_batch_threads`` batch threads are shared by every model
    and version (TF Serving's one ``SharedBatchScheduler`` per server). Use it from one event
    loop. ``metrics`` (optional) records TF Serving's ``batching_session`` metrics; ``tracing``
    (optional) records the queueing and the runs as spans.
    """

    def __init__(
        self,
        options: BatchingOptions,
        executor: BlockingExecutor,
        metrics: ServingMetrics | None = None,
        tracing: ServingTracing | None = None,
    ) -> None:
        options.validate()
        self._tracing = tracing
        self._options = options
        self._executor = executor
        self._metrics = metrics
        self._timeout_s = options.batch_timeout_micros / 1e6
        # Rows of one executed batch: max_execution_batch_size when splitting, else max_batch_size.
        self._batch_limit = options.execution_batch_size_limit
        self._queues: dict[_QueueKey, _Queue] = {}
        self._next_queue = 0  # round-robin position
        self._free_threads = options.num_batch_threads
        self._loop: asyncio.AbstractEventLoop | None = None
        self._dispatch_pending = False
        self._timer: asyncio.TimerHandle | None = None

    @property
    def options(self) -> BatchingOptions:
        """The options this session batches with."""
        return self._options

    async def run_tensors(
        self,
        handle: ServableHandle,
        feeds: Mapping[str, np.ndarray],
        fetches: Sequence[str],
        timeout_ms: int | None,
    ) -> list[np.ndarray]:
        """Queue the call, await its batch(es), return its own rows of every fetched output.

        Raises, before queueing: ``INVALID_ARGUMENT`` for feeds that cannot be batched
        (:func:`serving.batching.batching_util.task_size`, and ``Task size 300 is larger than maximum input
        batch size 256``; with padding, :func:`serving.batching.batching_util.check_paddable`);
        ``UNAVAILABLE`` ``The batch scheduling queue to which this task was submitted is full``
        (with splitting, followed by ``; task size is ... but scheduling capacity is only ...``).
        Afterwards: ``RESOURCE_EXHAUSTED`` if ``timeout_ms`` ran out in the queue, or what this
        request's own ``Session.run`` raises (for a split request, its first failing part's).
        """
        size = batching_util.task_size(feeds)
        pad = self._options.pad_variable_length_inputs
        if pad:
            batching_util.check_paddable(feeds)
        if size > self._options.max_batch_size:
            raise ServingError(
                Code.INVALID_ARGUMENT,
                f"Task size {size} is larger than maximum input batch size "
                f"{self._options.max_batch_size}",
            )
        fetches = tuple(fetches)
        layout = tuple(
            (name, tensor.dtype, tensor.ndim if pad else tensor.shape[1:])
            for name, tensor in feeds.items()
        )
        key = (id(handle.servable), fetches, layout)
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = _Queue(handle, fetches)
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        task = _Task(feeds, size, timeout_ms, self._loop.create_future(), input_size=size)
        if self._tracing is not None:
            task.trace = self._tracing.current()
        try:
            if self._options.enable_large_batch_splitting:
                parts = self._enqueue_splitting(queue, task)
            else:
                parts = [task]
                self._enqueue(queue, task)
        finally:
            if queue.idle():
                del self._queues[key]
        if not self._dispatch_pending:
            # Run the dispatcher once the requests that are ready now have been parsed too, so
            # that they can join this batch (costs no latency: the loop is busy anyway).
            self._dispatch_pending = True
            self._loop.call_soon(self._dispatch)
        if len(parts) == 1:
            return await parts[0].future
        return await _joined(parts)

    def _enqueue(self, queue: _Queue, task: _Task) -> None:
        """``Queue::Schedule``: join the open batch, or close it and open a new one."""
        if queue.open.size + task.size > self._options.max_batch_size:
            if len(queue.closed) + 1 >= self._options.max_enqueued_batches:
                raise ServingError(Code.UNAVAILABLE, _QUEUE_FULL)
            queue.closed.append(queue.open)
            queue.open = _Batch()
        queue.open.add(task)

    def _enqueue_splitting(self, queue: _Queue, task: _Task) -> list[_Task]:
        """``Queue::Schedule`` with ``enable_large_batch_splitting`` (eager split): queue ``task``
        whole if it fits the open batch's free rows, else split into parts
        (:func:`serving.batching.batching_util.split_task_sizes`), each joining the open batch or, when it
        does not fit, a new one. Returns the queued tasks (``task`` or its parts, in row order).

        Raises ``UNAVAILABLE`` with ``ValidateBatchTaskQueueCapacity``'s message when the queue's
        remaining capacity is smaller than the task; nothing is queued then.
        """
        limit = self._batch_limit
        num_batches = len(queue.closed) + 1
        capacity = (self._options.max_enqueued_batches - num_batches) * limit + (
            limit - queue.open.size
        )
        if task.size > capacity:
            raise ServingError(
                Code.UNAVAILABLE,
                f"{_QUEUE_FULL}; task size is {task.size} but scheduling capacity is only "
                f"{capacity} (num_enqueued_batches={num_batches}, max_enqueued_batches="
                f"{self._options.max_enqueued_batches}, open_batch_size={queue.open.size}, "
                f"max_execution_batch_size={limit})",
            )
        free = limit - queue.open.size
        if task.size <= free:
            parts = [task]
        else:
            assert self._loop is not None
            sizes = batching_util.split_task_sizes(task.size, free, limit)
            parts = [
                _Task(
                    feeds,
                    part_size,
                    task.timeout_ms,
                    self._loop.create_future(),
                    enqueued=task.enqueued,
                    input_size=task.input_size if index == 0 else None,
                )
                for index, (feeds, part_size) in enumerate(
                    zip(batching_util.split_inputs(task.feeds, sizes), sizes, strict=True)
                )
            ]
        for part in parts:
            part.trace = task.trace
            if queue.open.size + part.size > limit:
                queue.closed.append(queue.open)
                queue.open = _Batch()
            queue.open.add(part)
        return parts

    # ---- dispatch (ThreadLogic / ScheduleBatch), on the event loop ---------------------------

    def _dispatch(self) -> None:
        """Give free batch threads the next schedulable batches, round-robin over queues."""
        self._dispatch_pending = False
        now = time.monotonic()
        while self._free_threads > 0:
            picked = self._next_batch(now)
            if picked is None:
                break
            queue, batch = picked
            tasks = self._live_tasks(batch, now)
            if tasks:
                self._free_threads -= 1
                self._executor.submit(self._work, queue, tasks, now)
        if self._timeout_s > 0 and self._free_threads > 0:
            self._arm_timer(now)

    def _next_batch(self, now: float) -> tuple[_Queue, _Batch] | None:
        queues = list(self._queues.items())
        for offset in range(len(queues)):
            index = (self._next_queue + offset) % len(queues)
            key, queue = queues[index]
            batch = self._schedulable(queue, now)
            if batch is not None:
                self._next_queue = index + 1
                if queue.idle():
                    del self._queues[key]
                return queue, batch
        return None

    def _schedulable(self, queue: _Queue, now: float) -> _Batch | None:
        """``Queue::ScheduleBatch``: the oldest closed batch, else a ripe open batch."""
        if queue.closed:
            return queue.closed.popleft()
        batch = queue.open
        if batch.tasks and (
            batch.size >= self._batch_limit or now >= batch.opened + self._timeout_s
        ):
            queue.open = _Batch()
            return batch
        return None

    @staticmethod
    def _live_tasks(batch: _Batch, now: float) -> list[_Task]:
        """Drop tasks whose caller is gone; fail those whose deadline passed while queued."""
        live: list[_Task] = []
        for task in batch.tasks:
            if task.future.done():  # cancelled by its caller
                continue
            if task.deadline is not None and now >= task.deadline:
                task.future.set_exception(ServingError(Code.RESOURCE_EXHAUSTED, _EXPIRED_IN_QUEUE))
                continue
            live.append(task)
        return live

    def _arm_timer(self, now: float) -> None:
        """Wake up when the earliest open batch times out (a thread is free to take it then).

        A pending timer is never too late: batches opened since it was set time out after it
        (and if its batch left early, the timer finds nothing ripe and sets the next one).
        """
        if self._timer is not None:
            return
        due = min(
            (queue.open.opened for queue in self._queues.values() if queue.open.tasks),
            default=None,
        )
        if due is not None:
            assert self._loop is not None
            self._timer = self._loop.call_later(
                max(0.0, due + self._timeout_s - now), self._on_timer
            )

    def _on_timer(self) -> None:
        self._timer = None
        self._dispatch()

    def _finish(self, tasks: list[_Task], results: list[Result]) -> None:
        """Back on the loop: resolve the batch's tasks, free its thread, dispatch again."""
        self._free_threads += 1
        for task, result in zip(tasks, results, strict=True):
            if task.future.done():  # cancelled meanwhile
                continue
            if isinstance(result, ServingError):
                task.future.set_exception(result)
            else:
                task.future.set_result(result)
        self._dispatch()

    # ---- the batch itself (ProcessBatch), on a batch thread ----------------------------------

    def _work(self, queue: _Queue, tasks: list[_Task], dequeued: float) -> None:
        """The batch thread's job: run the batch, record its metrics, hand results to the loop."""
        try:
            if self._tracing is None:
                results = self._run_batch(queue, tasks)
            else:
                results = self._traced_batch(queue, tasks, dequeued, self._tracing)
            if self._metrics is not None:
                pool = self._options.thread_pool_name
                for task in tasks:
                    if task.input_size is not None:  # once per request, split or not
                        self._metrics.record_input_batch_size(task.input_size)
                    self._metrics.record_queuing(pool, dequeued - task.enqueued)
        except BaseException as exc:  # noqa: BLE001 - every task must get an answer
            results = [from_exception(exc)] * len(tasks)
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody is waiting any more
            self._loop.call_soon_threadsafe(self._finish, tasks, results)

    def _traced_batch(
        self, queue: _Queue, tasks: list[_Task], dequeued: float, tracing: ServingTracing
    ) -> list[Result]:
        """:meth:`_run_batch` with each task's ``batch queue`` span and the batch's ``Session run``."""
        for task in tasks:
            tracing.queued(task.trace, task.enqueued, dequeued, {"tfserving.batch_size": task.size})
        attributes: dict[str, str | int | bool] = {
            "tfserving.model_spec.name": queue.handle.name,
            "tfserving.model_spec.version": queue.handle.version,
            "tfserving.batch_size": sum(task.size for task in tasks),
            "tfserving.batched_requests": len(tasks),
        }
        with tracing.batch_run([task.trace for task in tasks], attributes):
            return self._run_batch(queue, tasks)

    def _run_batch(self, queue: _Queue, tasks: list[_Task]) -> list[Result]:
        """Merge, run once, split. Per task: its outputs, or the error its own run gives."""
        results: list[Result | None] = [None] * len(tasks)
        if self._options.pad_variable_length_inputs:
            for index, error in batching_util.unpaddable_tasks([t.feeds for t in tasks]).items():
                results[index] = error
        members = [index for index, result in enumerate(results) if result is None]
        outputs = self._run_merged(queue, [tasks[index] for index in members])
        for index, result in zip(members, outputs, strict=True):
            results[index] = result
        return [result for result in results if result is not None]

    def _run_merged(self, queue: _Queue, tasks: list[_Task]) -> list[Result]:
        if not tasks:
            return []
        sizes = [task.size for task in tasks]
        total = sum(sizes)
        padded = batching_util.padded_batch_size(self._options.allowed_batch_sizes, total)
        servable: TensorRunner = queue.handle.servable
        try:
            merged = batching_util.merge_inputs(
                [task.feeds for task in tasks],
                padded,
                pad_variable_length_inputs=self._options.pad_variable_length_inputs,
            )
            if self._metrics is not None:
                self._metrics.record_batch(padded, padded - total)
            values = servable.run_tensors(merged, queue.fetches, _timeout_ms(tasks))
        except ServingError as exc:
            if len(tasks) > 1 and exc.code in _REQUEST_ERRORS:
                # Let each request get the answer it would get alone (see the module docstring).
                return [result for task in tasks for result in self._run_merged(queue, [task])]
            return [exc] * len(tasks)
        try:
            return list(batching_util.split_outputs(values, sizes, padded))
        except ServingError as exc:
            return [exc] * len(tasks)


async def _joined(parts: Sequence[_Task]) -> list[np.ndarray]:
    """Await every part of a split call: its outputs, each the parts' rows concatenated in order
    (:func:`serving.batching.batching_util.concat_outputs`), or the first failing part's error.

    If the caller is cancelled, ``gather`` cancels the parts' futures, so batches not yet run
    leave them out (as for a cancelled unsplit call).
    """
    results = await asyncio.gather(*(part.future for part in parts), return_exceptions=True)
    outputs: list[list[np.ndarray]] = []
    for result in results:
        if isinstance(result, BaseException):
            raise result
        outputs.append(result)
    return batching_util.concat_outputs(outputs)


def _timeout_ms(tasks: Sequence[_Task]) -> int | None:
    """The batch's ``timeout_in_ms``: the longest of its tasks' (``None``: one has none)."""
    timeouts = [task.timeout_ms for task in tasks]
    if any(timeout is None for timeout in timeouts):
        return None
    return max(timeout for timeout in timeouts if timeout is not None)
