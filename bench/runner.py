"""Runs the plan over the setups: start, warm up, saturate, pace, measure memory, stop.

Per setup, in this order:
1. start it with the throughput worker count, pinned to the server CPUs, and wait until
   every worker is ready and a real transaction is scored;
2. warm up (closed-loop rounds until throughput is steady, results discarded);
3. saturation: a closed-loop run; its successful answers per second are the setup's RPS;
4. fixed rates: paced runs at fractions of its own RPS, and at the common reference
   load (80 % of tuned's RPS) when it can come near it;
5. memory: for each of the plan's API worker counts (1 and 4) a fresh start, a short
   warm-up, then the total PSS of the process tree. An in-process setup whose
   throughput start already has such a count is measured right after that start;
   the rest after all throughput runs (quick plan: the best split variant only).
Every run starts from an idle setup (`wait_idle`), and the warm-up goes on until
throughput is steady (`warm_up`), so no run pays for the one before it.
CPU use is read around every run. A setup that fails is recorded as failed with its
reason and the run goes on with the next.
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
    FixedRateResult,
    LoadSettings,
    LoadToolError,
    run_closed_loop,
    run_fixed_rate,
)
from bench.memory import tree_memory
from bench.plan import Plan
from bench.processes import SetupError
from bench.procfs import CLK_TCK, system_cpu_ticks, tree_cpu_ticks
from bench.results import (
    BenchResults,
    CpuUse,
    FixedRateRun,
    MemoryRun,
    SaturationRun,
    SetupResult,
)
from bench.setups import NotAvailable, RunningSetup, Serving, Setup, start, start_serving

T = TypeVar("T", ClosedLoopResult, FixedRateResult)
Progress = Callable[[str], None]


@dataclass(frozen=True)
class Environment:
    """Where and on what the setups run."""

    run_dir: Path  # logs and outputs of this run
    pool: Path  # request bodies, one JSON per line
    probe: bytes  # one valid body, used for readiness
    server_cpus: tuple[int, ...]  # taskset for every server process; () = not pinned
    load_cpus: tuple[int, ...]  # taskset for wrk


def measure_cpu(running: RunningSetup, run: Callable[[], T]) -> tuple[T, CpuUse]:
    """Call `run` (a wrk run) and read the CPU the setup, wrk and everything else used."""
    pids = running.pids()
    roles = running.roles()
    ticks_before = tree_cpu_ticks(pids)
    system_before = system_cpu_ticks()
    started = time.monotonic()
    result = run()
    wall = time.monotonic() - started
    ticks_after = tree_cpu_ticks(running.pids())
    system_after = system_cpu_ticks()

    by_role: dict[str, float] = {}
    setup_ticks = 0
    for pid, ticks in ticks_after.items():
        used = ticks - ticks_before.get(pid, 0)
        setup_ticks += used
        role = roles.get(pid, "other")
        by_role[role] = by_role.get(role, 0.0) + used / CLK_TCK / wall
    load_cores = result.load_cpu_cores
    other_s = (system_after - system_before - setup_ticks) / CLK_TCK - load_cores * wall
    return result, CpuUse(
        setup_cores=setup_ticks / CLK_TCK / wall,
        by_role={k: round(v, 3) for k, v in sorted(by_role.items())},
        load_generator_cores=load_cores,
        other_cores=max(0.0, other_s / wall),
    )


class Runner:
    """Runs one `Plan` over a list of setups in one `Environment`."""

    def __init__(self, plan: Plan, env: Environment, progress: Progress) -> None:
        self.plan = plan
        self.env = env
        self._progress = progress
        self._started = time.monotonic()
        # One model server for all split variants' throughput runs: they differ only on
        # the API side, and starting TensorFlow once saves the time of several starts.
        self._serving: Serving | None = None

    def say(self, message: str) -> None:
        """A progress line, prefixed with the time since the run started."""
        elapsed = time.monotonic() - self._started
        self._progress(f"[bench {int(elapsed) // 60:02d}:{int(elapsed) % 60:02d}] {message}")

    def load_settings(self, running: RunningSetup) -> LoadSettings:
        """How wrk is pointed at `running` under this plan."""
        return LoadSettings(
            url=running.url,
            pool=self.env.pool,
            cpus=self.env.load_cpus,
            timeout_s=self.plan.timeout_s,
        )

    def start_setup(
        self, setup: Setup, workers: int, *, pinned: bool = True, shared_serving: bool = False
    ) -> RunningSetup:
        """Start `setup` with `workers` workers, on the server CPUs when `pinned`; return
        once ready. With `shared_serving`, a split setup uses the runner's model server
        (started on first use, stopped by `stop_shared_serving`).

        Raises:
            SetupError: it did not become ready (see `bench.setups.start`).
        """
        cpus = self.env.server_cpus if pinned else ()
        self.say(
            f"{setup.name}: starting, {workers} worker(s), "
            f"CPUs {','.join(map(str, cpus)) or 'all (not pinned)'}"
        )
        serving = None
        if shared_serving and setup.kind == "split" and setup.available:
            if self._serving is None or not self._serving.process.alive():
                self.say("serving: starting the model server shared by the split variants")
                self._serving = start_serving(cpus=cpus, run_dir=self.env.run_dir, tag="shared")
            serving = self._serving
        running = start(
            setup,
            workers=workers,
            cpus=cpus,
            run_dir=self.env.run_dir,
            probe=self.env.probe,
            serving=serving,
        )
        self.say(f"{setup.name}: ready")
        return running

    def stop_shared_serving(self) -> None:
        """Stop the model server the split variants shared, if any."""
        if self._serving is not None:
            self._serving.stop()
            self._serving = None

    def wait_idle(self, running: RunningSetup) -> bool:
        """Wait until the setup's processes use almost no CPU: the previous run's backlog
        is drained.

        wrk stops with up to one request per connection in flight, and a worker whose
        event loop is blocked (naive's `model.predict`) still serves every request it
        has read, for seconds after its client has gone. Without this, that backlog
        would be charged to the next run. Gives up after `plan.idle_timeout_s`.
        """
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

    def warm_up(self, running: RunningSetup, load: LoadSettings, max_s: float) -> bool:
        """Closed-loop rounds of `plan.warmup_s` until throughput is steady.

        Steady: two rounds in a row within `plan.warmup_tolerance` of each other (a
        setup whose workers are still building their first predict function speeds up
        round after round). Stops after `max_s` seconds in any case. Returns whether
        throughput was steady.
        """
        plan = self.plan
        rounds: list[float] = []
        deadline = time.monotonic() + max_s
        steady = False
        while not steady:
            self.wait_idle(running)
            closed = run_closed_loop(
                load, connections=plan.saturation_connections, duration_s=plan.warmup_s
            )
            rounds.append(closed.summary.rps)
            if len(rounds) >= 2:
                before, last = rounds[-2], rounds[-1]
                spread = abs(last - before)
                steady = last > 0 and spread <= plan.warmup_tolerance * max(last, before)
            if time.monotonic() + plan.warmup_s > deadline:
                break
        self.say(
            f"{running.setup.name}: warm-up RPS per {plan.warmup_s:g} s round: "
            + ", ".join(f"{r:,.0f}" for r in rounds)
            + ("" if steady else " (not steady before the warm-up limit)")
        )
        return steady

    def run(self, setups: Sequence[Setup]) -> BenchResults:
        """Throughput and latency of every setup, then memory (see the module docstring)."""
        results = BenchResults(meta={}, setups=[])
        by_name = {s.name: s for s in setups}
        try:
            for setup in setups:
                result = SetupResult(setup.name, setup.column, setup.description)
                results.setups.append(result)
                if not setup.available:
                    result.status, result.reason = "skipped", setup.unavailable_reason
                    self.say(f"{setup.name}: skipped, {setup.unavailable_reason}")
                    continue
                reference = results.reference_rps
                if self._guard(result, functools.partial(self._run_setup, setup, result, reference)):
                    result.status = "ok"
                elif result.status != "skipped":
                    result.status = "failed"
                if setup.column == "tuned" and result.rps:
                    results.reference_rps = self.plan.reference_fraction * result.rps
                    self.say(
                        f"reference load for the p99 goal: {results.reference_rps:,.0f} RPS "
                        f"({self.plan.reference_fraction:.0%} of tuned's {result.rps:,.0f})"
                    )
        finally:
            self.stop_shared_serving()

        best_split = results.best_split()
        for result in results.setups:
            wanted = result.status == "ok" and (
                result.column != "split" or self.plan.memory_all_splits or result is best_split
            )
            if wanted:
                setup = by_name[result.name]
                if not self._guard(result, functools.partial(self._measure_memory, setup, result)):
                    result.notes.insert(0, "memory measurement failed")
        return results

    def _guard(self, result: SetupResult, step: Callable[[], None]) -> bool:
        """Run `step`; on a setup or load failure note it in `result` and go on.

        Returns False on failure (the caller decides what it means for the status).
        """
        try:
            step()
            return True
        except NotAvailable as exc:
            result.status, result.reason = "skipped", str(exc)
            self.say(f"{result.name}: skipped, {exc}")
            return False
        except (SetupError, LoadToolError, OSError, ValueError) as exc:
            first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            if not result.reason:
                result.reason = first_line
            result.notes.append(str(exc)[-3000:])
            self.say(f"{result.name}: FAILED: {first_line}")
            return False

    def _run_setup(self, setup: Setup, result: SetupResult, reference_rps: float | None) -> None:
        plan = self.plan
        workers = setup.workers_for(len(self.env.server_cpus) or 1)
        result.workers = workers
        result.server_cpus = list(self.env.server_cpus)
        with self.start_setup(setup, workers, shared_serving=True) as running:
            result.commands = running.commands()
            load = self.load_settings(running)
            if setup.kind == "inprocess" and workers in plan.memory_workers:
                # A fresh start: measure memory here exactly as a memory-only start
                # would, and save that start.
                result.memory.append(self._memory(running))
            if not self.warm_up(running, load, plan.warmup_max_s):
                result.notes.append("throughput was not steady after the warm-up limit")

            self.wait_idle(running)
            self.say(
                f"{setup.name}: saturation, closed loop, {plan.saturation_connections} "
                f"connections, {plan.saturation_s:g} s"
            )
            closed, cpu = measure_cpu(
                running,
                lambda: run_closed_loop(
                    load, connections=plan.saturation_connections, duration_s=plan.saturation_s
                ),
            )
            result.saturation = SaturationRun(closed, cpu)
            rps = result.saturation.ok_rps
            errors = closed.summary.errors
            self.say(
                f"{setup.name}: {rps:,.1f} RPS at saturation ({errors.total} errors, "
                f"setup {cpu.setup_cores:.2f} cores, wrk {cpu.load_generator_cores:.2f}, "
                f"other {cpu.other_cores:.2f})"
            )
            if rps <= 0:
                raise SetupError(f"no successful answer at saturation ({errors})")

            loads = self._loads(rps, reference_rps, sets_reference=setup.column == "tuned")
            for label, fraction, rate, is_reference in loads:
                connections = plan.paced_connections(rate)
                self.wait_idle(running)
                self.say(
                    f"{setup.name}: fixed rate {rate:,.1f} RPS ({label}), "
                    f"{plan.fixed_rate_s:g} s, {connections} connections"
                )
                paced, cpu = measure_cpu(
                    running,
                    lambda rate=rate, connections=connections: run_fixed_rate(
                        load,
                        rate_rps=rate,
                        connections=connections,
                        duration_s=plan.fixed_rate_s,
                    ),
                )
                result.fixed_rate.append(FixedRateRun(label, fraction, is_reference, paced, cpu))
                lat = paced.latency
                self.say(
                    f"{setup.name}:   {paced.achieved_rps:,.1f} RPS achieved"
                    + (
                        f", p50 {lat.p50_ms:.1f} ms, p99 {lat.p99_ms:.1f} ms, "
                        f"max {lat.max_ms:.1f} ms"
                        if lat
                        else ", no answers"
                    )
                    + ("" if paced.schedule_kept else " (could not keep up)")
                )

    def _measure_memory(self, setup: Setup, result: SetupResult) -> None:
        """Start `setup` once per memory worker count not measured yet, read its PSS.

        Split variants always get fresh starts of their own model server too (the one
        shared during the throughput runs has served other variants' traffic).
        """
        for count in self.plan.memory_workers:
            if result.memory_at(count) is None:
                with self.start_setup(setup, count, pinned=self.plan.memory_pinned) as running:
                    result.memory.append(self._memory(running))
        result.memory.sort(key=lambda m: m.workers)

    def _loads(
        self, own_rps: float, reference_rps: float | None, *, sets_reference: bool
    ) -> list[tuple[str, float | None, float, bool]]:
        """(label, fraction of own RPS, offered RPS, is the reference load) per paced run.

        The setup that sets the reference (tuned) gets no extra run: its own run at the
        reference fraction is the reference load.
        """
        plan = self.plan
        loads: list[tuple[str, float | None, float, bool]] = []
        for fraction in plan.load_fractions:
            is_reference = sets_reference and fraction == plan.reference_fraction
            label = f"{fraction:.0%} of own saturation" + (" = reference" if is_reference else "")
            loads.append((label, fraction, fraction * own_rps, is_reference))
        if sets_reference and not any(is_ref for *_, is_ref in loads):
            rate = plan.reference_fraction * own_rps
            loads.append(("reference: 80% of own saturation", None, rate, True))
        elif (
            not sets_reference
            and reference_rps is not None
            and own_rps >= plan.reference_min_share * reference_rps
        ):
            loads.append(("reference: 80% of tuned's saturation", None, reference_rps, True))
        return loads

    def _memory(self, running: RunningSetup) -> MemoryRun:
        """Total PSS of a freshly started setup after one closed-loop round of
        `plan.memory_warmup_s` and the drain of its backlog (`wait_idle`), so that every
        worker has served and built what serving needs (naive: its predict function).

        Every count is measured the same way (fresh start, same warm-up), so the
        difference between 1 and 4 workers is the cost of the added workers alone.
        """
        name, workers = running.setup.name, running.workers
        notes = []
        self.say(
            f"{name}: memory with {workers} worker(s), after a "
            f"{self.plan.memory_warmup_s:g} s warm-up"
        )
        before = tree_cpu_ticks(running.pids())
        run_closed_loop(
            self.load_settings(running),
            connections=self.plan.saturation_connections,
            duration_s=self.plan.memory_warmup_s,
        )
        self.wait_idle(running)
        after = tree_cpu_ticks(running.pids())
        roles = running.roles()
        idle = [
            pid
            for pid, ticks in after.items()
            if roles.get(pid, "").endswith("worker") and ticks == before.get(pid, 0)
        ]
        if idle:
            notes.append(f"workers {idle} used no CPU during warm-up (may not have served)")
        memory = tree_memory(running.pids(), running.roles())
        self.say(
            f"{name}: total PSS {memory.pss_mb:,.0f} MB with {workers} worker(s) "
            f"({len(memory.processes)} processes)"
        )
        return MemoryRun(workers, memory.processes, notes)
