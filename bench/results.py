"""What one benchmark run measured, as plain dataclasses (serialised to results.json).

Units are in the field names or comments: milliseconds (`_ms`), requests per second
(`_rps`), MiB (`_mb`), CPU cores (`_cores`: CPU seconds per wall-clock second).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from bench.load import ClosedLoopResult, FixedRateResult
from bench.memory import ProcessMemory


@dataclass(frozen=True)
class CpuUse:
    """CPU used during one run, in cores (CPU seconds / wall seconds)."""

    setup_cores: float  # all processes of the setup (utime + stime from /proc/PID/stat)
    by_role: dict[str, float]  # the same, per role ("serving", "api worker", ...)
    load_generator_cores: float  # wrk
    other_cores: float  # the rest of the machine: other work that competed for the CPUs


@dataclass(frozen=True)
class SaturationRun:
    """The closed-loop run: throughput at saturation."""

    closed: ClosedLoopResult
    cpu: CpuUse

    @property
    def rps(self) -> float:
        """Answers per second, wrk's "Requests/sec" (all statuses)."""
        return self.closed.summary.rps

    @property
    def rps_per_core(self) -> float | None:
        """Successful answers per CPU-second the setup used: throughput normalised by the
        CPU it got, steadier than RPS when other work competes for the machine."""
        return self.ok_rps / self.cpu.setup_cores if self.cpu.setup_cores > 0 else None

    @property
    def ok_rps(self) -> float:
        """Successful answers per second: answers minus HTTP errors (status >= 400), over
        the run. This, not `rps`, is the setup's throughput, so that a setup answering
        errors quickly cannot look fast. Answers later than the timeout still count here
        (the server did the work; wrk counts them in its requests) and are reported as
        timeout errors beside it."""
        s = self.closed.summary
        good = max(0, s.requests - s.errors.status)
        return good / s.duration_s if s.duration_s > 0 else 0.0


@dataclass(frozen=True)
class FixedRateRun:
    """One fixed offered load."""

    label: str  # e.g. "80% of own saturation", "reference: 80% of tuned's saturation"
    fraction: float | None  # of the setup's own saturation RPS; None for the reference load
    reference: bool  # this is the common reference load (80% of tuned's saturation)
    result: FixedRateResult
    cpu: CpuUse


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
    """Everything measured for one setup."""

    name: str
    column: str
    description: str
    status: str = "pending"  # "ok", "skipped" (not available), "failed"
    reason: str = ""
    workers: int = 0
    server_cpus: list[int] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    saturation: SaturationRun | None = None
    fixed_rate: list[FixedRateRun] = field(default_factory=list)
    memory: list[MemoryRun] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def memory_at(self, workers: int) -> MemoryRun | None:
        """The memory measurement with `workers` API workers, if taken."""
        return next((m for m in self.memory if m.workers == workers), None)

    def load_at(
        self, fraction: float | None = None, *, reference: bool = False
    ) -> FixedRateRun | None:
        """The fixed-rate run at `fraction` of own saturation, or the reference load."""
        for run in self.fixed_rate:
            if reference and run.reference:
                return run
            if not reference and run.fraction is not None and fraction is not None:
                if abs(run.fraction - fraction) < 1e-9:
                    return run
        return None

    @property
    def rps(self) -> float | None:
        """Throughput at saturation (successful answers per second), None if not measured."""
        return self.saturation.ok_rps if self.saturation else None


@dataclass(frozen=True)
class Goal:
    """One of the project's target ratios, and whether this run met it."""

    name: str
    target: str  # e.g. "split RPS >= 1.5x tuned RPS"
    measured: str  # e.g. "2,100 / 1,900 = 1.11x"
    held: bool | None  # None: could not be measured in this run
    note: str = ""


@dataclass
class BenchResults:
    """One whole run of the benchmark."""

    meta: dict[str, Any]
    setups: list[SetupResult]
    reference_rps: float | None = None  # the fixed load for the p99 goal (80% of tuned)
    goals: list[Goal] = field(default_factory=list)

    def setup(self, name: str) -> SetupResult | None:
        """The result of the setup named `name`, if it was part of the run."""
        return next((s for s in self.setups if s.name == name), None)

    def best_split(self) -> SetupResult | None:
        """The split variant with the highest throughput (the table's "split" column).

        When no variant was measured, the first one that was attempted (so its failure
        shows), else None.
        """
        splits = [s for s in self.setups if s.column == "split"]
        measured = [s for s in splits if s.rps is not None]
        if measured:
            return max(measured, key=lambda s: s.rps or 0.0)
        attempted = [s for s in splits if s.status != "skipped"]
        return attempted[0] if attempted else None

    def column(self, column: str) -> SetupResult | None:
        """The setup shown in a table column: naive, tuned, ceiling, or the best split."""
        if column == "split":
            return self.best_split()
        return next((s for s in self.setups if s.column == column), None)


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
