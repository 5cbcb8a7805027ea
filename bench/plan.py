"""How long and how hard the benchmark runs: the quick and the full plan.

The quick plan (`make bench`) fits in under 8 minutes on a 2-core machine: short steps,
the headline setups of both workloads, a 10 % refinement tolerance. The full plan
(`make bench-full`) runs every variant with longer steps and a finer search. Every run is
bounded in time: each load step by its duration plus the request timeout, each search by
`max_steps`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bench.slo import DEFAULT_SLO_MS


@dataclass(frozen=True)
class Plan:
    """Durations (seconds), the search's shape, and the memory measurements."""

    mode: str
    slo_ms: float = DEFAULT_SLO_MS
    seed: int = 2026  # the Poisson timetable of every step (same shape at every rate)
    # Warm-up: closed-loop rounds of warmup_s until two agree within warmup_tolerance
    # (first calls build predict functions), at most warmup_max_s. The last round's
    # answers per second, the closed-loop RPS, seeds the sweep's ladder.
    warmup_s: float = 2.0
    warmup_max_s: float = 12.0
    warmup_tolerance: float = 0.2
    closed_connections: int = 32
    # One open-loop step: at least step_s, long enough for min_requests arrivals, at most
    # step_max_s.
    step_s: float = 2.5
    step_max_s: float = 6.0
    min_requests: int = 300
    # The sweep: these fractions of the closed-loop RPS, ascending, then bisection to
    # `tolerance`, `max_steps` measurements in all.
    ladder_fractions: tuple[float, ...] = (0.1, 0.25, 0.45, 0.65, 0.85, 1.05, 1.3)
    tolerance: float = 0.1
    max_steps: int = 10
    min_rate_rps: float = 5.0  # ladder rates are never below this
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
        """Seconds of arrivals for one step at `rate_rps` (see the fields above)."""
        return min(self.step_max_s, max(self.step_s, self.min_requests / rate_rps))

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
    step_s=10.0,
    step_max_s=20.0,
    min_requests=2000,
    ladder_fractions=(0.05, 0.1, 0.2, 0.3, 0.45, 0.6, 0.75, 0.9, 1.05, 1.2, 1.4),
    tolerance=0.03,
    max_steps=18,
    memory_warmup_s=5.0,
    memory_variants=True,
)
