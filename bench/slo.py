"""Throughput at a latency SLO: the pass rule and the search for the highest passing rate.

MLPerf Inference's Server scenario reports the highest Poisson arrival rate at which the
tail latency stays within a bound. Here a rate *passes* when its open-loop run had

- p99 latency (from each request's intended send time) <= the SLO (25 ms by default),
- no failed request (non-2xx, connect/read error, timeout), and
- its schedule kept (`schedule_kept`: every arrival sent, the generator itself on time),

and a setup's SLO-RPS is the highest passing rate found by `SloSearch`: a coarse sweep
up a ladder of rates until the first failure, then bisection between the last pass and
the first failure until they are within a relative tolerance, or the step budget is spent.
Both are pure (no I/O, no clock), so the tests drive them with synthetic latency curves.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

DEFAULT_SLO_MS = 25.0
#: The generator is on schedule while its own send lag (p99, for requests that found a free
#: connection) is at most this share of the SLO: a late generator adds to every latency it
#: measures, and a lag this small cannot be what makes a step fail; more, and the offered
#: rate is not the one claimed (the generator was short of CPU).
SCHEDULE_LAG_SHARE = 0.1


def schedule_kept(*, planned: int, sent: int, generator_lag_p99_ms: float, slo_ms: float) -> bool:
    """Every arrival of the timetable was sent, the generator's lag p99 within the share."""
    return sent >= planned and generator_lag_p99_ms <= SCHEDULE_LAG_SHARE * slo_ms


@dataclass(frozen=True)
class Verdict:
    """Whether one measured rate met the SLO, and why not."""

    passed: bool
    reason: str = ""  # why it failed ("" when it passed)


def judge(
    *, p99_ms: float | None, errors: int, schedule_kept: bool, slo_ms: float
) -> Verdict:
    """The pass rule above for one run.

    Args:
        p99_ms: the run's p99 (None when nothing was answered).
        errors: failed requests of the run.
        schedule_kept: the generator sent every arrival on time.
        slo_ms: the bound, milliseconds.
    """
    if errors:
        return Verdict(False, f"{errors} failed request(s)")
    if p99_ms is None:
        return Verdict(False, "no answers")
    if not schedule_kept:
        return Verdict(False, "schedule not kept")
    if p99_ms > slo_ms:
        return Verdict(False, f"p99 {p99_ms:.1f} ms > {slo_ms:g} ms")
    return Verdict(True)


@dataclass
class SloSearch:
    """Coarse sweep, then bisection. Ask `next_step()`, measure it, `record()` the verdict.

    Args:
        ladder: the sweep's rates, ascending (e.g. fractions of the closed-loop RPS).
        tolerance: refinement stops once (first failure / last pass - 1) <= this.
        max_steps: at most this many measurements in all (sweep included).
        confirmations: the sweep's first failure is measured again this many times before
            the sweep ends there. Load from other processes can only make a step worse, so
            one failure on a shared machine may be noise, while one pass is evidence: a
            rate passes when any of its measurements passed.

    The result, `slo_rps`, is the highest rate that passed below every rate that failed
    (None when the lowest rate tried failed). `bound_reached` says the whole ladder passed:
    the SLO-RPS is then at least `slo_rps`, the search did not find its end.
    """

    ladder: Sequence[float]
    tolerance: float = 0.05
    max_steps: int = 12
    confirmations: int = 1
    steps: list[tuple[float, bool]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.ladder or any(r <= 0 for r in self.ladder):
            raise ValueError(f"the ladder needs positive rates, got {list(self.ladder)}")
        if list(self.ladder) != sorted(self.ladder):
            raise ValueError("the ladder must be ascending")
        if not self.tolerance > 0:
            raise ValueError("tolerance must be > 0")

    def _passed(self) -> dict[float, bool]:
        verdicts: dict[float, bool] = {}
        for rate, ok in self.steps:
            verdicts[rate] = verdicts.get(rate, False) or ok
        return verdicts

    @property
    def first_fail(self) -> float | None:
        """The lowest rate that failed every time it was measured."""
        fails = [r for r, ok in self._passed().items() if not ok]
        return min(fails) if fails else None

    @property
    def last_pass(self) -> float | None:
        """The highest rate that passed below the lowest failure."""
        fail = self.first_fail
        passes = [r for r, ok in self._passed().items() if ok and (fail is None or r < fail)]
        return max(passes) if passes else None

    @property
    def slo_rps(self) -> float | None:
        """The search's answer so far (see the class docstring)."""
        return self.last_pass

    @property
    def bound_reached(self) -> bool:
        """Every ladder rate was measured and passed."""
        return self.first_fail is None and all(r in self._passed() for r in self.ladder)

    @property
    def budget_spent(self) -> bool:
        """`max_steps` measurements taken."""
        return len(self.steps) >= self.max_steps

    def next_step(self) -> tuple[float, str] | None:
        """The next rate to measure and its phase ("sweep", "confirm" or "refine"), or None
        when the search is over."""
        if self.budget_spent:
            return None
        fail, ok = self.first_fail, self.last_pass
        measured = self._passed()
        if fail is None:  # still sweeping
            rest = [r for r in self.ladder if r not in measured]
            return (float(rest[0]), "sweep") if rest else None
        tries = sum(1 for r, _ in self.steps if r == fail)
        if fail == max(measured) and fail in self.ladder and tries <= self.confirmations:
            return fail, "confirm"
        if ok is None:  # the lowest rate tried failed: the SLO is never met
            return None
        if fail / ok - 1 <= self.tolerance:
            return None
        return math.sqrt(ok * fail), "refine"  # halve the interval on a log scale

    def next_rate(self) -> float | None:
        """The rate of `next_step()`, or None."""
        step = self.next_step()
        return step[0] if step else None

    def record(self, rate: float, passed: bool) -> None:
        """The verdict for `rate` (normally the last `next_step()`'s)."""
        self.steps.append((rate, passed))
