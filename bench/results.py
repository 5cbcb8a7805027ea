"""What one benchmark run measured, as dataclasses, and its results.json schema.

Units are in the field names or comments: milliseconds (`_ms`), requests per second
(`_rps`), MiB (`_mb`), CPU cores (`_cores`: CPU seconds per wall-clock second).

Every setup record in results.json has (see `SetupResult.record`): `name`, `workload`,
`column`, `headline`, `status`, `slo_ms` (the workload's SLO), `slo_rps` (the median of
`searches`, each search's SLO-RPS; null when no rate met the SLO), `slo_rps_min` and
`slo_rps_max`, `unloaded_p50_ms`, `latency_curve` (a list of `{offered_rps, achieved_rps, p50_ms, p99_ms,
p999_ms, max_ms, errors, ...}`, ascending by offered rate) and `memory` (total PSS per
API worker count). `RECORD_KEYS` and `CURVE_KEYS` are the keys a reader may rely on.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from bench.load import OpenLoopResult
from bench.memory import ProcessMemory
from bench.slo import Spread, spread

#: Keys of every setup record in results.json.
RECORD_KEYS = (
    "name", "workload", "column", "headline", "description", "status", "reason", "workers",
    "server_cpus", "slo_ms", "slo_rps", "slo_rps_min", "slo_rps_max", "searches",
    "slo_spread_wide", "slo_bound_reached", "relaxed_from_ms", "closed_loop_rps", "unloaded_p50_ms",
    "latency_curve", "memory", "commands", "notes",
)
#: Keys of every latency_curve point (the first seven are the issue's).
CURVE_KEYS = (
    "offered_rps", "achieved_rps", "p50_ms", "p99_ms", "p999_ms", "max_ms", "errors",
    "phase", "passed", "verdict", "duration_s", "requests", "late", "schedule_kept",
    "stopped_early", "generator_lag_p99_ms", "generator_busy_cores", "cpu", "search",
    "warm_in_s", "disturbed",
)
#: A curve point "at" a rate is within this share of it.
RATE_MATCH = 0.01


@dataclass(frozen=True)
class CpuUse:
    """CPU used during one run, in cores (CPU seconds / wall seconds)."""

    setup_cores: float  # all processes of the setup (utime + stime from /proc/PID/stat)
    by_role: dict[str, float]  # the same, per role ("serving", "api worker", ...)
    load_generator_cores: float
    other_cores: float  # the rest of the machine: other work that competed for the CPUs
    stolen_cores: float = 0.0  # steal of the servers' CPUs: time the hypervisor ran something else


@dataclass(frozen=True)
class CurvePoint:
    """One open-loop step: offered rate, what came back, latency from the intended send."""

    offered_rps: float
    achieved_rps: float
    p50_ms: float | None
    p99_ms: float | None
    p999_ms: float | None
    max_ms: float | None
    errors: int
    phase: str  # "sweep", "extend", "confirm", "descend", "refine" (the SLO search), "probe" (a step at
    # the workload's SLO of a setup that never met it, before its search at the relaxed SLO: one at the
    # ladder's lowest rate when slower unloaded than the SLO, else its first search's) or "reference"
    # (a target's rate)
    passed: bool  # met the SLO (bench.slo.judge)
    verdict: str  # why not ("" when passed)
    duration_s: float
    requests: int  # arrivals in the step's timetable
    late: int  # of them, answered later than the SLO (or unanswered and older at a stop)
    schedule_kept: bool
    stopped_early: str  # why the step stopped early; its percentiles are then lower bounds
    generator_lag_p99_ms: float
    generator_busy_cores: float  # the generator's CPU without its polls before arrivals
    cpu: CpuUse | None = None
    search: int = 0  # which search of the setup (1, 2, ...); 0 for a reference step
    warm_in_s: float = 0.0  # seconds at the same rate before the step, not counted
    disturbed: bool = False  # failed with its servers' CPUs stolen (bench.slo.stolen_too_much): measured again

    @classmethod
    def from_run(
        cls, run: OpenLoopResult, *, phase: str, passed: bool, verdict: str, schedule_kept: bool,
        cpu: CpuUse | None, search: int = 0,
    ) -> CurvePoint:
        """The point for one `bench.load.run_open_loop` result."""
        lat = run.latency
        return cls(
            offered_rps=run.offered_rps,
            achieved_rps=run.achieved_rps,
            p50_ms=lat.p50_ms if lat else None,
            p99_ms=lat.p99_ms if lat else None,
            p999_ms=lat.p999_ms if lat else None,
            max_ms=lat.max_ms if lat else None,
            errors=run.errors.total,
            phase=phase,
            passed=passed,
            verdict=verdict,
            duration_s=run.duration_s,
            requests=run.planned,
            late=run.late,
            schedule_kept=schedule_kept,
            stopped_early=run.stopped_early,
            generator_lag_p99_ms=run.generator_lag_p99_ms,
            generator_busy_cores=run.load_busy_cores,
            cpu=cpu,
            search=search,
            warm_in_s=run.warm_in_s,
        )


@dataclass(frozen=True)
class MemoryRun:
    """Total PSS of the setup with a given number of API workers, after serving load."""

    workers: int
    processes: list[ProcessMemory]
    notes: list[str] = field(default_factory=list)

    @property
    def pss_mb(self) -> float:
        """Sum of PSS over all processes, MiB."""
        return sum(p.pss_mb for p in self.processes)

    @property
    def rss_mb(self) -> float:
        """Sum of RSS over all processes, MiB (shared pages counted once per process)."""
        return sum(p.rss_mb for p in self.processes)

    @property
    def uss_mb(self) -> float:
        """Sum of USS (private pages) over all processes, MiB."""
        return sum(p.uss_mb for p in self.processes)


@dataclass
class SetupResult:
    """Everything measured for one setup serving one workload."""

    name: str
    workload: str
    column: str
    description: str
    headline: bool = False
    slo_ms: float = 25.0
    status: str = "pending"  # "ok", "skipped" (not available), "failed"
    reason: str = ""
    workers: int = 0
    server_cpus: list[int] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    closed_loop_rps: float | None = None  # the last warm-up round: seeds the ladder
    unloaded_p50_ms: float | None = None  # one connection back to back, after the warm-up
    slo_rps: float | None = None  # the median of `searches` (None: never met)
    searches: list[float | None] = field(default_factory=list)  # each search's SLO-RPS
    slo_bound_reached: bool = False  # the median's search never failed: SLO-RPS is at least slo_rps
    # The workload's SLO, when this setup never met it and was searched at the relaxed one
    # (bench.slo.relaxed_slo_ms), which `slo_ms` then is; None: searched at the workload's.
    relaxed_from_ms: float | None = None
    latency_curve: list[CurvePoint] = field(default_factory=list)
    memory: list[MemoryRun] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def workload_slo_rps(self) -> float | None:
        """The SLO-RPS at the workload's own SLO, what the targets compare (None: never met
        there, also when this setup has a figure at the relaxed SLO)."""
        return self.slo_rps if self.relaxed_from_ms is None else None

    @property
    def spread(self) -> Spread | None:
        """Median and min-max of the searches (`bench.slo.spread`); None before any."""
        return spread(self.searches) if self.searches else None

    def at_slo(self) -> CurvePoint | None:
        """The step shown at the SLO-RPS: the highest passed step offered at most the
        (median) SLO-RPS, the one at that rate if it was measured."""
        if self.slo_rps is None:
            return None
        passed = [p for p in self.latency_curve if p.passed and p.p99_ms is not None
                  and p.offered_rps <= self.slo_rps * (1 + RATE_MATCH)]
        return max(passed, key=lambda p: p.offered_rps) if passed else None

    def memory_at(self, workers: int) -> MemoryRun | None:
        """The memory measurement with `workers` API workers, if taken."""
        return next((m for m in self.memory if m.workers == workers), None)

    def point_at(self, rate_rps: float | None) -> CurvePoint | None:
        """The curve point offered within RATE_MATCH of `rate_rps` (the last such), if any."""
        if rate_rps is None or rate_rps <= 0:
            return None
        near = [p for p in self.latency_curve
                if abs(p.offered_rps - rate_rps) <= RATE_MATCH * rate_rps]
        return near[-1] if near else None

    def sorted_curve(self) -> list[CurvePoint]:
        """The curve ascending by offered rate (measured order is the search's)."""
        return sorted(self.latency_curve, key=lambda p: p.offered_rps)

    def record(self) -> dict[str, Any]:
        """This setup's results.json record (keys: RECORD_KEYS)."""
        out = {
            "name": self.name,
            "workload": self.workload,
            "column": self.column,
            "headline": self.headline,
            "description": self.description,
            "status": self.status,
            "reason": self.reason,
            "workers": self.workers,
            "server_cpus": list(self.server_cpus),
            "slo_ms": self.slo_ms,
            "slo_rps": self.slo_rps,
            "slo_rps_min": self.spread.low if self.spread else None,
            "slo_rps_max": self.spread.high if self.spread else None,
            "searches": list(self.searches),
            "slo_spread_wide": self.spread.wide if self.spread else False,
            "slo_bound_reached": self.slo_bound_reached,
            "relaxed_from_ms": self.relaxed_from_ms,
            "closed_loop_rps": self.closed_loop_rps,
            "unloaded_p50_ms": self.unloaded_p50_ms,
            "latency_curve": [to_jsonable(p) for p in self.sorted_curve()],
            "memory": [to_jsonable(m) for m in self.memory],
            "commands": list(self.commands),
            "notes": list(self.notes),
        }
        return {key: to_jsonable(out[key]) for key in RECORD_KEYS}


@dataclass(frozen=True)
class Goal:
    """One of the project's targets, and whether this run met it."""

    name: str
    target: str  # e.g. "split SLO-RPS >= 2x tuned SLO-RPS"
    measured: str  # e.g. "1,400 / 650 RPS = 2.15x"
    held: bool | None  # None: could not be measured in this run
    note: str = ""


@dataclass
class BenchResults:
    """One whole run of the benchmark."""

    meta: dict[str, Any]
    setups: list[SetupResult]
    goals: list[Goal] = field(default_factory=list)

    def get(self, workload: str, name: str) -> SetupResult | None:
        """The result of setup `name` serving `workload`, if it was part of the run."""
        return next((s for s in self.setups if s.workload == workload and s.name == name), None)

    def column(self, workload: str, column: str) -> SetupResult | None:
        """The setup shown for `column` (naive, tuned, ceiling, or the headline split)."""
        for s in self.setups:
            if s.workload == workload and s.column == column and (column != "split" or s.headline):
                return s
        return None

    def slo_ms(self, workload: str) -> float | None:
        """The SLO `workload` was searched at, ms (meta's `slo`, else its setups')."""
        entry = self.meta.get("slo", {}).get(workload)
        if entry:
            return float(entry["slo_ms"])
        return next((s.slo_ms for s in self.setups if s.workload == workload), None)

    def workloads(self) -> list[str]:
        """The workloads of the run, in run order."""
        return list(dict.fromkeys(s.workload for s in self.setups))

    def document(self) -> dict[str, Any]:
        """The whole results.json."""
        return {
            "meta": to_jsonable(self.meta),
            "setups": [s.record() for s in self.setups],
            "goals": [to_jsonable(g) for g in self.goals],
        }


def to_jsonable(value: Any) -> Any:
    """Dataclasses (with their properties), lists and dicts as JSON-ready values."""
    if is_dataclass(value) and not isinstance(value, type):
        out = {f.name: to_jsonable(getattr(value, f.name)) for f in fields(value)}
        for klass in reversed(type(value).__mro__):
            for name, attr in vars(klass).items():
                if isinstance(attr, property):
                    out[name] = to_jsonable(getattr(value, name))
        return out
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, float):
        return round(value, 4)
    return value
