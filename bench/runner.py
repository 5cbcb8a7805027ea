"""Runs the plan over the (workload, setup) jobs: start, warm up, search the SLO, measure memory.

Per workload, first (when it is the heavier model or `Plan.model_cost` says so) the model's
in-process cost per call by batch size (`bench.model_cost`, pinned to the server CPUs).
Per job, in this order:
1. start the setup pinned to the server CPUs and wait until it scores a real transaction;
2. warm up: closed-loop rounds until two agree (first calls build predict functions); the
   last round's answers per second is the closed-loop RPS, which only seeds the ladder;
3. the unloaded latency: one connection back to back. The tuned setup's p50 derives the
   workload's SLO (`bench.slo.derived_slo_ms`, unless `--slo-ms` fixed it; tuned runs
   first, or is started for this alone); a setup whose unloaded p50 is above the SLO and
   that also fails one step at its ladder's lowest rate never meets it;
4. the SLO search (`bench.slo.SloSearch`), `Plan.searches` times: the first up the ladder
   (fractions of the closed-loop RPS, extended upward while it passes) until a step fails,
   then bisection; each repeat a staircase from the first's answer (`bench.slo.repeat_ladder`).
   Each step is a `CurvePoint`; the first search's first failure is measured once more
   before it counts. The SLO-RPS is the median of the searches (`bench.slo.spread`). A
   setup that never meets the workload's SLO (3., or a first search that failed at every
   rate it measured, down to its lowest or within its share of the budget) is searched at
   the relaxed SLO (`bench.slo.relaxed_slo_ms`: 4x, or 10x its own unloaded p50), and its
   figure is shown with that SLO, compared with none;
5. reference steps, the rates the targets compare at: 10 % of tuned's SLO-RPS, for tuned
   and for the headline split (of the workloads in `REFERENCE_WORKLOADS`: the target's);
6. memory, after all throughput runs: for each API worker count of the plan, a fresh start,
   a short closed-loop round, then the total PSS of the process tree. A setup whose
   throughput start already has such a count is measured right after that start.
Every step starts from an idle setup (`wait_idle`). Refinement and confirmation steps stop
early once they have failed on evidence (more than 1 % of their planned arrivals late, or
an error; their percentiles are then lower bounds, and say so); sweep and reference steps
always run their whole duration, so the curve's shape is true where it is drawn.
`Budget` shares the plan's wall-clock budget among the jobs, at each job's start: what is
left after the memory runs still to come and every job's start and warm-up
(`Setup.start_estimate_s`, `_job_overhead`) are set aside, in shares by what one step of
each job costs (`_step_weight`: every job gets about as many steps), each job's among its
searches (the first, which climbs the whole ladder, counting double). A search that has an answer
stops when its next step would not fit in its share; one without an answer yet goes on
(a setup gets a number); a repeat that would not fit at all is not run, and the result
says how many searches it has. Time a job leaves unused goes to the jobs after it.
A job that fails is recorded with its reason and the run goes on with the next.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
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
from bench.processes import REPO, SetupError, taskset
from bench.procfs import CLK_TCK, CpuMeter, tree_cpu_ticks
from bench.results import BenchResults, CpuUse, CurvePoint, MemoryRun, SetupResult
from bench.setups import TUNED, NotAvailable, RunningSetup, Setup, is_worker, start, wrap_body
from bench.slo import (
    DEFAULT_SLO_MS,
    STOLEN_REMEASURES,
    SloSearch,
    derived_slo_ms,
    judge,
    relaxed_slo_ms,
    repeat_ladder,
    schedule_kept,
    spread,
    stolen_too_much,
)
from bench.workload import Workload
from tools.processes import NotReady, wait_until

T = TypeVar("T", ClosedLoopResult, OpenLoopResult)
Progress = Callable[[str], None]
#: The targets' low-load comparison: this share of tuned's SLO-RPS.
LOW_LOAD_SHARE = 0.1
#: Workloads whose in-process model cost by batch size is measured (bench.goals' estimate
#: of the heavier model's 1-CPU limit).
MODEL_COST_WORKLOADS = ("fraud-transformer",)
#: Workloads with the low-load reference steps (bench.goals' "median at low load").
REFERENCE_WORKLOADS = ("fraud",)
#: A search whose lowest rate fails tries this share of it next (bench.slo.SloSearch).
DESCEND = 0.6
#: A first search with no pass hands over to the relaxed SLO at the end of its share only
#: once it has failed at this share of the setup's closed-loop RPS or below: the heavier
#: model's split (closed loop 285 RPS, unloaded p50 9 ms, SLO 90 ms) failed its first rung,
#: 143 RPS, was handed over after that one step and had no figure at the workload's SLO,
#: where tuned met it at 59 RPS.
RELAX_BELOW = 0.25
MODEL_COST_BATCHES = (1, 2, 4, 8, 16, 32, 64)
#: Seconds a memory run takes after its start is ready, beyond its closed-loop round
#: (`Plan.memory_warmup_s`): the wait for its workers, the drain and the PSS snapshot, about.
MEMORY_SNAPSHOT_S = 3.0
#: Seconds a job takes before its first search step beyond its start
#: (`Setup.start_estimate_s`), its two warm-up rounds and the unloaded latency: the idle
#: waits and the generator's starts, about.
JOB_SLACK_S = 4.0
#: Seconds the model's in-process cost takes, about (before a MODEL_COST_WORKLOADS workload).
MODEL_COST_S = 15.0
#: Seconds a memory start waits for all the workers it was started with (after ready).
WORKERS_UP_TIMEOUT_S = 30.0
#: The first search's share of a job's time, in repeats' shares.
FIRST_SEARCH_WEIGHT = 2.0


@dataclass
class Budget:
    """The run's wall-clock budget, shared among the jobs still to run.

    Args:
        total_s: the plan's budget, seconds (None: unbounded).
        started: `time.monotonic()` at the start of the run.
    """

    total_s: float | None
    started: float

    def left(self, now: float) -> float:
        """Seconds of the budget left at `now` (inf when unbounded)."""
        if self.total_s is None:
            return float("inf")
        return self.total_s - (now - self.started)

    def job_deadline(
        self, now: float, overheads_s: Sequence[float], reserve_s: float,
        weights: Sequence[float] | None = None,
    ) -> float:
        """When the job starting at `now` should be done.

        Args:
            now: `time.monotonic()` at the job's start.
            overheads_s: seconds each job still to run (this one first) needs before its
                searches: its start, warm-up and unloaded latency.
            reserve_s: seconds set aside for the memory runs to come.
            weights: each of those jobs' share of the search time, relative (None: equal):
                the runner gives the seconds one of its steps takes, so that every job gets
                about as many steps (a step of the heavier model's 100-300 RPS takes 7 s,
                a fraud step at 1,000 RPS 3 s: equal seconds gave the heavier model's split
                one step per search).

        Returns its own overhead plus its share of the search time: what is left after
        `reserve_s` and every job's overhead, among the jobs (inf when unbounded).
        """
        left = self.left(now)
        if left == float("inf"):
            return float("inf")
        if not overheads_s:
            return now + max(0.0, left - reserve_s)
        shares = list(weights) if weights is not None else [1.0] * len(overheads_s)
        search_s = max(0.0, left - reserve_s - sum(overheads_s))
        share = search_s * shares[0] / sum(shares) if sum(shares) > 0 else search_s / len(overheads_s)
        return now + min(max(0.0, left - reserve_s), overheads_s[0] + share)

    @staticmethod
    def search_deadline(now: float, job_deadline: float, searches_left: int, first: bool = False) -> float:
        """When the search starting at `now` should be done: its share of the job's time
        left among its `searches_left` searches (this one included), the first search
        counting as `FIRST_SEARCH_WEIGHT` repeats (it climbs the whole ladder; a repeat
        starts next to its answer)."""
        if job_deadline == float("inf"):
            return job_deadline
        weight = FIRST_SEARCH_WEIGHT if first else 1.0
        return now + max(0.0, job_deadline - now) * weight / max(1.0, searches_left - 1 + weight)


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


def measure_cpu(
    running: RunningSetup, run: Callable[[], T], steal_cpus: Sequence[int] = ()
) -> tuple[T, CpuUse]:
    """Call `run` (a load run) and read the CPU the setup, the generator and the rest used, and
    the steal of the CPUs `steal_cpus` (the servers')."""
    roles = running.roles()
    meter = CpuMeter(running.pids(), steal_cpus=steal_cpus)
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
        stolen_cores=round(reading.stolen_cores, 4),
    )


class Runner:
    """Runs one `Plan` over a list of jobs in one `Environment`."""

    def __init__(self, plan: Plan, env: Environment, progress: Progress) -> None:
        self.plan = plan
        self.env = env
        self._progress = progress
        self._started = time.monotonic()
        self.budget = Budget(plan.time_budget_s, self._started)
        self.slo: dict[str, dict[str, object]] = {}  # workload -> {"slo_ms", "how", ...}
        self.model_costs: dict[str, dict[str, object]] = {}
        self._deadline = float("inf")  # the running job's share of the budget ends here
        self._reserve_s = 0.0  # what the memory runs still to come need of the budget
        # Per workload, the closed-loop RPS of its first job (what its steps will cost).
        self._closed_rps: dict[str, float] = {}
        # The jobs after the running one, with their overheads (for `_share_by_own_steps`).
        self._after: list[tuple[Job, float]] = []

    def say(self, message: str) -> None:
        """A progress line, prefixed with the time since the run started (and, under a
        budget, the minutes of it left)."""
        now = time.monotonic()
        elapsed = now - self._started
        left = self.budget.left(now)
        budget = "" if left == float("inf") else f" {max(0, int(left)) // 60}m{max(0, int(left)) % 60:02d}s left"
        self._progress(f"[bench {int(elapsed) // 60:02d}:{int(elapsed) % 60:02d}{budget}] {message}")

    def load_settings(self, running: RunningSetup) -> LoadSettings:
        """How the generator is pointed at `running` under this plan (its bodies wrapped as
        the setup takes them, `Setup.body_field`)."""
        pool = self.env.pool
        field_name = running.setup.body_field
        if field_name:
            pool = self.env.run_dir / f"bodies-{field_name}.jsonl"
            if not pool.exists():
                lines = [line for line in self.env.pool.read_bytes().splitlines() if line.strip()]
                pool.write_bytes(b"\n".join(wrap_body(line, field_name) for line in lines) + b"\n")
        return LoadSettings(
            url=running.url, pool=pool, cpus=self.env.load_cpus, timeout_s=self.plan.timeout_s,
        )

    def slo_for(self, workload: Workload) -> float:
        """The SLO `workload` is searched at, ms: `--slo-ms`, else the derived one, else
        (not derived yet) the floor."""
        if self.plan.slo_ms is not None:
            return self.plan.slo_ms
        entry = self.slo.get(workload.name)
        return float(entry["slo_ms"]) if entry else DEFAULT_SLO_MS

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
                        probe=self.env.probe, workers=workers, slo_ms=self.slo_for(workload))
        self.say(f"{workload.name}/{setup.name}: ready, {running.workers} worker(s)")
        return running

    def unloaded_p50(self, running: RunningSetup, load: LoadSettings) -> float | None:
        """p50 in ms of one connection back to back for `plan.unloaded_s` (None: no answer)."""
        self.wait_idle(running)
        closed = run_closed_loop(load, connections=1, duration_s=self.plan.unloaded_s)
        return closed.latency.p50_ms if closed.latency else None

    def derive_slo(self, workload: Workload, tuned_p50_ms: float | None, source: str) -> None:
        """Set `workload`'s SLO from the tuned setup's unloaded p50 (see bench.slo)."""
        if self.plan.slo_ms is not None:
            self.slo[workload.name] = {"slo_ms": self.plan.slo_ms, "how": "--slo-ms"}
        elif tuned_p50_ms is None:
            self.slo[workload.name] = {"slo_ms": DEFAULT_SLO_MS,
                                       "how": f"the floor: tuned's unloaded p50 not measured ({source})"}
        else:
            slo = derived_slo_ms(tuned_p50_ms)
            self.slo[workload.name] = {
                "slo_ms": slo, "tuned_unloaded_p50_ms": round(tuned_p50_ms, 3),
                "how": f"max(25 ms, 10 x tuned's unloaded one-request p50 {tuned_p50_ms:.2f} ms), "
                       "rounded up to 5 ms",
            }
        self.say(f"{workload.name}: SLO p99 <= {self.slo[workload.name]['slo_ms']:g} ms "
                 f"({self.slo[workload.name]['how']})")

    def calibrate(self, workload: Workload) -> None:
        """Derive `workload`'s SLO when the tuned setup is not part of the run: start it
        for its unloaded p50 alone."""
        p50 = None
        try:
            with self.start_setup(TUNED, workload) as running:
                load = self.load_settings(running)
                run_closed_loop(load, connections=self.plan.closed_connections, duration_s=self.plan.warmup_s)
                p50 = self.unloaded_p50(running, load)
        except (SetupError, LoadToolError, OSError) as exc:
            self.say(f"{workload.name}: the tuned setup for the SLO failed: {str(exc).splitlines()[0]}")
        self.derive_slo(workload, p50, "tuned started for the SLO alone")

    def model_cost(self, workload: Workload) -> dict[str, object]:
        """The model's in-process ms per call by batch size (`bench.model_cost`), pinned to
        the server CPUs; {"error": ...} when it fails."""
        args = [*taskset(self.env.server_cpus), sys.executable, "-m", "bench.model_cost",
                f"--model-dir={workload.version_dir}", "--batches=" + ",".join(map(str, MODEL_COST_BATCHES)),
                f"--min-s={max(0.05, self.plan.step_s / 5):g}"]
        self.say(f"{workload.name}: the model's in-process cost per call, batches "
                 + ", ".join(map(str, MODEL_COST_BATCHES)))
        try:
            done = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=180,
                                  env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
            cost = dict(json.loads(done.stdout.strip().splitlines()[-1]))
        except (subprocess.TimeoutExpired, ValueError, IndexError, OSError) as exc:
            return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        self.say(f"{workload.name}: ms per call by batch: "
                 + ", ".join(f"{b}: {ms:.2f}" for b, ms in cost["batch_ms"].items()))
        return cost

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
        self, running: RunningSetup, load: LoadSettings, rate: float, phase: str,
        curve: list[CurvePoint], search: int = 0, slo_ms: float | None = None,
    ) -> CurvePoint:
        """One open-loop step at `rate`, judged against `slo_ms` (default: the workload's SLO);
        its curve point is appended to `curve` and returned. A failure during which the
        hypervisor took more than `STOLEN_SHARE` of the servers' CPUs is not evidence about
        the setup: it stays in the curve, marked, and the step is measured again
        (`STOLEN_REMEASURES` times at most); the last measurement is the one returned."""
        for _ in range(STOLEN_REMEASURES):
            point = self._measure_step(running, load, rate, phase, search, slo_ms)
            stolen = point.cpu.stolen_cores if point.cpu else 0.0
            if point.passed or not stolen_too_much(stolen, len(self.env.server_cpus)):
                curve.append(point)
                return point
            curve.append(replace(point, verdict=point.verdict + f"; {stolen:.0%} of a core stolen by "
                                 "the hypervisor: measured again", disturbed=True))
            self.say(f"{running.workload.name}/{running.setup.name}: {stolen:.0%} of a core stolen by "
                     f"the hypervisor during that step: {rate:,.1f} RPS measured again")
        point = self._measure_step(running, load, rate, phase, search, slo_ms)
        curve.append(point)
        return point

    def _measure_step(
        self, running: RunningSetup, load: LoadSettings, rate: float, phase: str, search: int,
        slo_ms: float | None,
    ) -> CurvePoint:
        plan = self.plan
        slo = slo_ms if slo_ms is not None else self.slo_for(running.workload)
        duration = plan.step_duration(rate)
        self.wait_idle(running)
        run, cpu = measure_cpu(
            running,
            lambda: run_open_loop(
                load, rate_rps=rate, duration_s=duration, seed=plan.seed, slo_ms=slo,
                stop_early=phase in ("refine", "confirm"), warm_in_s=plan.warm_in_s,
            ),
            steal_cpus=self.env.server_cpus,
        )
        lat = run.latency
        kept = schedule_kept(planned=run.planned, sent=run.sent,
                             generator_lag_p99_ms=run.generator_lag_p99_ms, slo_ms=slo)
        verdict = judge(p99_ms=lat.p99_ms if lat else None, errors=run.errors.total,
                        schedule_kept=kept, slo_ms=slo, answered=run.ok, late=run.late,
                        planned=run.planned)
        point = CurvePoint.from_run(run, phase=phase, passed=verdict.passed,
                                    verdict=verdict.reason, schedule_kept=kept, cpu=cpu, search=search)
        shown = (f"p50 {lat.p50_ms:.1f} p99 {lat.p99_ms:.1f} max {lat.max_ms:.1f} ms"
                 if lat else "no answers")
        label = f"search {search}, {phase}" if search else phase
        stolen = f", {cpu.stolen_cores:.0%} of a core stolen" if cpu.stolen_cores >= 0.005 else ""
        self.say(
            f"{running.workload.name}/{running.setup.name}: {rate:,.1f} RPS ({label}, "
            f"{plan.warm_in_s:g} s warm-in + {duration:.3g} s, {run.planned} planned, {run.late} late{stolen}): "
            f"{shown}, {run.achieved_rps:,.0f} RPS answered -- "
            + ("meets the SLO" if verdict.passed else f"fails: {verdict.reason}")
            + (f" ({verdict.reason})" if verdict.passed and verdict.reason else "")
            + (f" (stopped early: {run.stopped_early})" if run.stopped_early else "")
        )
        return point

    def run(self, jobs: Sequence[Job]) -> BenchResults:
        """Every job's throughput and latency, then memory (see the module docstring)."""
        results = BenchResults(meta={}, setups=[])
        # Whether each job is the first of its workload (the model's cost is measured before it).
        firsts = [all(o.workload.name != j.workload.name for o in jobs[:i]) for i, j in enumerate(jobs)]
        overhead = {id(j): self._job_overhead(j, first=first) for j, first in zip(jobs, firsts, strict=True)}
        for index, job in enumerate(jobs):
            setup, workload = job.setup, job.workload
            if firsts[index]:
                if workload.name in MODEL_COST_WORKLOADS:
                    self.model_costs[workload.name] = self.model_cost(workload)
                has_tuned = any(j.workload.name == workload.name and j.setup.column == "tuned"
                                and j.setup.available for j in jobs)
                if self.plan.slo_ms is not None:
                    self.derive_slo(workload, None, "--slo-ms")
                elif not has_tuned:
                    self.calibrate(workload)
            result = SetupResult(setup.name, workload.name, setup.column, setup.description,
                                 headline=setup.headline, slo_ms=self.slo_for(workload))
            results.setups.append(result)
            if not setup.available:
                result.status, result.reason = "skipped", setup.unavailable_reason
                self.say(f"{workload.name}/{setup.name}: skipped, {setup.unavailable_reason}")
                continue
            self._reserve_s = sum(
                self._memory_reserve(j, results.get(j.workload.name, j.setup.name) if i < index else None)
                for i, j in enumerate(jobs) if j.memory)
            self._after = [(j, overhead[id(j)]) for j in jobs[index + 1:] if j.setup.available]
            self._plan_share(overhead[id(job)], self._step_weight(job))
            references = self._references(results, job)
            if self._guard(result, functools.partial(self._run_job, job, result, references)):
                result.status = "ok"
            elif result.status != "skipped":
                result.status = "failed"
            if result.relaxed_from_ms is None:
                result.slo_ms = self.slo_for(workload)
        self._deadline = float("inf")
        for job in jobs:
            result = results.get(job.workload.name, job.setup.name)
            if job.memory and result is not None and result.status == "ok":
                if not self._guard(result, functools.partial(self._measure_memory, job, result)):
                    result.notes.insert(0, "memory measurement failed")
        results.meta["slo"] = dict(self.slo)
        results.meta["model_cost"] = dict(self.model_costs)
        return results

    def _default_workers(self, job: Job) -> int | None:
        """The worker count `job`'s throughput start will have (None: a split, whose
        run-server.sh sizes its API from the CPU budget)."""
        return job.setup.workers_for(len(self.env.server_cpus) or os.cpu_count() or 1)

    def _memory_reserve(self, job: Job, result: SetupResult | None = None) -> float:
        """Seconds set aside for `job`'s memory runs still to come: a fresh start per worker
        count of the plan not measured yet (`_measure_memory`). Once the job has run
        (`result`) those are the counts its throughput start did not measure (none when it
        failed); before, every count but its default one (a split's is known only then)."""
        plan = self.plan
        if result is not None:
            counts = [c for c in plan.memory_workers if result.memory_at(c) is None] if result.status == "ok" else []
        else:
            counts = [c for c in plan.memory_workers if c != self._default_workers(job)]
        return sum(job.setup.start_estimate_s(c) + plan.memory_warmup_s + MEMORY_SNAPSHOT_S for c in counts)

    def _job_overhead(self, job: Job, first: bool) -> float:
        """Seconds `job` takes before its searches, about: its start, the memory run at that
        start when it has one, two warm-up rounds, the unloaded latency and `JOB_SLACK_S`;
        `first`: the first job of its workload, which the model's cost comes before."""
        plan = self.plan
        workers = self._default_workers(job)
        start = job.setup.start_estimate_s(workers or 1)
        if job.memory and (workers is None or workers in plan.memory_workers):
            start += plan.memory_warmup_s + MEMORY_SNAPSHOT_S
        cost = MODEL_COST_S if first and job.workload.name in MODEL_COST_WORKLOADS else 0.0
        return start + cost + 2 * plan.warmup_s + plan.unloaded_s + JOB_SLACK_S

    def _plan_share(self, overhead_s: float, step_s: float) -> None:
        """Set the running job's deadline from now (`Budget.job_deadline`): its overhead
        still to come and the cost of one of its steps, beside the jobs after it
        (`_after`) and the memory runs to come (`_reserve_s`)."""
        self._deadline = self.budget.job_deadline(
            time.monotonic(), [overhead_s, *(o for _, o in self._after)], self._reserve_s,
            weights=[step_s, *(self._step_weight(j) for j, _ in self._after)])

    def _share_by_own_steps(self, closed_rps: float) -> None:
        """Re-plan the running job's share once its warm-up has measured its own closed-loop
        RPS: its steps cost what its own ladder's first rung costs (a setup far slower than
        its workload's first, naive at 5 RPS or a peer at its relaxed SLO, steps 6.5 s where
        fraud's tuned steps 4 s, and at the workload's weight got one step per search)."""
        self._plan_share(0.0, self.plan.step_cost(self.plan.ladder(closed_rps)[0]))

    def _step_weight(self, job: Job) -> float:
        """What one search step of `job` costs, about, seconds (its share of the search
        time, `Budget.job_deadline`): a step at the ladder's first rung of its workload's
        closed-loop RPS once one job of the workload has measured it; before, a step at the
        lowest rate (the longest)."""
        closed = self._closed_rps.get(job.workload.name)
        rate = self.plan.ladder(closed)[0] if closed else self.plan.min_rate_rps
        return self.plan.step_cost(rate)

    def _references(self, results: BenchResults, job: Job) -> list[float]:
        """The rates the targets compare at, for this job (see the module docstring)."""
        if not (job.setup.headline and job.setup.column == "split") or (
                job.workload.name not in REFERENCE_WORKLOADS):
            return []
        tuned = results.column(job.workload.name, "tuned")
        if tuned is None or tuned.slo_rps is None:
            return []
        return [LOW_LOAD_SHARE * tuned.slo_rps]

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
        plan, setup, workload = self.plan, job.setup, job.workload
        result.server_cpus = list(self.env.server_cpus)
        with self.start_setup(setup, workload) as running:
            result.workers = running.workers
            result.commands = running.commands()
            load = self.load_settings(running)
            if job.memory and result.workers in plan.memory_workers:
                result.memory.append(self._memory(running))  # a fresh start: saves one
            closed_rps, steady = self.warm_up(running, load)
            if not steady:
                result.notes.append("throughput was not steady after the warm-up limit")
            result.closed_loop_rps = closed_rps
            if closed_rps <= 0:
                raise SetupError("no successful answer in the closed-loop warm-up")
            self._closed_rps.setdefault(workload.name, closed_rps)
            self._share_by_own_steps(closed_rps)
            result.unloaded_p50_ms = self.unloaded_p50(running, load)
            if setup.column == "tuned" and workload.name not in self.slo:
                self.derive_slo(workload, result.unloaded_p50_ms, "the tuned setup of this run")
            slo = self.slo_for(workload)
            result.slo_ms = slo
            self.say(f"{workload.name}/{setup.name}: unloaded p50 "
                     + (f"{result.unloaded_p50_ms:.2f} ms" if result.unloaded_p50_ms is not None else "–"))
            if result.unloaded_p50_ms is None or result.unloaded_p50_ms > slo:
                # One step at the ladder's lowest rate decides: a batcher that learns its
                # wait from load (BentoML's dispatcher after the closed-loop warm-up) can
                # answer one request at a time slower than a stream of them.
                lowest = plan.ladder(closed_rps)[0]
                probe = (self.step(running, load, lowest, "probe", result.latency_curve)
                         if result.unloaded_p50_ms else None)
                if probe is None or not probe.passed:
                    relaxed = relaxed_slo_ms(slo, result.unloaded_p50_ms)
                    result.notes.append(f"never met the workload's SLO ({slo:g} ms): its unloaded p50 "
                                        f"({result.unloaded_p50_ms or 0:.1f} ms) is above it and it failed at "
                                        f"{lowest:g} RPS; searched at the relaxed SLO, {relaxed:g} ms")
                    if result.unloaded_p50_ms is None or result.unloaded_p50_ms > relaxed:
                        result.searches = [None]
                        self.say(f"{workload.name}/{setup.name}: never meets p99 <= {slo:g} ms, nor "
                                 f"{relaxed:g} ms (unloaded p50 above it): not searched")
                        return
                    self.say(f"{workload.name}/{setup.name}: never meets p99 <= {slo:g} ms (unloaded p50 "
                             f"above it, and {lowest:g} RPS failed): searched at p99 <= {relaxed:g} ms")
                    result.relaxed_from_ms, result.slo_ms, slo = slo, relaxed, relaxed
            slo = self._search_or_relax(running, load, result, closed_rps, slo)
            own = ([LOW_LOAD_SHARE * result.slo_rps] if setup.column == "tuned" and result.slo_rps
                   and workload.name in REFERENCE_WORKLOADS else [])
            for rate in [*own, *references]:
                measured = result.point_at(rate)
                if measured is None or measured.stopped_early:  # a whole step at that rate
                    self.step(running, load, rate, "reference", result.latency_curve)
            sp = result.spread
            shown = (f"{result.slo_rps:,.0f} RPS" if result.slo_rps else "never met") + (
                f" (median of {len(result.searches)}: " + ", ".join(
                    "none" if v is None else f"{v:,.0f}" for v in result.searches)
                + (f"; spread {sp.relative:.0%} > 15 %" if sp.wide else "") + ")" if sp else "")
            self.say(f"{workload.name}/{setup.name}: SLO-RPS (p99 <= {slo:g} ms) {shown}")

    def _search_or_relax(self, running: RunningSetup, load: LoadSettings, result: SetupResult,
                         closed_rps: float, slo_ms: float) -> float:
        """The searches of `result` at `slo_ms`, or, when its first search met it at no rate
        and it is not relaxed yet, at the relaxed SLO (`_relax_unmet`); returns the SLO its
        figure is at."""
        relax = result.relaxed_from_ms is None
        self._searches(running, load, result, closed_rps, slo_ms, relax_unmet=relax)
        if relax and result.searches == [None]:
            slo_ms = self._relax_unmet(result, slo_ms)
            self._searches(running, load, result, closed_rps, slo_ms)
        return slo_ms

    def _relax_unmet(self, result: SetupResult, slo_ms: float) -> float:
        """The first search of `result` met `slo_ms` (the workload's SLO) at no rate, down
        to its lowest or within its share of the time budget: its steps become probes
        (search 0), the searches start again at the relaxed SLO
        (`bench.slo.relaxed_slo_ms`), which is returned. Why: Ray Serve's unloaded
        p50 (10.9 ms) is below fraud's 25 ms, but its p99 was above it at every rate, 6 RPS
        included (36.9 ms, Intel Xeon with AVX-512), and it had no number at all."""
        tried = [p for p in result.latency_curve if p.search == 1]
        lowest = min((p.offered_rps for p in tried), default=0.0)
        result.latency_curve = [replace(p, phase="probe", search=0) if p.search == 1 else p
                                for p in result.latency_curve]
        relaxed = relaxed_slo_ms(slo_ms, result.unloaded_p50_ms)
        result.notes.append(f"never met the workload's SLO ({slo_ms:g} ms): its first search failed at every "
                            f"rate it measured, down to {lowest:,.1f} RPS; searched at the relaxed SLO, {relaxed:g} ms")
        self.say(f"{result.workload}/{result.name}: never meets p99 <= {slo_ms:g} ms (every rate failed, "
                 f"down to {lowest:,.1f} RPS): searched at p99 <= {relaxed:g} ms")
        result.relaxed_from_ms, result.slo_ms, result.searches = slo_ms, relaxed, []
        return relaxed

    def _searches(self, running: RunningSetup, load: LoadSettings, result: SetupResult,
                  closed_rps: float, slo_ms: float, relax_unmet: bool = False) -> None:
        """`plan.searches` SLO searches (the repeats around the first's answer); sets
        `result.searches`, `slo_rps` (their median) and `slo_bound_reached`. `relax_unmet`:
        stop after a first search that passed no rate, down to its lowest or within its
        share of the time budget (`result.searches` is then [None]), for the caller to
        search again at the relaxed SLO (`_relax_unmet`)."""
        plan = self.plan
        first_ladder = plan.ladder(closed_rps)
        lower_bounds: list[bool] = []  # per search: no rate failed (its answer is a floor)
        for number in range(1, plan.searches + 1):
            until = Budget.search_deadline(time.monotonic(), self._deadline, plan.searches - number + 1,
                                           first=number == 1)
            if number == 1:
                search = SloSearch(first_ladder, plan.tolerance, plan.max_steps,
                                   descend=DESCEND, min_rate=plan.min_rate_rps, extend=plan.extend)
            else:
                ladder = repeat_ladder(result.searches[0], first_ladder)
                search = SloSearch(sorted({max(plan.min_rate_rps, r) for r in ladder}), plan.repeat_tolerance,
                                   plan.repeat_max_steps, confirmations=0, descend=1 - plan.repeat_step,
                                   min_rate=plan.min_rate_rps, extend=1 + plan.repeat_step)
                # A repeat needs about its ladder's first two steps to say anything; skip it
                # when they do not fit in this job's share of the budget.
                need = sum(plan.step_cost(r) for r in search.ladder[:2])
                if time.monotonic() + need > self._deadline:
                    result.notes.append(f"time budget: {number - 1} of {plan.searches} searches")
                    self.say(f"{result.workload}/{result.name}: search {number} skipped, it would "
                             "not fit in the run's time budget")
                    break
            relaxing = relax_unmet and number == 1  # a first search with no pass hands over
            while (step := search.next_step()) is not None:
                rate, phase = step
                over_share = time.monotonic() + plan.step_cost(rate) > until
                if (relaxing and search.slo_rps is None and search.steps and over_share
                        and min(r for r, _ in search.steps) <= RELAX_BELOW * closed_rps):
                    # No rate met the workload's SLO within this search's share, down to a
                    # small share of the setup's closed-loop RPS: the rest of the job's time
                    # is for the relaxed SLO (a peer descending 5 s steps to 8.9 RPS at 25
                    # ms, Ray Serve on fraud, took 2 min of the heavier model's jobs' time).
                    break
                if search.slo_rps is not None and over_share:
                    # This search's share is spent and it has an answer: the rest of the job's
                    # time is the later searches' (and jobs').
                    result.notes.append(f"search {number} ended at its share of the time budget, "
                                        f"after {len(search.steps)} steps")
                    self.say(f"{result.workload}/{result.name}: search {number} ends at its share "
                             f"of the time budget ({len(search.steps)} steps)")
                    break
                if self.budget.left(time.monotonic()) - plan.step_cost(rate) < self._reserve_s:
                    # The run's budget is spent (memory runs aside): stop here, with what the
                    # search has so far, rather than run past it.
                    result.notes.append(f"time budget spent during search {number}: its answer is "
                                        "the last pass so far")
                    self.say(f"{result.workload}/{result.name}: the run's time budget is spent, "
                             f"search {number} ends here")
                    break
                point = self.step(running, load, rate, phase, result.latency_curve, search=number,
                                  slo_ms=slo_ms)
                search.record(rate, point.passed)
            result.searches.append(search.slo_rps)
            lower_bounds.append(search.bound_reached)
            if relaxing and search.slo_rps is None and search.steps:
                break
            if search.slo_rps is None and any(v is not None for v in result.searches):
                lowest = min((p.offered_rps for p in result.latency_curve if p.search == number), default=0.0)
                result.notes.append(f"search {number} passed no rate, down to {lowest:,.0f} RPS: its answer is "
                                    "below that, and it is left out of the median (bench.slo.spread)")
        sp = spread(result.searches)
        result.slo_rps = sp.median if sp.median > 0 else None
        # The median is a floor when the search that gave it never failed.
        bound = any(floor and value == sp.median for value, floor in zip(sp.values, lower_bounds, strict=True))
        result.slo_bound_reached = bound
        if bound:
            result.notes.append("the search that gives the median met the SLO at every rate it measured: "
                                "SLO-RPS is at least this")

    def _measure_memory(self, job: Job, result: SetupResult) -> None:
        """A fresh start per memory worker count not measured yet; read its PSS."""
        for count in self.plan.memory_workers:
            if result.memory_at(count) is None:
                with self.start_setup(job.setup, job.workload, workers=count) as running:
                    result.memory.append(self._memory(running, workers=count))
        result.memory.sort(key=lambda m: m.workers)

    def _memory(self, running: RunningSetup, workers: int | None = None) -> MemoryRun:
        """Total PSS after one closed-loop round of `plan.memory_warmup_s` and the drain of
        its backlog, so every worker has served and built what serving needs. `workers`: the
        count it was started with, waited for (`WORKERS_UP_TIMEOUT_S`) before the warm-up.
        The count recorded is the workers of the PSS snapshot itself."""
        name = running.setup.name
        notes = []
        if workers is not None:
            # Ready means one worker answers; the others may still be starting: a split
            # started with WEB_CONCURRENCY=4 counted 2 workers at ready and 3 a second later,
            # and its 4-worker PSS was recorded as 3 workers' (no 4-worker target measured).
            try:
                wait_until(lambda: running.workers >= workers, WORKERS_UP_TIMEOUT_S,
                           f"{workers} worker(s) of {name}", poll_s=0.2)
            except NotReady:
                notes.append(f"{running.workers} of {workers} workers up after {WORKERS_UP_TIMEOUT_S:g} s")
        self.say(f"{running.workload.name}/{name}: memory with {running.workers} worker(s), after a "
                 f"{self.plan.memory_warmup_s:g} s warm-up")
        before = tree_cpu_ticks(running.pids())
        run_closed_loop(self.load_settings(running), connections=self.plan.closed_connections,
                        duration_s=self.plan.memory_warmup_s)
        self.wait_idle(running)
        after = tree_cpu_ticks(running.pids())
        roles = running.roles()
        idle = [pid for pid, ticks in after.items()
                if is_worker(roles.get(pid, "")) and ticks == before.get(pid, 0)]
        if idle:
            notes.append(f"workers {idle} used no CPU during warm-up (may not have served)")
        memory = tree_memory(running.pids(), roles)
        counted = sum(1 for p in memory.processes if is_worker(p.role))
        self.say(f"{running.workload.name}/{name}: total PSS {memory.pss_mb:,.0f} MB with "
                 f"{counted} worker(s) ({len(memory.processes)} processes)")
        return MemoryRun(counted, memory.processes, notes)
