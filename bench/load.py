"""Driving load at a setup: `bench.loadgen` in its own process, pinned to the load CPUs.

`run_open_loop` offers Poisson arrivals at a rate and returns the latency from each
request's intended send time (MLPerf's Server scenario); `run_closed_loop` keeps a number
of connections busy back to back (warm-up, and the closed-loop RPS that seeds the SLO
search). The generator itself, and why it is ours rather than wrk's Lua, is described in
`bench.loadgen`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.processes import REPO, taskset
from bench.stats import LatencySummary

#: Seconds a generator run may take beyond its duration and timeout before it is killed.
_HANG_MARGIN_S = 30.0


class LoadToolError(RuntimeError):
    """The load generator failed, or printed something this module cannot read."""


@dataclass(frozen=True)
class LoadSettings:
    """Where and how the load goes; the same for every run against one started setup."""

    url: str  # http://127.0.0.1:PORT/v1/fraud/score
    pool: Path  # request bodies, one per line (bench.workload)
    cpus: tuple[int, ...] = ()  # CPUs the generator is pinned to; () = not pinned
    timeout_s: float = 2.0  # an answer later than this is a timeout error
    content_type: str = "application/json"
    headers: tuple[str, ...] = ()  # extra "Name: value" lines sent with every request


@dataclass(frozen=True)
class Errors:
    """Failed requests of one run, by kind."""

    status: int = 0  # answered, not 2xx
    connect: int = 0
    read: int = 0  # connection closed or garbled with the request in flight
    timeout: int = 0  # no answer within LoadSettings.timeout_s

    @property
    def total(self) -> int:
        """Every failed request."""
        return self.status + self.connect + self.read + self.timeout


@dataclass(frozen=True)
class OpenLoopResult:
    """One open-loop run at one offered rate (latencies in ms from the intended send time)."""

    offered_rps: float
    seed: int
    duration_s: float
    planned: int  # arrivals in the timetable
    sent: int
    ok: int  # 2xx answers
    achieved_rps: float  # 2xx answers per second of the timetable
    errors: Errors
    latency: LatencySummary | None
    generator_lag_p99_ms: float  # how late the generator itself sent (free connection)
    stopped_early: str  # why the run stopped before its end ("" when it did not)
    late: int  # answered later than the SLO, or unanswered at an early stop and older than it
    unanswered: int  # after an early stop: still due or in flight then
    most_connections: int
    load_cpu_cores: float  # the generator's CPU, in cores
    load_busy_cores: float  # the same without its non-blocking polls before an arrival
    notes: list[str] = field(default_factory=list)
    warm_in_s: float = 0.0  # seconds of arrivals at the same rate before, not counted
    warm_in: dict[str, int] = field(default_factory=dict)  # their "sent", "ok", "failed"
    statuses: dict[str, int] = field(default_factory=dict)  # the non-2xx answers by status code
    refused_latency: LatencySummary | None = None  # the 503s' latencies (how fast shedding answered)


@dataclass(frozen=True)
class ClosedLoopResult:
    """One closed-loop run (latencies in ms from each request's actual send)."""

    connections: int
    duration_s: float
    ok: int
    achieved_rps: float
    errors: Errors
    latency: LatencySummary | None
    load_cpu_cores: float


def _latency(raw: dict[str, Any] | None) -> LatencySummary | None:
    return LatencySummary(**raw) if raw else None


def _run(load: LoadSettings, mode_args: list[str], duration_s: float) -> dict[str, Any]:
    args = [
        *taskset(load.cpus),
        sys.executable,
        "-m",
        "bench.loadgen",
        f"--url={load.url}",
        f"--pool={load.pool}",
        f"--timeout={load.timeout_s:g}",
        f"--content-type={load.content_type}",
        *(f"--header={h}" for h in load.headers),
        *mode_args,
    ]
    limit = duration_s + load.timeout_s + _HANG_MARGIN_S
    try:
        done = subprocess.run(
            args, cwd=REPO, capture_output=True, text=True, timeout=limit, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise LoadToolError(f"the load generator did not finish within {limit:.0f} s") from exc
    if done.returncode != 0:
        raise LoadToolError(f"the load generator exited {done.returncode}: {done.stderr[-2000:]}")
    try:
        return dict(json.loads(done.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError) as exc:
        raise LoadToolError(f"the load generator printed no result: {done.stdout[-500:]}") from exc


def open_loop_result(raw: dict[str, Any]) -> OpenLoopResult:
    """An `OpenLoopResult` from `bench.loadgen`'s JSON (open mode)."""
    return OpenLoopResult(
        offered_rps=raw["offered_rps"],
        seed=raw["seed"],
        duration_s=raw["duration_s"],
        planned=raw["planned"],
        sent=raw["sent"],
        ok=raw["ok"],
        achieved_rps=raw["achieved_rps"],
        errors=Errors(**raw["errors"]),
        latency=_latency(raw["latency"]),
        generator_lag_p99_ms=raw["generator_lag_p99_ms"],
        stopped_early=raw["stopped_early"],
        late=raw.get("late", 0),
        unanswered=raw["unanswered"],
        most_connections=raw["most_connections"],
        load_cpu_cores=raw["cpu_cores"],
        load_busy_cores=raw["busy_cores"],
        statuses=raw.get("statuses", {}),
        refused_latency=_latency(raw.get("refused_latency")),
        warm_in_s=raw.get("warm_in_s", 0.0),
        warm_in=raw.get("warm_in", {}),
    )


def run_open_loop(
    load: LoadSettings,
    *,
    rate_rps: float,
    duration_s: float,
    seed: int,
    slo_ms: float | None = None,
    stop_early: bool = False,
    warm_in_s: float = 0.0,
) -> OpenLoopResult:
    """Poisson arrivals at `rate_rps` for `duration_s` seconds (`seed` fixes the timetable),
    after `warm_in_s` seconds of arrivals at the same rate that are sent but not counted.

    With `slo_ms`, answers later than it are counted (`late`); with `stop_early` too, the
    run stops as soon as it has failed on evidence (a failed request, or more than 1 % of
    its planned arrivals late; `bench.slo.judge`): its result says so in `stopped_early`,
    and its percentiles are then lower bounds.

    Raises:
        LoadToolError: the generator failed (the server unreachable, a crash).
        ValueError: rate_rps <= 0.
    """
    if not rate_rps > 0:
        raise ValueError(f"offered load must be > 0, got {rate_rps}")
    mode = ["--open", f"--rate={rate_rps:.6f}", f"--duration={duration_s:g}", f"--seed={seed}",
            f"--warm-in={warm_in_s:g}"]
    if slo_ms is not None:
        mode.append(f"--slo-ms={slo_ms:g}")
        if stop_early:
            mode.append("--stop-early")
    return open_loop_result(_run(load, mode, warm_in_s + duration_s))


def run_closed_loop(load: LoadSettings, *, connections: int, duration_s: float) -> ClosedLoopResult:
    """`connections` connections back to back for `duration_s` seconds.

    Raises:
        LoadToolError: the generator failed.
    """
    raw = _run(load, ["--closed", f"--connections={connections}", f"--duration={duration_s:g}"],
               duration_s)
    return ClosedLoopResult(
        connections=raw["connections"],
        duration_s=raw["duration_s"],
        ok=raw["ok"],
        achieved_rps=raw["achieved_rps"],
        errors=Errors(**raw["errors"]),
        latency=_latency(raw["latency"]),
        load_cpu_cores=raw["cpu_cores"],
    )
