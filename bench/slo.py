"""Throughput at a latency SLO: the pass rule, the search, the repeats and the SLO itself.

MLPerf Inference's Server scenario reports the highest Poisson arrival rate at which the
tail latency stays within a bound. Here a rate *fails* only on evidence (`judge`):

- a failed request (non-2xx, connect/read error, timeout), or the schedule not kept
  (`schedule_kept`: every arrival sent, the generator itself on time);
- more late requests (answered later than the SLO, or still unanswered and already older
  than it) than 1 % of the step's planned arrivals: its p99 cannot be within the SLO,
  whatever the rest does (`LATE_SHARE`);
- or at least `MIN_EVIDENCE_ANSWERS` answers whose p99 is above the SLO.

Why: a p99 of 50 answers is their maximum, so one scheduler hiccup failed such a step
(several refine steps failed with the servers 0.6-0.7 cores busy on a 2-core box). A
step of 1,000 arrivals needs 11 late requests to fail. The plan gives every step at
least that many arrivals (`bench.plan.Plan.min_requests`).

A setup's SLO-RPS is the highest passing rate found by `SloSearch` (a sweep up a ladder
until the first failure, then bisection), searched `Plan.searches` times; `spread`
gives the median and the min-max of those searches, and says when they disagree by more
than `WIDE_SPREAD`. `derived_slo_ms` is each workload's SLO, from what the machine does.
All of it is pure (no I/O, no clock), so the tests drive it with synthetic curves.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

DEFAULT_SLO_MS = 25.0
#: A step fails when more than this share of its planned arrivals were late.
LATE_SHARE = 0.01
#: A step fails on its p99 alone only with at least this many answers.
MIN_EVIDENCE_ANSWERS = 1000
#: The report flags a setup whose searches' (max - min) / median exceeds this.
WIDE_SPREAD = 0.15
#: The derived SLO: max(SLO_FLOOR_MS, SLO_FACTOR x tuned's unloaded one-request p50),
#: rounded up to a multiple of SLO_ROUND_MS.
SLO_FLOOR_MS = 25.0
SLO_FACTOR = 10.0
SLO_ROUND_MS = 5.0
#: A setup that cannot meet its workload's SLO (its unloaded p50 is above it, and it fails
#: at its ladder's lowest rate) is searched at this multiple of it instead, or at the SLO its
#: own unloaded p50 derives when larger (`relaxed_slo_ms`), so that it gets a number too; the
#: report names that SLO beside its figure and no target compares it.
RELAXED_SLO_FACTOR = 4.0
#: The generator is on schedule while its own send lag (p99, for requests that found a free
#: connection) is at most this share of the SLO: a late generator adds to every latency it
#: measures, and a lag this small cannot be what makes a step fail; more, and the offered
#: rate is not the one claimed (the generator was short of CPU).
SCHEDULE_LAG_SHARE = 0.1
#: A failed step is measured again (once, `STOLEN_REMEASURES`) when the hypervisor took more
#: than this share of its servers' CPU time (steal, `bench.procfs.parse_steal`): the arrivals
#: during time stolen in one piece all wait it out, so a theft of more than the late share
#: can fail the step by itself, whatever the setup does. On a shared virtual machine steal
#: comes in bursts (1-15 % of CPU 0 over 5 s seen on a 2-core EPYC VM with the CPU barely
#: busy), and the same rate failed and passed on it between two searches (tuned fraud at
#: 689 RPS: 6 late, then 398 and 984).
STOLEN_SHARE = LATE_SHARE
STOLEN_REMEASURES = 1


def schedule_kept(*, planned: int, sent: int, generator_lag_p99_ms: float, slo_ms: float) -> bool:
    """Every arrival of the timetable was sent, the generator's lag p99 within the share."""
    return sent >= planned and generator_lag_p99_ms <= SCHEDULE_LAG_SHARE * slo_ms


def stolen_too_much(stolen_cores: float, cpus: int) -> bool:
    """Whether a step's servers lost more than `STOLEN_SHARE` of their CPU time to steal.

    Args:
        stolen_cores: steal over the step, in cores (CPU seconds per wall second), summed
            over the servers' CPUs.
        cpus: how many CPUs the servers run on (at least 1 is assumed; unpinned servers
            are read on no CPU, so their steal is 0).
    """
    return stolen_cores > STOLEN_SHARE * max(1, cpus)


@dataclass(frozen=True)
class Verdict:
    """Whether one measured rate met the SLO, and why not."""

    passed: bool
    reason: str = ""  # why it failed ("" when it passed)


def late_budget(planned: int) -> float:
    """Late requests a step of `planned` arrivals may have and still pass (1 % of them)."""
    return LATE_SHARE * planned


def judge(
    *, p99_ms: float | None, errors: int, schedule_kept: bool, slo_ms: float,
    answered: int | None = None, late: int | None = None, planned: int | None = None,
) -> Verdict:
    """The pass rule above for one step.

    Args:
        p99_ms: the step's p99 in ms (None when nothing was answered).
        errors: failed requests of the step.
        schedule_kept: the generator sent every arrival on time.
        slo_ms: the bound, milliseconds.
        answered: 2xx answers (None: unknown, the p99 alone decides, as before counts).
        late: requests answered later than `slo_ms`, plus those unanswered at an early
            stop that were already older than it (None: unknown).
        planned: arrivals in the step's timetable (None: unknown).

    A step that stopped early has `late > late_budget(planned)` (that is why it stopped),
    so it fails on that count, not on the p99 of the few answers it had.
    """
    if errors:
        return Verdict(False, f"{errors} failed request(s)")
    if late is not None and planned is not None and late > late_budget(planned):
        return Verdict(False, f"{late} late of {planned} planned (> {LATE_SHARE:.0%})")
    if p99_ms is None:
        return Verdict(False, "no answers")
    if not schedule_kept:
        return Verdict(False, "schedule not kept")
    if p99_ms > slo_ms:
        if answered is not None and answered < MIN_EVIDENCE_ANSWERS:
            return Verdict(True, f"p99 {p99_ms:.1f} ms of only {answered} answers: no evidence")
        return Verdict(False, f"p99 {p99_ms:.1f} ms > {slo_ms:g} ms")
    return Verdict(True)


@dataclass(frozen=True)
class Spread:
    """The SLO-RPS of a setup's repeated searches (requests/s; 0.0 for a search that never
    met the SLO).

    Attributes:
        values: each search's SLO-RPS, in search order (0.0: it passed no rate).
        median, low, high: their median, minimum and maximum, over the searches that passed
            a rate when any did (`spread`).
        unanswered: searches that passed no rate while another did, left out of those.
    """

    values: tuple[float, ...]
    median: float
    low: float
    high: float
    unanswered: int = 0

    @property
    def relative(self) -> float:
        """(high - low) / median; 0.0 for one search, inf when the median is 0 but not all are."""
        if self.median <= 0:
            return 0.0 if self.high <= 0 else math.inf
        return (self.high - self.low) / self.median

    @property
    def wide(self) -> bool:
        """The searches disagree by more than `WIDE_SPREAD` of their median, or one of them
        passed no rate while another did."""
        return self.relative > WIDE_SPREAD or self.unanswered > 0


def spread(values: Sequence[float | None]) -> Spread:
    """Median and min-max of repeated searches' SLO-RPS (None: the search passed no rate).

    None counts as 0 only when no search passed a rate (never met). A repeat that failed
    every one of its steps while another search passed a rate found its own few steps
    failing -- its answer is below its lowest step, not 0 -- so it is left out of the median
    and min-max and counted in `Spread.unanswered`: as 0, one such repeat made a split of
    494 SLO-RPS a 247 (median of 494 and 0) on a VM whose neighbours took up to 32 % of the
    servers' CPU during those steps. The median of an even count is the mean of the two
    middle values.

    Raises:
        ValueError: no values.
    """
    if not values:
        raise ValueError("spread of no searches")
    shown = tuple(0.0 if v is None else float(v) for v in values)
    answered = [float(v) for v in values if v is not None]
    ordered = sorted(answered or shown)
    mid = len(ordered) // 2
    median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    unanswered = len(values) - len(answered) if answered else 0
    return Spread(shown, median, ordered[0], ordered[-1], unanswered)


def derived_slo_ms(
    unloaded_p50_ms: float, *, floor_ms: float = SLO_FLOOR_MS, factor: float = SLO_FACTOR,
    round_ms: float = SLO_ROUND_MS,
) -> float:
    """A workload's SLO from what this machine does: max(floor_ms, factor x the tuned setup's
    unloaded one-request p50), rounded up to a multiple of `round_ms` (milliseconds).

    E.g. 2.6 ms -> 26 -> 30 ms; 16 ms (the transformer without AVX-512) -> 160 ms; 1.2 ms -> 25 ms.

    Raises:
        ValueError: a p50 that is not a positive finite number.
    """
    if not (unloaded_p50_ms > 0 and math.isfinite(unloaded_p50_ms)):
        raise ValueError(f"unloaded p50 must be a positive number of ms, got {unloaded_p50_ms}")
    wanted = max(floor_ms, factor * unloaded_p50_ms)
    return math.ceil(round(wanted / round_ms, 9)) * round_ms


def relaxed_slo_ms(
    slo_ms: float, own_unloaded_p50_ms: float | None = None, factor: float = RELAXED_SLO_FACTOR
) -> float:
    """The SLO a setup that never meets its workload's is searched at, ms: `factor` x that
    SLO (25 ms -> 100 ms), or, when larger, the SLO `derived_slo_ms` gives for the setup's
    own unloaded one-request p50 -- the rule the workload's SLO comes from, applied to the
    setup itself, so that every setup gets a number. Why: naive on an EPYC without AVX-512
    answers one request in 75-84 ms and its p99 at 5 RPS was 117-165 ms; at 100 ms it
    never met in four runs of four (75.5 ms -> 755 ms).

    Raises:
        ValueError: an SLO or p50 that is not a positive finite number.
    """
    if not (slo_ms > 0 and math.isfinite(slo_ms)):
        raise ValueError(f"an SLO must be a positive number of ms, got {slo_ms}")
    relaxed = factor * slo_ms
    if own_unloaded_p50_ms is not None:
        relaxed = max(relaxed, derived_slo_ms(own_unloaded_p50_ms))
    return relaxed


def repeat_ladder(first_slo_rps: float | None, fallback: Sequence[float]) -> list[float]:
    """Where a repeated search starts: the first search's SLO-RPS, one rate; `fallback` (the
    first search's own ladder, ascending) when it found none.

    From there a repeat is a staircase (`SloSearch` with `extend`, `descend` and no
    confirmation): up a step after each pass, down after a failure, then bisection to its
    tolerance, so it can end anywhere its steps reach, above or below the first's answer.
    It needs fewer steps than the first search (it starts near the answer), never fewer
    arrivals per step.
    """
    if not first_slo_rps or first_slo_rps <= 0:
        return sorted(set(fallback))
    return [round(first_slo_rps, 1)]


#: A descent's step at most halves the failed rate, so the pass it reaches lies within 2x of a
#: failure and a refinement or two brackets the SLO-RPS (`SloSearch`'s `descend`).
MAX_DESCENT = 0.5


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
        descend: when the lowest rate tried fails, try `descend` x it next (down to
            `min_rate`) instead of ending with no answer: a repeat whose ladder starts near
            the first search's answer still finds one when this machine is slower now. Each
            further descent squares the factor (0.9, then 0.81, 0.66, ...: 0.9, 0.73, 0.48 of
            the start), so a setup far slower than the start is still reached in a few
            steps (BentoML's dispatcher, after a search that overloaded it, failed 10 % and
            20 % below a rate it had just passed), but one step never goes below
            `MAX_DESCENT` x the failed rate: squared without that floor, the first search's
            0.6 became 0.36 and then 0.13, and BentoML, failing at 81 RPS by 4 late requests
            of 393, was next measured at 10.5 RPS, which passed; the search's time was then
            spent and its repeats, climbing 10 % a step from there, reported 12 RPS, a
            seventh of a rate that had failed by a hair. 0 ends the search there (no SLO-RPS).
        min_rate: the lowest rate a descent tries, requests/s.
        extend: when every ladder rate passed, go on at `extend` x the highest rate passed
            ("extend"), until a rate fails or the steps run out, instead of ending at the
            ladder's top: the ladder is planned from an estimate (the closed-loop RPS, or an
            earlier search's answer), and a setup faster than it would otherwise be reported
            at the estimate. 0 (or <= 1) ends the search at the ladder's top.

    The result, `slo_rps`, is the highest rate that passed below every rate that failed
    (None when the lowest rate tried failed). `bound_reached` says no rate failed: the
    search ended (its ladder, or its steps, spent) before it found where the SLO breaks,
    so the SLO-RPS is at least `slo_rps`.
    """

    ladder: Sequence[float]
    tolerance: float = 0.05
    max_steps: int = 12
    confirmations: int = 1
    descend: float = 0.0
    min_rate: float = 1.0
    extend: float = 0.0
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
        """Rates were measured and none failed: `slo_rps` is a lower bound."""
        return bool(self.steps) and self.first_fail is None

    @property
    def budget_spent(self) -> bool:
        """`max_steps` measurements taken."""
        return len(self.steps) >= self.max_steps

    def next_step(self) -> tuple[float, str] | None:
        """The next rate to measure and its phase ("sweep", "extend", "confirm", "descend" or "refine"),
        or None when the search is over."""
        if self.budget_spent:
            return None
        fail, ok = self.first_fail, self.last_pass
        measured = self._passed()
        if fail is None:  # still sweeping
            rest = [r for r in self.ladder if r not in measured]
            if rest:
                return float(rest[0]), "sweep"
            if self.extend > 1:
                return round(max(measured) * self.extend, 1), "extend"
            return None
        tries = sum(1 for r, _ in self.steps if r == fail)
        swept = fail in self.ladder or (self.extend > 1 and ok is not None)
        if fail == max(measured) and swept and tries <= self.confirmations:
            return fail, "confirm"
        if ok is None:  # the lowest rate tried failed
            descents = len({rate for rate, passed in self.steps if not passed}) - 1  # taken so far
            factor = max(MAX_DESCENT, self.descend ** (2 ** max(0, min(descents, 6))))
            lower = round(fail * factor, 1)
            if self.descend > 0 and lower >= self.min_rate and lower < fail:
                return lower, "descend"
            return None  # the SLO is never met
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
