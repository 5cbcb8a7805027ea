"""How long and how hard the benchmark runs: the quick and the full plan.

The quick plan (`make bench`) fits in 12 minutes on a 2-core machine (`time_budget_s`):
the headline setups and the peers of both workloads, each searched three times, every step
a warm-in at its rate that is not counted (`warm_in_s`) and then at least 1,000 arrivals
(`min_requests`: a step fails only on evidence, `bench.slo.judge`) or `step_max_s`, each
repeat a short staircase from the first search's answer. The quick plan saves time by
taking fewer steps (a coarser ladder, shorter repeats), not fewer samples per step. The
full plan (`make bench-full`) runs every variant with longer steps and a finer search.
Every run is bounded in time: each load step by its warm-in, duration and the request
timeout, each search by `max_steps` and its share of the job's time, the whole run by
`time_budget_s` (`bench.runner.Budget` gives every job an equal share of the search time
up front, after each job's start and the memory runs are set aside, and cuts a search
that has an answer when its next step would not fit, saying so).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Plan:
    """Durations (seconds), the search's shape, and the memory measurements."""

    mode: str
    # None: each workload's SLO is derived from the tuned setup's unloaded p50
    # (bench.slo.derived_slo_ms); a number (--slo-ms) is used for every workload.
    slo_ms: float | None = None
    seed: int = 2026  # the Poisson timetable of every step (same shape at every rate)
    # Warm-up: closed-loop rounds of warmup_s until two agree within warmup_tolerance
    # (first calls build predict functions), at most warmup_max_s. The last round's
    # answers per second, the closed-loop RPS, seeds the sweep's ladder.
    warmup_s: float = 2.0
    warmup_max_s: float = 12.0
    warmup_tolerance: float = 0.2
    closed_connections: int = 32
    # The unloaded latency: one connection back to back for unloaded_s (its p50 derives the
    # workload's SLO from the tuned setup, and a setup whose p50 is above the SLO is not
    # searched: it cannot meet it).
    unloaded_s: float = 1.5
    # One open-loop step: first warm_in_s at its rate, sent but not counted, then at least
    # step_s, long enough for min_requests arrivals, at most step_max_s (below
    # min_requests / step_max_s RPS a step has fewer arrivals, and a single late request
    # weighs more: the report's curve shows each step's count).
    # Why the warm-in: a step's first second at a new rate is a transient (measured on the
    # 2-core machine: the same rate failed with 286 late of 1,008 as the ladder's step up
    # and passed with 8 late when measured again right after; a server's worker threads,
    # batch sizes and the generator's connections follow the rate with a delay). What
    # follows the warm-in is the rate's steady state, so one measurement is a verdict.
    warm_in_s: float = 1.0
    step_s: float = 1.0
    step_max_s: float = 5.0
    min_requests: int = 1000
    # What a step costs beyond its arrivals: the idle wait before it, the generator's start
    # and the drain of the last answers (the budget's estimate, seconds; 0.2-0.5 s between
    # fraud's steps in a quick run on a 2-core Xeon).
    step_overhead_s: float = 0.5
    # The first search: these fractions of the closed-loop RPS, ascending, then bisection
    # to `tolerance`, `max_steps` measurements in all. (The SLO-RPS measured here is 0.55
    # to 0.9 of the closed-loop RPS: the ladder starts at half of it, a low rung being the
    # longest step.)
    ladder_fractions: tuple[float, ...] = (0.5, 0.7, 0.85, 1.0)
    tolerance: float = 0.1
    max_steps: int = 6
    min_rate_rps: float = 5.0  # ladder rates are never below this
    # When every rung passed, the first search goes on at `extend` x the highest rate passed
    # (bench.slo.SloSearch's `extend`): a setup faster than the closed-loop estimate gets its
    # own figure, not the ladder's top.
    extend: float = 1.15
    # Searches per setup. Each repeat starts at the first search's SLO-RPS and is a staircase
    # (bench.slo.repeat_ladder): x (1 + repeat_step) after a pass, x (1 - repeat_step) after a
    # failure, then bisection to repeat_tolerance, at most repeat_max_steps measurements; no
    # confirmation (the median of the searches is what absorbs one noisy step). So a repeat
    # is a measurement of its own: it can end above or below the first's answer, by as much
    # as its steps reach (quick: 4 steps, from about half to +46 %, to 3 %).
    searches: int = 3
    repeat_step: float = 0.1
    repeat_tolerance: float = 0.03
    repeat_max_steps: int = 4
    # The whole run's wall-clock budget, seconds (None: unbounded), and the setups the plan
    # runs per workload (bench.__main__.plan_setups). 12 minutes, of which the starts,
    # warm-ups and memory runs take 5 to 7.5 (a fast and a slow 2-core Xeon); the rest is
    # shared among the jobs by what their steps cost (bench.runner.Budget): a setup below
    # 200 RPS steps 7 s at a time (1,000 arrivals need the 5 s cap) where fraud steps 3 s,
    # and equal seconds gave the heavier model's split one step per search.
    time_budget_s: float | None = 720.0
    timeout_s: float = 2.0  # an answer later than this is an error
    # Before every run the setup must be idle (below idle_cores over idle_window_s): the
    # previous run's backlog is drained (see Runner.wait_idle).
    idle_cores: float = 0.05
    idle_window_s: float = 0.3
    idle_timeout_s: float = 30.0
    # Memory: total PSS with these API worker counts, each a fresh start pinned like the
    # throughput runs (glibc's malloc arenas and TensorFlow's default pools scale with the
    # CPU count), after a closed-loop round of memory_warmup_s.
    memory_workers: tuple[int, ...] = (1, 4)
    memory_warmup_s: float = 2.0
    memory_variants: bool = False  # memory for every split variant, or the headline only
    profile_s: float = 8.0  # --profile: the closed loop py-spy records

    def step_duration(self, rate_rps: float) -> float:
        """Seconds of counted arrivals for one step at `rate_rps` (see the fields above)."""
        return min(self.step_max_s, max(self.step_s, self.min_requests / rate_rps))

    def step_cost(self, rate_rps: float) -> float:
        """Wall-clock seconds one step at `rate_rps` takes, about: its warm-in, its
        duration and `step_overhead_s` (what the time budget plans with)."""
        return self.warm_in_s + self.step_duration(rate_rps) + self.step_overhead_s

    def ladder(self, closed_loop_rps: float) -> list[float]:
        """The sweep's rates for a setup whose closed-loop RPS is `closed_loop_rps`: the
        fractions above, never below min_rate_rps, duplicates dropped, ascending."""
        rates = sorted({max(self.min_rate_rps, round(f * closed_loop_rps, 1))
                        for f in self.ladder_fractions})
        return [r for r in rates if math.isfinite(r)]


QUICK = Plan(mode="quick")
FULL = Plan(
    mode="full",
    warmup_s=5.0,
    warmup_max_s=40.0,
    unloaded_s=5.0,
    warm_in_s=2.0,
    step_s=10.0,
    step_max_s=30.0,
    min_requests=3000,
    ladder_fractions=(0.05, 0.1, 0.2, 0.3, 0.45, 0.6, 0.75, 0.9, 1.05, 1.2, 1.4),
    tolerance=0.03,
    max_steps=18,
    repeat_tolerance=0.02,
    repeat_max_steps=8,
    time_budget_s=None,
    memory_warmup_s=5.0,
    memory_variants=True,
)
#: `--smoke`: every path of a run (each setup, peer install, the report) in seconds per
#: step, for checking the machinery; its figures mean nothing and the report says so.
SMOKE = Plan(
    mode="smoke",
    warmup_s=0.5,
    warmup_max_s=1.5,
    unloaded_s=0.5,
    warm_in_s=0.2,
    step_s=0.3,
    step_max_s=0.6,
    min_requests=50,
    ladder_fractions=(0.3, 0.8),
    max_steps=3,
    searches=2,
    repeat_step=0.3,
    repeat_max_steps=2,
    time_budget_s=None,
    memory_warmup_s=0.5,
    profile_s=2.0,
)
