"""Pure CPU-bound work in low-priority worker processes: :class:`ProcessExecutor`.

Why a process. The REST front end's codec (:mod:`serving.util.json_tensor`, numpy and orjson) holds
the GIL while it parses a body, converts it to numpy and writes the answer, and the event loop of
the one server process then serves no one else. Measured on the fraud model (2-core machine,
1 MiB ``:predict`` body of 7,294 rows x 11 floats, the largest the default limits allow): parse
1.7 ms, decode to numpy 2.4 ms, answer 0.3 ms, ``Session.run`` 0.4 ms (TensorFlow releases the
GIL), reading the body 0.2 ms -- some 4.5 ms of GIL per MiB, in uninterruptible C calls of 0.5-2 ms
each. A client posting such bodies back to back took a well-behaved 500 requests/s client's p99
from 2.8 to 54.8 ms (1 core) and 4.8 to 49.8 ms (2 cores). Threads cannot isolate that (they share
the GIL); lowering the body limit would refuse real batches. So the codec work of large bodies
runs here, in other processes, and the server process keeps the GIL for everyone else.

Why low priority. Each worker lowers its own CPU priority at start (``SCHED_IDLE``, else nice
19): when the server process and a worker both want a core, the kernel runs the server process
first, so on one core too a large body is decoded in the time the others leave free, not in
theirs. The large requests pay for it: on a busy core they wait. While normal-priority processes
keep every core busy, an idle-policy process may get almost no CPU for as long as that lasts, so
the wait has a bound (``timeout_s``, ``--rest_api_json_process_timeout_in_ms``): a job not answered
within it -- waiting for a worker plus running on one -- is refused ``UNAVAILABLE`` (503), and the
worker it ran on is replaced (its answer would be out of step).

How. Each worker is ``python -m serving.util.process_executor``, started with ``exec`` (never a
bare ``fork`` of a process that runs TensorFlow), importing only what its jobs need (numpy, orjson,
protobuf: about 40 MB each). :meth:`ProcessExecutor.run` sends ``(function, args)`` down the
worker's stdin and reads ``(ok, value)`` back from its stdout, as pickle protocol 5 frames whose
numpy buffers travel out of band (no extra copy into the pickle). The function is pickled by
reference (module and name), so it must be a module-level function of a module the worker can
import; its exceptions come back as they were raised (:class:`~serving.util.errors.ServingError`
with its code and message).

Bounds and failures. At most ``processes`` jobs run at once and ``max_queued`` wait; one more is
refused with ``UNAVAILABLE`` at once; a job takes at most ``timeout_s`` in all, then ``UNAVAILABLE``.
A worker that dies (killed, out of memory) fails only the job
it was running, with ``UNAVAILABLE``, and is replaced; nothing waits on a dead worker. A cancelled
job's worker is killed and replaced (its answer would be out of step). Workers ignore SIGINT and
SIGTERM -- the server's shutdown must not lose the large requests in flight -- and exit when their
stdin closes: :meth:`ProcessExecutor.close`, or the server process gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import io
import logging
import os
import pickle
import signal
import struct
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from serving.util.errors import Code, ServingError

__all__ = ["ProcessExecutor"]

_log = logging.getLogger(__name__)
_T = TypeVar("_T")

_HEAD = struct.Struct("<QI")  # pickle length, number of out-of-band buffers
_LENGTH = struct.Struct("<Q")  # one out-of-band buffer's length
_F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ (Python 3.10+ names it; Linux only)
_PIPE_BYTES = 1 << 20  # /proc/sys/fs/pipe-max-size's default: a 1 MiB body in one write
_READ_LIMIT = 1 << 22  # the StreamReader's buffer: answers arrive in few wake-ups
_CLOSE_TIMEOUT_S = 10.0
_SPAWN_RETRY_S = 1.0
#: Where ``serving`` is imported from, for the workers' ``sys.path``.
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


def _frame(obj: object) -> list[bytes | memoryview]:
    """``obj`` as one frame: head, pickle, then each out-of-band buffer with its length."""
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    parts: list[bytes | memoryview] = [_HEAD.pack(len(data), len(buffers)), data]
    for buffer in buffers:
        raw = buffer.raw()
        parts += [_LENGTH.pack(raw.nbytes), raw]
    return parts


def _job_frame(fn: Callable[..., Any], args: tuple[Any, ...]) -> list[bytes | memoryview]:
    """The frame of one job, ``(fn, args)``. Top-level bytes (a request body) go out of band
    too: no copy into the pickle."""
    return _frame((fn, tuple(pickle.PickleBuffer(a) if type(a) is bytes else a for a in args)))


async def _read_frame(reader: asyncio.StreamReader) -> Any:
    """One frame from ``reader``; raises :class:`asyncio.IncompleteReadError` at end of stream."""
    size, count = _HEAD.unpack(await reader.readexactly(_HEAD.size))
    data = await reader.readexactly(size)
    buffers = []
    for _ in range(count):
        (length,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
        # A bytearray, so that the arrays built on it are writable like any other.
        buffers.append(bytearray(await reader.readexactly(length)))
    return pickle.loads(data, buffers=buffers)


class _Worker:
    """One worker process and its pipes; :meth:`call` runs one job on it."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        assert process.stdin is not None and process.stdout is not None
        self._stdin = process.stdin
        self._stdout = process.stdout
        pipe = self._stdin.transport.get_extra_info("pipe")
        with contextlib.suppress(OSError, AttributeError, ValueError):
            fcntl.fcntl(pipe.fileno(), _F_SETPIPE_SZ, _PIPE_BYTES)

    @property
    def alive(self) -> bool:
        return self.process.returncode is None

    async def call(self, job: list[bytes | memoryview]) -> tuple[bool, Any]:
        """Send one job's frame (:func:`_job_frame`), return ``(ok, result or exception)``.
        Raises :class:`ConnectionError` or :class:`asyncio.IncompleteReadError` when the worker
        is gone."""
        for part in job:  # one write each: a joined frame would be one more copy
            self._stdin.write(part)
        await self._stdin.drain()
        outcome: tuple[bool, Any] = await _read_frame(self._stdout)  # what _answer framed
        return outcome

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()

    def exit_status(self) -> str:
        code = self.process.returncode
        if code is None:
            return "still running"
        if code < 0:
            with contextlib.suppress(ValueError):
                return f"killed by {signal.Signals(-code).name}"
        return f"exit code {code}"


class ProcessExecutor:
    """A bounded pool of low-priority worker processes with an ``await``-able :meth:`run`.

    ``processes`` workers (>= 1) each run one job at a time; ``max_queued`` jobs may wait for one.
    ``preload`` names modules each worker imports as it starts (so the first job does not pay for
    them); ``low_priority`` puts each worker at the lowest CPU priority (``SCHED_IDLE``, nice
    19). ``timeout_s`` bounds each job's whole time here, waiting for a worker and running on
    one, seconds (``None``: no bound). ``name`` is for logs and messages. Call :meth:`start` on
    the running loop before :meth:`run`, and :meth:`close` at the end.
    """

    def __init__(
        self,
        processes: int,
        *,
        max_queued: int,
        name: str,
        preload: Sequence[str] = (),
        low_priority: bool = True,
        timeout_s: float | None = None,
    ) -> None:
        if processes < 1:
            raise ValueError(f"processes must be >= 1, got {processes}")
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0 or None, got {timeout_s}")
        self.timeout_s = timeout_s
        self.processes = processes
        self.name = name
        self._max_queued = max_queued
        self._command = [sys.executable, "-m", __name__, *(["--low-priority"] if low_priority else [])]
        self._command += [f"--preload={module}" for module in preload]
        self._idle: asyncio.Queue[_Worker] | None = None
        self._workers: set[_Worker] = set()
        self._spawning: set[asyncio.Task[None]] = set()
        self._waiting = 0
        self._closed = False

    async def start(self) -> None:
        """Start the workers (returns once they are started, not yet imported)."""
        self._idle = asyncio.Queue()
        for _ in range(self.processes):
            self._idle.put_nowait(await self._spawn())
        _log.info(
            "%s: %d worker process(es) at low CPU priority, pids %s",
            self.name,
            self.processes,
            ", ".join(str(worker.process.pid) for worker in self._workers),
        )

    async def run(self, fn: Callable[..., _T], /, *args: Any) -> _T:
        """``fn(*args)`` in a worker; returns its result or raises its exception.

        ``fn`` is a module-level function the workers can import; ``args`` and the result are
        pickled (numpy arrays without a copy into the pickle). Raises :class:`ServingError`
        ``UNAVAILABLE`` when ``max_queued`` jobs already wait, when the pool is closed, when the
        job is not answered within ``timeout_s`` (its worker, if it had one, is replaced), or
        when the worker died during the job; ``INTERNAL`` when the worker cannot unpickle the job
        (``fn`` not importable there); :mod:`pickle`'s errors for what does not pickle.
        """
        if self._closed or self._idle is None:
            raise ServingError(Code.UNAVAILABLE, f"{self.name} is not running")
        if self._idle.empty() and self._waiting >= self._max_queued:
            raise ServingError(
                Code.UNAVAILABLE,
                f"{self.name}: {self._waiting} requests already wait for a worker process; "
                "retry later",
            )
        # Pickled before a worker is taken: what does not pickle fails here, costing no worker.
        job = _job_frame(fn, args)
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self._run_job(job)  # type: ignore[no-any-return]  # the job's value
        except TimeoutError:
            bound_ms = (self.timeout_s or 0.0) * 1000
            raise ServingError(
                Code.UNAVAILABLE,
                f"{self.name}: no answer within {bound_ms:.0f} ms (the worker "
                "processes run at the lowest CPU priority and every core is busy); retry later",
            ) from None

    async def _run_job(self, job: list[bytes | memoryview]) -> Any:
        """``job`` on an idle worker, once one is free; its value, or its exception raised."""
        worker = await self._take()
        try:
            ok, value = await worker.call(job)
        except (ConnectionError, asyncio.IncompleteReadError):
            await self._wait_exit(worker)
            self._replace(worker)
            _log.error("%s: worker pid %d died during a job (%s); replaced", self.name,
                       worker.process.pid, worker.exit_status())
            raise ServingError(
                Code.UNAVAILABLE,
                f"{self.name}: the worker process died while handling the request "
                f"({worker.exit_status()})",
            ) from None
        except BaseException:  # cancelled (or a bug): its answer would be out of step
            self._replace(worker)
            raise
        self._release(worker)
        if ok:
            return value
        raise value

    async def _take(self) -> _Worker:
        """An idle, live worker (waiting for one if all are busy)."""
        assert self._idle is not None
        self._waiting += 1
        try:
            while True:
                worker = await self._idle.get()
                if worker.alive:
                    return worker
                # Died while idle (e.g. the OOM killer): replace it, take another.
                _log.error("%s: idle worker pid %d died (%s); replaced", self.name,
                           worker.process.pid, worker.exit_status())
                self._replace(worker)
        finally:
            self._waiting -= 1

    def _release(self, worker: _Worker) -> None:
        assert self._idle is not None
        if self._closed:
            return
        self._idle.put_nowait(worker)

    def _replace(self, worker: _Worker) -> None:
        """Kill ``worker`` (if still running) and start another in its place."""
        worker.kill()
        self._workers.discard(worker)
        if self._closed:
            return
        task = asyncio.ensure_future(self._respawn())
        self._spawning.add(task)
        task.add_done_callback(self._spawning.discard)

    async def _respawn(self) -> None:
        assert self._idle is not None
        while not self._closed:
            try:
                worker = await self._spawn()
            except OSError as exc:  # fork failed (no memory, process limit): try again
                _log.error("%s: cannot start a worker process: %s", self.name, exc)
                await asyncio.sleep(_SPAWN_RETRY_S)
                continue
            self._idle.put_nowait(worker)
            return

    async def _spawn(self) -> _Worker:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            path for path in (_PACKAGE_ROOT, env.get("PYTHONPATH", "")) if path
        )
        process = await asyncio.create_subprocess_exec(
            *self._command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=env,
            limit=_READ_LIMIT,
        )
        worker = _Worker(process)
        self._workers.add(worker)
        return worker

    async def _wait_exit(self, worker: _Worker) -> None:
        """Give a worker whose pipe closed a moment to be reaped, so its exit status is known."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(worker.process.wait(), 1.0)

    async def close(self) -> None:
        """Stop the workers: each finishes the job it runs (its caller gets the answer), then
        exits as its stdin closes; one still running after 10 s is killed."""
        self._closed = True
        if self._spawning:
            # A replacement being started is awaited (milliseconds), not cancelled: cancelling
            # asyncio's create_subprocess_exec while it connects the pipes can leave it waiting
            # for ever for pipes that never connected (CPython 3.11), and the loop's shutdown
            # with it. Once started, it is closed below with the others.
            await asyncio.wait(list(self._spawning), timeout=_CLOSE_TIMEOUT_S)
        workers = list(self._workers)
        for worker in workers:
            with contextlib.suppress(Exception):
                worker.process.stdin.close()  # type: ignore[union-attr]
        if not workers:
            return
        waits = [asyncio.ensure_future(worker.process.wait()) for worker in workers]
        _, pending = await asyncio.wait(waits, timeout=_CLOSE_TIMEOUT_S)
        for worker in workers:
            if worker.alive:
                _log.warning("%s: worker pid %d did not exit; killed", self.name,
                             worker.process.pid)
                worker.kill()
        if pending:
            await asyncio.wait(pending, timeout=_CLOSE_TIMEOUT_S)
        self._workers.clear()


# --------------------------------------------------------------------------------------------
# The worker process
# --------------------------------------------------------------------------------------------


def _read_exactly(stream: io.BufferedReader, size: int) -> bytes:
    data = stream.read(size)
    if len(data) != size:
        raise EOFError
    return data


def _read_frame_blocking(stream: io.BufferedReader) -> tuple[bytes, list[bytearray]]:
    """One frame's pickle and out-of-band buffers, not yet unpickled; raises
    :class:`EOFError` at the end of the stream."""
    size, count = _HEAD.unpack(_read_exactly(stream, _HEAD.size))
    data = _read_exactly(stream, size)
    buffers = []
    for _ in range(count):
        (length,) = _LENGTH.unpack(_read_exactly(stream, _LENGTH.size))
        buffer = bytearray(length)
        if stream.readinto(buffer) != length:  # a BufferedReader fills it or hits EOF
            raise EOFError
        buffers.append(buffer)
    return data, buffers


def _job(data: bytes, buffers: list[bytearray]) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """The ``(function, args)`` of one frame. Bytes sent out of band arrive as read-only
    memoryviews: the function gets bytes."""
    fn, args = pickle.loads(data, buffers=buffers)
    return fn, tuple(bytes(a) if type(a) is memoryview else a for a in args)


def _answer(fn: Callable[..., Any], args: tuple[Any, ...]) -> list[bytes | memoryview]:
    """The frame for one job's outcome: ``(True, result)`` or ``(False, exception)``."""
    try:
        outcome: tuple[bool, Any] = (True, fn(*args))
    except Exception as exc:  # noqa: BLE001 - every failure goes back to the caller
        outcome = (False, exc)
    try:
        return _frame(outcome)
    except Exception as exc:  # noqa: BLE001 - a result or exception that does not pickle
        return _frame((False, ServingError(Code.INTERNAL, f"Unpicklable job outcome: {exc!r}")))


def _lower_priority() -> None:
    """The lowest CPU priority there is: ``SCHED_IDLE`` (Linux), and nice 19 where that is
    refused. A ``SCHED_IDLE`` process is preempted as soon as a normal one wakes on its core; at
    nice 19 it may first finish its time slice (~3 ms on Linux 6.6+'s EEVDF scheduler), and a
    1-core server's p99 showed it (1 MiB neighbour: 14-331 ms at nice 19, 5-40 ms idle, same
    noisy machine)."""
    os.nice(19)
    with contextlib.suppress(AttributeError, OSError):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


def _worker_main(argv: Sequence[str]) -> int:
    """Serve jobs from stdin until it closes. ``--low-priority``, ``--preload=module`` (repeated)."""
    import importlib

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)  # the server decides when workers end (see above)
    low_priority, preload = False, []
    for arg in argv:
        key, _, value = arg.partition("=")
        if key == "--low-priority":
            low_priority = True
        elif key == "--preload":
            preload.append(value)
    if low_priority:
        _lower_priority()
    # The protocol owns fds 0 and 1: a stray print goes to stderr, not into a frame.
    requests = os.fdopen(os.dup(0), "rb")
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(2, 1)
    for module in preload:
        importlib.import_module(module)
    while True:
        try:
            data, buffers = _read_frame_blocking(requests)
        except EOFError:
            return 0
        try:
            fn, args = _job(data, buffers)
        except Exception as exc:  # noqa: BLE001 - e.g. a function this process cannot import
            # The frame was read whole, so the stream is still in step: answer, and go on.
            failure = ServingError(Code.INTERNAL, f"{exc!r} unpickling a job in a worker process")
            answers.writelines(_frame((False, failure)))
        else:
            answers.writelines(_answer(fn, args))
        answers.flush()


if __name__ == "__main__":
    sys.exit(_worker_main(sys.argv[1:]))
