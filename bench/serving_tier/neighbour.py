"""The row "serving under a hostile neighbour": a well-behaved client's answers while another
client sends the largest requests the server allows.

The well-behaved client is ``bench.loadgen``'s open loop (Poisson arrivals at ``--neighbour-rate``,
latency from each request's intended send time, so a stalled server is not hidden by a client that
waits) on ``:predict`` with one-row fraud requests, run twice with the same timetable: quiet, then
while a neighbour sends, back to back on one connection of its own, the largest ``:predict`` body
the server's default limits allow (``--rest_api_max_body_bytes``, ``--max_request_elements``;
:func:`largest_request`). The row gives the well-behaved client's answers/s and p99 both times
and whether its p99 stayed within :data:`P99_GOAL_RATIO` x its quiet p99 (``held`` / ``NOT
held``), with the neighbour's own count of answers by status.

What the neighbour costs the others is the CPU and GIL time of its requests: parsing, decoding and
answering a 1 MiB body is some 4.5 ms of Python holding the GIL. The server decodes such bodies,
and encodes their answers, in its low-priority JSON worker processes
(``--rest_api_num_json_processes``, default 1; ``--neighbour-json-processes`` sets it here, 0 puts
that work back on the server's request threads, for comparison), and the row names the setting.
This row is where that choice is measured; the tests only check where the work is done.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import numpy as np
import orjson

from bench.load import LoadSettings, OpenLoopResult, run_open_loop
from bench.serving_tier.workload import CALL_TIMEOUT_S, MODEL_NAME, N_FEATURES

__all__ = [
    "P99_GOAL_RATIO",
    "HostileNeighbour",
    "NeighbourRun",
    "largest_request",
    "neighbour_lines",
    "run_neighbour",
]

P99_GOAL_RATIO = 2.0
SEED = 2026


def largest_request(
    rows: np.ndarray, max_body_bytes: int | None, max_elements: int | None
) -> tuple[bytes, int]:
    """The largest ``{"instances": [[11 floats], ...]}`` body within both limits, its rows taken
    cyclically from ``rows`` (float32 ``[n, 11]``). Returns ``(body, rows in it)``."""
    by_elements = (max_elements // N_FEATURES) if max_elements else 10**9
    by_size = by_elements
    if max_body_bytes is not None:
        # {"instances":[row,row,...]}: 16 bytes around the rows, one comma between two.
        lengths = np.array([len(orjson.dumps(row)) + 1 for row in rows.tolist()])
        cycles = max_body_bytes // int(lengths.sum()) + 1
        sizes = 16 - 1 + np.cumsum(np.tile(lengths, cycles))
        by_size = int(np.searchsorted(sizes, max_body_bytes, side="right"))
    count = min(by_elements, by_size)
    batch = np.take(rows, range(count), axis=0, mode="wrap")
    return orjson.dumps({"instances": batch.tolist()}), count


@dataclass
class HostileNeighbour:
    """A thread posting ``body`` to ``url`` back to back on one connection until stopped."""

    url: str
    body: bytes
    statuses: Counter[str] = field(default_factory=Counter)
    seconds: list[float] = field(default_factory=list)

    @contextmanager
    def sending(self) -> Iterator[HostileNeighbour]:
        stop = threading.Event()
        thread = threading.Thread(target=self._send, args=(stop,), daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join(timeout=120)

    def _send(self, stop: threading.Event) -> None:
        headers = {"content-type": "application/json"}
        with httpx.Client(timeout=60.0) as client:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    status = str(client.post(self.url, content=self.body, headers=headers).status_code)
                except httpx.HTTPError as exc:
                    status = type(exc).__name__
                self.statuses[status] += 1
                self.seconds.append(time.monotonic() - started)


@dataclass
class NeighbourRun:
    """The row: the well-behaved client quiet and beside the neighbour (latencies in ms)."""

    rate_rps: float  # the well-behaved client's offered load
    duration_s: float
    neighbour_body_bytes: int
    neighbour_rows: int
    quiet_rps: float = 0.0
    quiet_p50_ms: float | None = None
    quiet_p99_ms: float | None = None
    hostile_rps: float = 0.0
    hostile_p50_ms: float | None = None
    hostile_p99_ms: float | None = None
    errors: dict[str, int] = field(default_factory=dict)  # the well-behaved client's
    neighbour_answers: dict[str, int] = field(default_factory=dict)  # by HTTP status
    neighbour_mean_s: float | None = None
    ratio: float | None = None
    held: bool | None = None
    server: str = ""  # the server's configuration (CPUs, batching, flags)


def run_neighbour(
    rest: str,
    pool: Path,
    body: bytes,
    rows: int,
    *,
    rate_rps: float,
    duration_s: float,
    warmup_s: float,
    load_cpus: tuple[int, ...],
    server: str = "",
    say: Callable[[str], None] = print,
) -> NeighbourRun:
    """Quiet run, then the same timetable beside a :class:`HostileNeighbour` sending ``body``.
    ``server`` describes the server at ``rest`` for the printout."""
    url = f"{rest}/v1/models/{MODEL_NAME}:predict"
    run = NeighbourRun(rate_rps, duration_s, len(body), rows, server=server)
    load = LoadSettings(url=url, pool=pool, cpus=load_cpus, timeout_s=CALL_TIMEOUT_S)
    run_open_loop(load, rate_rps=rate_rps, duration_s=warmup_s, seed=SEED)
    say(f"hostile neighbour: quiet, {rate_rps:g} requests/s for {duration_s:g} s")
    quiet = run_open_loop(load, rate_rps=rate_rps, duration_s=duration_s, seed=SEED)
    neighbour = HostileNeighbour(url, body)
    say(f"hostile neighbour: beside {len(body) / 1e6:.1f} MB requests ({rows:,} rows)")
    with neighbour.sending():
        time.sleep(min(2.0, warmup_s))  # its first requests are under way
        beside = run_open_loop(load, rate_rps=rate_rps, duration_s=duration_s, seed=SEED)
    run.quiet_rps, run.quiet_p50_ms, run.quiet_p99_ms = _figures(quiet)
    run.hostile_rps, run.hostile_p50_ms, run.hostile_p99_ms = _figures(beside)
    errors = {k: v for k, v in asdict(quiet.errors).items() if v}
    errors.update({f"beside:{k}": v for k, v in asdict(beside.errors).items() if v})
    run.errors = errors
    run.neighbour_answers = dict(neighbour.statuses)
    if neighbour.seconds:
        run.neighbour_mean_s = sum(neighbour.seconds) / len(neighbour.seconds)
    if run.quiet_p99_ms and run.hostile_p99_ms is not None:
        run.ratio = run.hostile_p99_ms / run.quiet_p99_ms
        run.held = run.ratio <= P99_GOAL_RATIO and not errors
    return run


def _figures(result: OpenLoopResult) -> tuple[float, float | None, float | None]:
    """(answers/s, p50 ms, p99 ms) of one open-loop run."""
    if result.latency is None:
        return result.achieved_rps, None, None
    return result.achieved_rps, result.latency.p50_ms, result.latency.p99_ms


def neighbour_lines(run: NeighbourRun) -> list[str]:
    """The row as the serving benchmark prints it."""

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f} ms"

    verdict = "not measured" if run.held is None else ("held" if run.held else "NOT held")
    ratio = "-" if run.ratio is None else f"{run.ratio:.1f}x"
    answers = ", ".join(f"{status}: {count}" for status, count in sorted(run.neighbour_answers.items()))
    mean = "-" if run.neighbour_mean_s is None else f"{run.neighbour_mean_s * 1000:.0f} ms each"
    return [
        "serving under a hostile neighbour (REST :predict, 1-row requests at "
        f"{run.rate_rps:g}/s, open loop, {run.duration_s:g} s each"
        + (f"; server: {run.server}" if run.server else "")
        + "):",
        f"  quiet:        {run.quiet_rps:8.0f} answers/s  p50 {ms(run.quiet_p50_ms)}  p99 {ms(run.quiet_p99_ms)}",
        f"  beside it:    {run.hostile_rps:8.0f} answers/s  p50 {ms(run.hostile_p50_ms)}  p99 {ms(run.hostile_p99_ms)}",
        f"  neighbour:    {run.neighbour_body_bytes / 1e6:.1f} MB bodies ({run.neighbour_rows:,} rows), "
        f"answers {answers or '-'} ({mean})",
        f"  p99 beside it / quiet: {ratio} (goal <= {P99_GOAL_RATIO:g}x) -- {verdict}"
        + (f"; errors {run.errors}" if run.errors else ""),
    ]
