"""Runs the plan over the (workload, setup) jobs: start, warm up, search the SLO, measure memory.

Per job, in this order:
1. start the setup pinned to the server CPUs and wait until it scores a real transaction;
2. warm up: closed-loop rounds until two agree (first calls build predict functions); the
   last round's answers per second is the closed-loop RPS, which only seeds the ladder;
3. the SLO search (`bench.slo.SloSearch`): open-loop steps up the ladder (fractions of the
   closed-loop RPS) until one fails, then bisection between the last pass and the first
   failure, every step a `CurvePoint` of the setup's latency curve (the sweep's first failure
   is measured once more before it counts: on a shared machine one failure may be noise);
4. reference steps, the rates the targets compare at: for tuned, 10 % of its own SLO-RPS;
   for the headline split, tuned's SLO-RPS and 10 % of it (same workload);
5. memory, after all throughput runs: for each API worker count of the plan, a fresh start,
   a short closed-loop round, then the total PSS of the process tree. An in-process setup
   whose throughput start already has such a count is measured right after that start.
Every step starts from an idle setup (`wait_idle`). Refinement and confirmation steps stop
early once they cannot pass (their percentiles are then lower bounds, and say so); sweep and reference
steps always run their whole duration, so the curve's shape is true where it is drawn.
A job that fails is recorded with its reason and the run goes on with the next.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from bench.load import (
    ClosedLoopResult,
    LoadSettings,
    LoadToolError,
    OpenLoopResult,
    run_closed_loop,
    run_open_loop,
)
from bench.memory import tree_memory
from bench.plan import Plan
from bench.processes import SetupError
from bench.procfs import CLK_TCK, CpuMeter, tree_cpu_ticks
from bench.results import BenchResults, CpuUse, CurvePoint, MemoryRun, SetupResult
from bench.setups import NotAvailable, RunningSetup, Setup, start
from bench.slo import SloSearch, judge, schedule_kept
from bench.workload import Workload

T = TypeVar("T", ClosedLoopResult, OpenLoopResult)
Progress = Callable[[str], None]
#: The targets' low-load comparison: this share of tuned's SLO-RPS.
LOW_LOAD_SHARE = 0.1


@dataclass(frozen=True)
class Environment:
    """Where and on what the setups run."""

    run_dir: Path  # logs and outputs of this run
    pool: Path  # request bodies, one JSON per line
    probe: bytes  # one valid body, used for readiness
    server_cpus: tuple[int, ...]  # taskset for every server process; () = not pinned
    load_cpus: tuple[int, ...]  # taskset for the load generator


@dataclass(frozen=True)
class Job:
    """One setup serving one workload; `memory` says whether its PSS is measured."""

    workload: Workload
    setup: Setup
    memory: bool = False


def measure_cpu(running: RunningSetup, run: Callable[[], T]) -> tuple[T, CpuUse]:
    """Call `run` (a load run) and read the CPU the setup, the generator and the rest used."""
    roles = running.roles()
    meter = CpuMeter(running.pids())
    result = run()
    reading = meter.read(running.pids())
    by_role: dict[str, float] = {}
    for pid, cores in reading.by_pid.items():
        role = roles.get(pid, "other")
        by_role[role] = by_role.get(role, 0.0) + cores
    load_cores = result.load_cpu_cores
    return result, CpuUse(
        setup_cores=reading.cores,
        by_role={k: round(v, 3) for k, v in sorted(by_role.items())},
        load_generator_cores=load_cores,
        other_cores=max(0.0, reading.machine_cores - reading.cores - load_cores),
    )


class Runner:
    """Runs one `Plan` over a list of jobs in one `Environment`."""

    def __init__(self, plan: Plan, env: Environment, progress: Progress) -> None:
        self.plan = plan
        self.env = env
        self._progress = progress
        self._started = time.monotonic()

    def say(self, message: str) -> None:
        """A progress line, prefixed with the time since the run started."""
        elapsed = time.monotonic() - self._started
        self._progress(f"[bench {int(elapsed) // 60:02d}:{int(elapsed) % 60:02d}] {message}")

    def load_settings(self, running: RunningSetup) -> LoadSettings:
        """How the generator is pointed at `running` under this plan."""
        return LoadSettings(
            url=running.url, pool=self.env.pool, cpus=self.env.load_cpus,
            timeout_s=self.plan.timeout_s,
        )

    def start_setup(
        self, setup: Setup, workload: Workload, workers: int | None = None
    ) -> RunningSetup:
        """Start `setup` serving `workload` on the server CPUs; return once ready.

        Raises:
            SetupError: it did not become ready (see `bench.setups.start`).
        """
        cpus = self.env.server_cpus
        count = f"{workers} worker(s)" if workers else "default workers"
        self.say(f"{workload.name}/{setup.name}: starting, {count}, CPUs "
                 f"{','.join(map(str, cpus)) or 'all (not pinned)'}")
        running = start(setup, workload, cpus=cpus, run_dir=self.env.run_dir,
                         probe=self.env.probe, workers=workers)
        self.say(f"{workload.name}/{setup.name}: ready, {running.workers} worker(s)")
        return running

    def wait_idle(self, running: RunningSetup) -> bool:
        """Wait until the setup's processes use almost no CPU: the previous run's backlog
        is drained (a worker whose loop is blocked, naive's, serves what it has read long
        after its client has gone). Gives up after `plan.idle_timeout_s`."""
        plan = self.plan
        deadline = time.monotonic() + plan.idle_timeout_s
        while time.monotonic() < deadline:
            pids = running.pids()
            before = sum(tree_cpu_ticks(pids).values())
            started = time.monotonic()
            time.sleep(plan.idle_window_s)
            used = sum(tree_cpu_ticks(pids).values()) - before
            if used / CLK_TCK / (time.monotonic() - started) <= plan.idle_cores:
                return True
        self.say(f"{running.setup.name}: still busy after {plan.idle_timeout_s:g} s idle wait")
        return False

    def warm_up(self, running: RunningSetup, load: LoadSettings) -> tuple[float, bool]:
        """Closed-loop rounds until two agree; (the last round's RPS, whether steady)."""
        plan = self.plan
        rounds: list[float] = []
        deadline = time.monotonic() + plan.warmup_max_s
        steady = False
        while not steady:
            self.wait_idle(running)
            closed = run_closed_loop(
                load, connections=plan.closed_connections, duration_s=plan.warmup_s
            )
            rounds.append(closed.achieved_rps)
            if len(rounds) >= 2:
                before, last = rounds[-2], rounds[-1]
                steady = last > 0 and abs(last - before) <= plan.warmup_tolerance * max(last, before)
            if time.monotonic() + plan.warmup_s > deadline:
                break
        self.say(
            f"{running.workload.name}/{running.setup.name}: warm-up, closed-loop RPS per "
            f"{plan.warmup_s:g} s round: " + ", ".join(f"{r:,.0f}" for r in rounds)
            + ("" if steady else " (not steady before the warm-up limit)")
        )
        return rounds[-1], steady

    def step(
        self, running: RunningSetup, load: LoadSettings, rate: float, phase: str
    ) -> CurvePoint:
        """One open-loop step at `rate`; its curve point (judged against the SLO)."""
        plan = self.plan
        duration = plan.step_duration(rate)
        self.wait_idle(running)
        run, cpu = measure_cpu(
            running,
            lambda: run_open_loop(
                load, rate_rps=rate, duration_s=duration, seed=plan.seed,
                slo_ms=plan.slo_ms if phase in ("refine", "confirm") else None,
            ),
        )
        lat = run.latency
        kept = schedule_kept(planned=run.planned, sent=run.sent,
                             generator_lag_p99_ms=run.generator_lag_p99_ms, slo_ms=plan.slo_ms)
        verdict = judge(p99_ms=lat.p99_ms if lat else None, errors=run.errors.total,
                        schedule_kept=kept, slo_ms=plan.slo_ms)
        point = CurvePoint.from_run(run, phase=phase, passed=verdict.passed,
                                    verdict=verdict.reason, schedule_kept=kept, cpu=cpu)
        shown = (f"p50 {lat.p50_ms:.1f} p99 {lat.p99_ms:.1f} max {lat.max_ms:.1f} ms"
                 if lat else "no answers")
        self.say(
            f"{running.workload.name}/{running.setup.name}: {rate:,.1f} RPS ({phase}, "
            f"{duration:g} s): {shown}, {run.achieved_rps:,.0f} RPS answered -- "
            + ("meets the SLO" if verdict.passed else f"fails: {verdict.reason}")
            + (f" (stopped early: {run.stopped_early})" if run.stopped_early else "")
        )
        return point

    def run(self, jobs: Sequence[Job]) -> BenchResults:
        """Every job's throughput and latency, then memory (see the module docstring)."""
        results = BenchResults(meta={}, setups=[])
        for job in jobs:
            setup, workload = job.setup, job.workload
            result = SetupResult(setup.name, workload.name, setup.column, setup.description,
                                 headline=setup.headline, slo_ms=self.plan.slo_ms)
            results.setups.append(result)
            if not setup.available:
                result.status, result.reason = "skipped", setup.unavailable_reason
                self.say(f"{workload.name}/{setup.name}: skipped, {setup.unavailable_reason}")
                continue
            references = self._references(results, job)
            if self._guard(result, functools.partial(self._run_job, job, result, references)):
                result.status = "ok"
            elif result.status != "skipped":
                result.status = "failed"
        for job in jobs:
            result = results.get(job.workload.name, job.setup.name)
            if job.memory and result is not None and result.status == "ok":
                if not self._guard(result, functools.partial(self._measure_memory, job, result)):
                    result.notes.insert(0, "memory measurement failed")
        return results

    def _references(self, results: BenchResults, job: Job) -> list[float]:
        """The rates the targets compare at, for this job (see the module docstring)."""
        if not (job.setup.headline and job.setup.column == "split"):
            return []
        tuned = results.column(job.workload.name, "tuned")
        if tuned is None or tuned.slo_rps is None:
            return []
        return [tuned.slo_rps, LOW_LOAD_SHARE * tuned.slo_rps]

    def _guard(self, result: SetupResult, step: Callable[[], None]) -> bool:
        """Run `step`; on a setup or load failure note it in `result` and go on."""
        try:
            step()
            return True
        except NotAvailable as exc:
            result.status, result.reason = "skipped", str(exc)
            self.say(f"{result.workload}/{result.name}: skipped, {exc}")
            return False
        except (SetupError, LoadToolError, OSError, ValueError) as exc:
            first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            if not result.reason:
                result.reason = first_line
            result.notes.append(str(exc)[-3000:])
            self.say(f"{result.workload}/{result.name}: FAILED: {first_line}")
            return False

    def _run_job(self, job: Job, result: SetupResult, references: list[float]) -> None:
        plan, setup = self.plan, job.setup
        result.server_cpus = list(self.env.server_cpus)
        with self.start_setup(setup, job.workload) as running:
            result.workers = running.workers
            result.commands = running.commands()
            load = self.load_settings(running)
            if job.memory and setup.kind == "inprocess" and result.workers in plan.memory_workers:
                result.memory.append(self._memory(running))  # a fresh start: saves one
            closed_rps, steady = self.warm_up(running, load)
            if not steady:
                result.notes.append("throughput was not steady after the warm-up limit")
            result.closed_loop_rps = closed_rps
            if closed_rps <= 0:
                raise SetupError("no successful answer in the closed-loop warm-up")
            search = SloSearch(plan.ladder(closed_rps), plan.tolerance, plan.max_steps)
            while (step := search.next_step()) is not None:
                rate, phase = step
                point = self.step(running, load, rate, phase)
                result.latency_curve.append(point)
                search.record(rate, point.passed)
            result.slo_rps = search.slo_rps
            result.slo_bound_reached = search.bound_reached
            if search.bound_reached:
                result.notes.append("every ladder rate met the SLO: SLO-RPS is at least this")
            own = [LOW_LOAD_SHARE * search.slo_rps] if setup.column == "tuned" and search.slo_rps else []
            for rate in [*own, *references]:
                measured = result.point_at(rate)
                if measured is None or measured.stopped_early:  # a whole step at that rate
                    result.latency_curve.append(self.step(running, load, rate, "reference"))
            shown = f"{result.slo_rps:,.0f} RPS" if result.slo_rps else "never met"
            self.say(f"{job.workload.name}/{setup.name}: SLO-RPS (p99 <= {plan.slo_ms:g} ms) {shown}")

    def _measure_memory(self, job: Job, result: SetupResult) -> None:
        """A fresh start per memory worker count not measured yet; read its PSS."""
        for count in self.plan.memory_workers:
            if result.memory_at(count) is None:
                with self.start_setup(job.setup, job.workload, workers=count) as running:
                    result.memory.append(self._memory(running))
        result.memory.sort(key=lambda m: m.workers)

    def _memory(self, running: RunningSetup) -> MemoryRun:
        """Total PSS after one closed-loop round of `plan.memory_warmup_s` and the drain of
        its backlog, so every worker has served and built what serving needs."""
        name, workers = running.setup.name, running.workers
        self.say(f"{running.workload.name}/{name}: memory with {workers} worker(s), after a "
                 f"{self.plan.memory_warmup_s:g} s warm-up")
        before = tree_cpu_ticks(running.pids())
        run_closed_loop(self.load_settings(running), connections=self.plan.closed_connections,
                        duration_s=self.plan.memory_warmup_s)
        self.wait_idle(running)
        after = tree_cpu_ticks(running.pids())
        roles = running.roles()
        notes = []
        idle = [pid for pid, ticks in after.items()
                if roles.get(pid, "").endswith("worker") and ticks == before.get(pid, 0)]
        if idle:
            notes.append(f"workers {idle} used no CPU during warm-up (may not have served)")
        memory = tree_memory(running.pids(), roles)
        self.say(f"{running.workload.name}/{name}: total PSS {memory.pss_mb:,.0f} MB with "
                 f"{workers} worker(s) ({len(memory.processes)} processes)")
        return MemoryRun(workers, memory.processes, notes)
