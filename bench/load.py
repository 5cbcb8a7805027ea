"""The load generator: wrk, driven closed-loop for saturation and paced for fixed rates.

Closed loop (`lua/closed.lua`): `connections` connections, each sending its next
request as soon as the previous answer arrives, for `duration_s`. Its requests/second
is the setup's throughput at saturation. Its latencies are reported but not used for
the latency figures: a closed loop sends less when the server slows down and so
hides the queueing it causes (coordinated omission).

Fixed rate (`lua/paced.lua`): an open loop on a fixed timetable, latency measured from
each request's intended send time, the method of wrk2 (not packaged here). See the
script's header and the README's "Benchmark" section for why hey's `-q` is not used:
hey paces each worker with a Go ticker and times a request from its actual send, so a
slow answer delays the next send and that delay is never counted.

Parsers here are pure functions over wrk's own output, tested on captured runs.
"""

from __future__ import annotations

import math
import os
import re
import resource
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

LUA_DIR = Path(__file__).resolve().parent / "lua"
CLOSED_LUA = LUA_DIR / "closed.lua"
PACED_LUA = LUA_DIR / "paced.lua"
WRK_INSTALL_HINT = "wrk is not installed; on Debian/Ubuntu: sudo apt-get install wrk"
# A paced run keeps its timetable if it sent at least this share of the planned requests.
SCHEDULE_KEPT_SHARE = 0.95


class LoadToolError(RuntimeError):
    """wrk is missing, failed, or printed something this module cannot read."""


def require_wrk() -> str:
    """Path of the wrk binary.

    Raises:
        LoadToolError: wrk is not on PATH (the message says how to install it).
    """
    path = shutil.which("wrk")
    if path is None:
        raise LoadToolError(WRK_INSTALL_HINT)
    return path


# --- parsing wrk's text output -------------------------------------------------------

_TIME_UNITS_MS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3, "h": 3600e3}
_METRIC_UNITS = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9}


def parse_time_ms(text: str) -> float:
    """wrk's time format ("812.00us", "1.23ms", "2.00s", "1.00m") in milliseconds.

    Raises:
        ValueError: not a wrk time.
    """
    match = re.fullmatch(r"([0-9.]+)(us|ms|s|m|h)", text.strip())
    if not match:
        raise ValueError(f"not a wrk time: {text!r}")
    return float(match.group(1)) * _TIME_UNITS_MS[match.group(2)]


def _parse_metric(text: str) -> float:
    match = re.fullmatch(r"([0-9.]+)([kMG]?)", text.strip())
    if not match:
        raise ValueError(f"not a wrk metric: {text!r}")
    return float(match.group(1)) * _METRIC_UNITS[match.group(2)]


@dataclass(frozen=True)
class WrkErrors:
    """wrk's error counters for one run."""

    connect: int = 0
    read: int = 0
    write: int = 0
    timeout: int = 0  # requests without an answer within wrk's --timeout
    status: int = 0  # answers with an HTTP status >= 400 (wrk's "Non-2xx or 3xx")

    @property
    def socket(self) -> int:
        """Connect, read and write errors together."""
        return self.connect + self.read + self.write

    @property
    def total(self) -> int:
        """Every failed request, whatever the cause."""
        return self.socket + self.timeout + self.status


@dataclass(frozen=True)
class WrkSummary:
    """What wrk prints at the end of a run, in milliseconds and requests/second."""

    requests: int  # answers received (any status)
    duration_s: float
    rps: float  # wrk's "Requests/sec": answers / duration
    latency_avg_ms: float
    latency_stdev_ms: float
    latency_max_ms: float
    percentiles_ms: dict[str, float]  # "50", "75", "90", "99" with --latency
    errors: WrkErrors


def parse_wrk(text: str) -> WrkSummary:
    """Parse wrk 4's standard report (with or without `--latency`).

    Raises:
        LoadToolError: the report has no "Requests/sec" or no "Latency" line (wrk failed
            or connected to nothing).
    """
    latency = re.search(r"^\s+Latency\s+(\S+)\s+(\S+)\s+(\S+)\s+\S+%\s*$", text, re.M)
    rps = re.search(r"^Requests/sec:\s+([0-9.]+)\s*$", text, re.M)
    total = re.search(r"^\s+(\d+) requests in ([0-9.]+\w+), ", text, re.M)
    if not (latency and rps and total):
        raise LoadToolError(f"wrk printed no report:\n{text[-2000:]}")
    percentiles = {
        m.group(1): parse_time_ms(m.group(2))
        for m in re.finditer(r"^\s+(\d+(?:\.\d+)?)%\s+(\S+)\s*$", text, re.M)
    }
    sock = re.search(
        r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text
    )
    status = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    connect, read, write, timeout = (int(g) for g in sock.groups()) if sock else (0, 0, 0, 0)
    return WrkSummary(
        requests=int(total.group(1)),
        duration_s=parse_time_ms(total.group(2)) / 1e3,
        rps=float(rps.group(1)),
        latency_avg_ms=parse_time_ms(latency.group(1)),
        latency_stdev_ms=parse_time_ms(latency.group(2)),
        latency_max_ms=parse_time_ms(latency.group(3)),
        percentiles_ms=percentiles,
        errors=WrkErrors(
            connect=connect,
            read=read,
            write=write,
            timeout=timeout,
            status=int(status.group(1)) if status else 0,
        ),
    )


def parse_paced_counters(text: str) -> dict[str, list[int]]:
    """The "bench.<name> <int> ..." lines `paced.lua`'s done() prints.

    Returns:
        name → the integers on its line, e.g. {"sent": [1000], "errors": [0, 0, 0, 0, 3]}.

    Raises:
        LoadToolError: the counters the driver needs are missing.
    """
    counters = {
        m.group(1): [int(v) for v in m.group(2).split()]
        for m in re.finditer(r"^bench\.(\w+)((?: -?\d+)+)\s*$", text, re.M)
    }
    needed = {"sent", "ok", "bad_status", "unmatched", "samples", "duration_us", "errors"}
    if not needed <= counters.keys():
        raise LoadToolError(
            f"paced.lua printed no counters {sorted(needed - counters.keys())}:\n{text[-2000:]}"
        )
    return counters


# --- latency statistics ---------------------------------------------------------------


@dataclass(frozen=True)
class LatencySummary:
    """Latency of the answered requests of one run, milliseconds."""

    count: int
    avg_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    p999_ms: float
    max_ms: float


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile: the smallest value with at least p % of values at or below.

    Args:
        sorted_values: ascending, not empty.
        p: in (0, 100].

    Raises:
        ValueError: empty input or p out of range.
    """
    if not sorted_values:
        raise ValueError("percentile of no values")
    if not 0 < p <= 100:
        raise ValueError(f"percentile {p} not in (0, 100]")
    rank = math.ceil(p / 100 * len(sorted_values))
    return float(sorted_values[max(rank, 1) - 1])


def summarize_latencies(samples_us: Sequence[float]) -> LatencySummary | None:
    """avg, p50, p90, p99, p99.9 and max of latencies in microseconds (None if empty)."""
    if not samples_us:
        return None
    values = sorted(samples_us)
    ms = 1e-3
    return LatencySummary(
        count=len(values),
        avg_ms=sum(values) / len(values) * ms,
        p50_ms=percentile(values, 50) * ms,
        p90_ms=percentile(values, 90) * ms,
        p99_ms=percentile(values, 99) * ms,
        p999_ms=percentile(values, 99.9) * ms,
        max_ms=values[-1] * ms,
    )


def read_latency_file(path: Path) -> list[int]:
    """The latencies `paced.lua` wrote, one integer (microseconds) per line."""
    return [int(line) for line in path.read_text().split()]


# --- running wrk ------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadSettings:
    """How wrk is run; the same for every setup."""

    url: str  # http://127.0.0.1:PORT/v1/fraud/score
    pool: Path  # body pool, one JSON per line (bench.workload)
    cpus: tuple[int, ...] = ()  # CPUs wrk is pinned to (taskset); () = not pinned
    timeout_s: float = 2.0  # wrk --timeout: an answer later than this is an error

    @property
    def threads(self) -> int:
        """One wrk thread per CPU it may use."""
        return max(1, len(self.cpus) or (os.cpu_count() or 1))


@dataclass(frozen=True)
class ClosedLoopResult:
    """A closed-loop (saturation) run."""

    connections: int
    summary: WrkSummary
    load_cpu_cores: float  # CPU wrk itself used, in cores (to show it was not the limit)


@dataclass(frozen=True)
class FixedRateResult:
    """A paced (open-loop) run at one offered load."""

    offered_rps: float
    connections: int
    duration_s: float
    planned: int  # requests the timetable asked for in the run
    sent: int
    ok: int  # 2xx answers
    achieved_rps: float  # 2xx answers per second
    latency: LatencySummary | None  # from intended send time, answered requests only
    errors: WrkErrors
    # Sent, but still unanswered when wrk stopped (their latency is at least the time
    # they had been waiting; they are not in `latency`).
    in_flight_at_end: int
    early: int  # requests sent < 1 ms before their due time (timed from the send)
    load_cpu_cores: float
    notes: list[str] = field(default_factory=list)

    @property
    def schedule_kept(self) -> bool:
        """The generator sent the timetable's requests: the server kept up with the load."""
        return self.sent >= SCHEDULE_KEPT_SHARE * self.planned


def _seconds(duration_s: float) -> str:
    """wrk's -d takes whole seconds ("0.5s" is a usage error): at least 1."""
    return f"{max(1, math.ceil(duration_s))}s"


def _taskset(cpus: Sequence[int]) -> list[str]:
    return ["taskset", "-c", ",".join(map(str, cpus))] if cpus else []


@dataclass(frozen=True)
class _WrkRun:
    stdout: str
    cpu_cores: float


def _run_wrk(args: list[str], duration_s: float, env: dict[str, str] | None = None) -> _WrkRun:
    """Run wrk to completion; measure its CPU from the children's rusage delta."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    try:
        done = subprocess.run(
            args,
            capture_output=True,
            text=True,
            env={**os.environ, **(env or {})},
            timeout=duration_s + 30.0,  # wrk stops itself; this only bounds a hang
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise LoadToolError(f"wrk did not finish within {duration_s + 30.0:.0f}s") from exc
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        output = (done.stderr.strip() or done.stdout.strip())[-2000:]
        raise LoadToolError(f"wrk exited {done.returncode}: {output}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return _WrkRun(stdout=done.stdout + done.stderr, cpu_cores=cpu / wall if wall > 0 else 0.0)


def run_closed_loop(
    load: LoadSettings, *, connections: int, duration_s: float
) -> ClosedLoopResult:
    """Saturate the endpoint: `connections` connections, back to back, `duration_s` seconds.

    Raises:
        LoadToolError: wrk is missing or failed.
    """
    args = [
        *_taskset(load.cpus),
        require_wrk(),
        f"-t{min(load.threads, connections)}",
        f"-c{connections}",
        f"-d{_seconds(duration_s)}",
        f"--timeout={load.timeout_s:g}s",
        "--latency",
        "-s",
        str(CLOSED_LUA),
        load.url,
        "--",
        str(load.pool),
    ]
    run = _run_wrk(args, duration_s)
    return ClosedLoopResult(connections, parse_wrk(run.stdout), run.cpu_cores)


def run_fixed_rate(
    load: LoadSettings, *, rate_rps: float, connections: int, duration_s: float
) -> FixedRateResult:
    """Offer `rate_rps` requests/second on a fixed timetable for `duration_s` seconds.

    Raises:
        LoadToolError: wrk is missing or failed, or its LuaJIT has no FFI.
        ValueError: rate_rps <= 0.
    """
    if rate_rps <= 0:
        raise ValueError(f"offered load must be > 0, got {rate_rps}")
    threads = min(load.threads, connections)
    with tempfile.TemporaryDirectory(prefix="bench-paced-") as tmp:
        latency_file = Path(tmp) / "latencies.txt"
        args = [
            *_taskset(load.cpus),
            require_wrk(),
            f"-t{threads}",
            f"-c{connections}",
            f"-d{_seconds(duration_s)}",
            f"--timeout={load.timeout_s:g}s",
            "-s",
            str(PACED_LUA),
            load.url,
            "--",
            str(load.pool),
            f"{rate_rps / threads:.6f}",
        ]
        run = _run_wrk(args, duration_s, env={"BENCH_LATENCY_FILE": str(latency_file)})
        counters = parse_paced_counters(run.stdout)
        samples = read_latency_file(latency_file)
    return fixed_rate_result(rate_rps, connections, counters, samples, run.cpu_cores)


def fixed_rate_result(
    offered_rps: float,
    connections: int,
    counters: dict[str, list[int]],
    samples_us: Sequence[int],
    load_cpu_cores: float,
) -> FixedRateResult:
    """Assemble a `FixedRateResult` from paced.lua's counters and latency samples."""
    duration_s = counters["duration_us"][0] / 1e6
    connect, read, write, status, timeout = counters["errors"]
    sent, ok = counters["sent"][0], counters["ok"][0]
    answered = ok + counters["bad_status"][0]
    errors = WrkErrors(
        connect=connect, read=read, write=write, timeout=timeout, status=counters["bad_status"][0]
    )
    notes = []
    if counters["unmatched"][0]:
        notes.append(f"{counters['unmatched'][0]} answers carried no known transaction_id")
    del status  # wrk counts status >= 400 only; paced.lua counts every non-2xx itself
    return FixedRateResult(
        offered_rps=offered_rps,
        connections=connections,
        duration_s=duration_s,
        planned=int(offered_rps * duration_s),
        sent=sent,
        ok=ok,
        achieved_rps=ok / duration_s if duration_s > 0 else 0.0,
        latency=summarize_latencies(samples_us),
        errors=errors,
        in_flight_at_end=max(0, sent - answered - errors.socket),
        early=counters.get("early", [0])[0],
        load_cpu_cores=load_cpu_cores,
        notes=notes,
    )
