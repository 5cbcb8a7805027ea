"""How long and how hard the benchmark runs: the quick and the full plan.

The quick plan (`make bench`) fits in under 5 minutes on a 2-core machine: short runs,
one offered load per setup (80 % of its own saturation) plus the reference load. The
full plan (`make bench-full`) runs long enough for stable p99.9 figures. Every run is
bounded in time: wrk stops itself after its duration.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Plan:
    """Durations (whole seconds: wrk's -d has no fractions), loads and connection counts."""

    mode: str
    warmup_s: float  # one closed-loop warm-up round (first calls build predict functions)
    saturation_s: float  # the closed-loop run whose RPS is "throughput at saturation"
    fixed_rate_s: float  # each paced run
    load_fractions: tuple[float, ...]  # offered loads, as fractions of the setup's own RPS
    reference_fraction: float = 0.8  # the common load: this fraction of tuned's RPS
    saturation_connections: int = 32  # FACTS.md's baselines use 32
    # Paced runs use rate x 50 ms connections, within these bounds: enough that a free
    # connection is there at each due time while answers take up to ~50 ms, few enough
    # that at low rates each is reused before the server's 5 s keep-alive closes it
    # (a close racing a send is a spurious read error). When all are busy at a due time
    # the wait still counts as latency, so a small pool cannot hide queueing.
    fixed_rate_connections: int = 64
    fixed_rate_min_connections: int = 8
    fixed_rate_connection_s: float = 0.05
    memory_workers: tuple[int, ...] = (1, 4)
    warmup_max_s: float = 20.0  # warm-up rounds stop here even if RPS is not steady yet
    warmup_tolerance: float = 0.2  # steady: two rounds' RPS within this share
    # Before every run the setup must be idle (below idle_cores over idle_window_s):
    # the previous run's in-flight requests are drained (see Runner.wait_idle).
    idle_cores: float = 0.05
    idle_window_s: float = 0.3
    idle_timeout_s: float = 60.0
    memory_warmup_s: float = 3.0  # one closed-loop round before a memory snapshot
    # Memory-only starts are pinned like the throughput runs, so memory is read under
    # the same CPU budget: glibc's malloc arena limit (8 per CPU) and TensorFlow's
    # default thread pools scale with the CPU count.
    memory_pinned: bool = True
    memory_all_splits: bool = False  # memory for every split variant, or the fastest only
    timeout_s: float = 2.0  # an answer later than this counts as a timeout error
    # A setup whose RPS is below this share of the reference load is not offered it:
    # the run would only measure a queue growing for fixed_rate_s seconds.
    reference_min_share: float = 0.5

    def paced_connections(self, rate_rps: float) -> int:
        """Connections for a paced run at `rate_rps` (see the fields above)."""
        wanted = math.ceil(rate_rps * self.fixed_rate_connection_s)
        return max(self.fixed_rate_min_connections, min(self.fixed_rate_connections, wanted))


QUICK = Plan(
    mode="quick",
    warmup_s=2.0,
    saturation_s=5.0,
    fixed_rate_s=5.0,
    load_fractions=(0.8,),
    warmup_max_s=12.0,
    memory_warmup_s=2.0,
)
FULL = Plan(
    mode="full",
    warmup_s=5.0,
    saturation_s=20.0,
    fixed_rate_s=20.0,
    load_fractions=(0.25, 0.5, 0.8, 0.95),
    warmup_max_s=40.0,
    memory_warmup_s=5.0,
    memory_all_splits=True,
)
