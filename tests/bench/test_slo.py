"""The SLO pass rule and the SLO-RPS search, driven by synthetic latency curves (pure, no I/O)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import pytest

from bench.plan import FULL, QUICK
from bench.slo import (
    MIN_EVIDENCE_ANSWERS,
    SloSearch,
    derived_slo_ms,
    judge,
    late_budget,
    relaxed_slo_ms,
    repeat_ladder,
    schedule_kept,
    spread,
)

SLO_MS = 25.0


def run_search(p99_at: Callable[[float], float], ladder: list[float], *, tolerance: float = 0.05,
               max_steps: int = 12, confirmations: int = 1) -> SloSearch:
    """Drive a search to its end against a synthetic curve rate -> p99 (no errors)."""
    search = SloSearch(ladder, tolerance, max_steps, confirmations)
    while (rate := search.next_rate()) is not None:
        search.record(rate, judge(p99_ms=p99_at(rate), errors=0, schedule_kept=True,
                                  slo_ms=SLO_MS).passed)
    return search


def knee(capacity: float, floor_ms: float = 2.0) -> Callable[[float], float]:
    """An M/M/1-like curve: p99 grows without bound as the rate nears `capacity`."""
    return lambda rate: math.inf if rate >= capacity else floor_ms / (1 - rate / capacity)


LADDER = [100.0, 250.0, 450.0, 650.0, 850.0, 1050.0, 1300.0]


@pytest.mark.parametrize(
    ("p99_ms", "errors", "kept", "passed", "reason"),
    [
        (10.0, 0, True, True, ""),
        (25.0, 0, True, True, ""),  # at the bound passes
        (25.01, 0, True, False, "p99 25.0 ms > 25 ms"),
        (10.0, 1, True, False, "1 failed request(s)"),
        (10.0, 0, False, False, "schedule not kept"),
        (None, 0, True, False, "no answers"),
    ],
)
def test_pass_rule(p99_ms: float | None, errors: int, kept: bool, passed: bool, reason: str) -> None:
    verdict = judge(p99_ms=p99_ms, errors=errors, schedule_kept=kept, slo_ms=SLO_MS)
    assert (verdict.passed, verdict.reason) == (passed, reason)


@pytest.mark.parametrize(
    ("planned", "sent", "lag_ms", "kept"),
    [(100, 100, 0.01, True), (100, 100, 2.5, True), (100, 100, 2.6, False), (100, 99, 0.0, False)],
)
def test_schedule_kept(planned: int, sent: int, lag_ms: float, kept: bool) -> None:
    assert schedule_kept(planned=planned, sent=sent, generator_lag_p99_ms=lag_ms,
                         slo_ms=SLO_MS) is kept


@pytest.mark.parametrize(
    ("capacity", "low", "high"),
    [
        # SLO crossed where 2 / (1 - r/c) = 25, i.e. r = 0.92 c.
        (700.0, 0.92 * 700 / 1.05, 0.92 * 700),
        (3000.0, 1300.0, 1300.0),  # beyond the ladder: its top rate, bound reached
        (400.0, 0.92 * 400 / 1.05, 0.92 * 400),
    ],
)
def test_search_finds_the_knee_within_the_tolerance(capacity: float, low: float, high: float) -> None:
    search = run_search(knee(capacity), LADDER)
    assert search.slo_rps is not None
    assert low <= search.slo_rps <= high + 1e-9
    if search.first_fail is not None:
        assert search.first_fail / search.slo_rps - 1 <= 0.05


def test_sweep_stops_at_the_first_failure_then_bisects() -> None:
    search = run_search(knee(800.0), LADDER)  # crosses 25 ms at 736
    rates = [rate for rate, _ in search.steps]
    assert rates[:6] == [100.0, 250.0, 450.0, 650.0, 850.0, 850.0]  # 850 fails, confirmed
    assert 1050.0 not in rates
    refined = rates[6:]
    assert refined and all(650.0 < r < 850.0 for r in refined)
    assert refined[0] == pytest.approx(math.sqrt(650.0 * 850.0))


def test_a_setup_that_never_meets_the_slo_has_no_slo_rps() -> None:
    search = run_search(lambda rate: 60.0, LADDER)  # naive: 55 ms per request
    assert search.slo_rps is None
    assert search.steps == [(100.0, False), (100.0, False)]  # the failure confirmed once
    assert not search.bound_reached


def test_every_ladder_rate_passing_reaches_the_bound() -> None:
    search = run_search(lambda rate: 1.0, LADDER)
    assert search.slo_rps == 1300.0
    assert search.bound_reached
    assert len(search.steps) == len(LADDER)


def test_the_step_budget_bounds_the_search() -> None:
    search = run_search(knee(700.0), LADDER, tolerance=1e-6, max_steps=8)
    assert len(search.steps) == 8
    assert search.budget_spent and search.next_rate() is None
    assert search.slo_rps is not None and search.slo_rps < 700.0


def test_a_noisy_failure_is_confirmed_and_a_pass_wins() -> None:
    """Load from elsewhere fails 450 once; measured again it passes and the sweep goes on."""
    search = SloSearch(LADDER, 0.05, 12)
    for rate, ok in ((100.0, True), (250.0, True), (450.0, False)):
        search.record(rate, ok)
    assert search.next_step() == (450.0, "confirm")
    search.record(450.0, True)
    assert search.first_fail is None and search.slo_rps == 450.0
    assert search.next_step() == (650.0, "sweep")


def test_phases_of_a_search() -> None:
    search = SloSearch([100.0, 200.0], 0.05, 12)
    assert search.next_step() == (100.0, "sweep")
    search.record(100.0, True)
    search.record(200.0, False)
    assert search.next_step() == (200.0, "confirm")
    search.record(200.0, False)
    rate, phase = search.next_step() or (0.0, "")
    assert phase == "refine" and rate == pytest.approx(math.sqrt(100.0 * 200.0))


def test_without_confirmations_one_failure_ends_the_sweep() -> None:
    search = run_search(lambda rate: 60.0, LADDER, confirmations=0)
    assert search.steps == [(100.0, False)]


def test_a_noisy_pass_above_a_failure_does_not_count() -> None:
    """A curve that fails at 450 but passes again at 500 (noise): the answer stays below the
    lowest failure."""
    search = SloSearch(LADDER, 0.05, 12)
    for rate, ok in ((100.0, True), (250.0, True), (450.0, False), (335.0, True), (500.0, True)):
        search.record(rate, ok)
    assert search.first_fail == 450.0
    assert search.slo_rps == 335.0


@pytest.mark.parametrize(
    "ladder", [[], [0.0, 1.0], [200.0, 100.0]], ids=["empty", "not positive", "descending"]
)
def test_bad_ladders_are_refused(ladder: list[float]) -> None:
    with pytest.raises(ValueError):
        SloSearch(ladder)


@pytest.mark.parametrize("plan", [QUICK, FULL], ids=["quick", "full"])
def test_plan_ladders_are_ascending_from_the_minimum_rate(plan) -> None:  # type: ignore[no-untyped-def]
    ladder = plan.ladder(10.0)  # a naive setup: its lowest rung is under the minimum rate
    assert ladder == sorted(ladder) and len(set(ladder)) == len(ladder)
    assert ladder[0] == plan.min_rate_rps
    assert plan.ladder(1000.0)[-1] == pytest.approx(1000.0 * plan.ladder_fractions[-1])


@pytest.mark.parametrize(("rate", "seconds"), [(5.0, 5.0), (200.0, 5.0), (500.0, 2.0), (1000.0, 1.0), (3000.0, 1.0)])
def test_quick_steps_last_long_enough_for_their_requests(rate: float, seconds: float) -> None:
    assert QUICK.step_duration(rate) == pytest.approx(seconds)


def test_quick_steps_have_the_arrivals_a_verdict_needs() -> None:
    assert QUICK.min_requests >= MIN_EVIDENCE_ANSWERS
    assert QUICK.step_duration(200.0) * 200.0 >= MIN_EVIDENCE_ANSWERS


def test_a_step_costs_its_warm_in_its_arrivals_and_its_overhead() -> None:
    assert QUICK.warm_in_s > 0  # the start-of-step transient is never counted
    assert QUICK.step_cost(500.0) == pytest.approx(QUICK.warm_in_s + 2.0 + QUICK.step_overhead_s)


# --- the evidence rule -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answered", "late", "planned", "p99", "passed", "reason"),
    [
        # The case: a refine step stopped after ~50 answers, its p99 their maximum.
        # One late request of 1,000 planned is no evidence; the old rule failed it.
        (50, 1, 1000, 40.0, True, "p99 40.0 ms of only 50 answers: no evidence"),
        (1000, 10, 1000, 24.0, True, ""),  # 1 % late: the p99 is still within
        (1000, 11, 1000, 26.0, False, "11 late of 1000 planned (> 1%)"),
        (60, 11, 1000, 40.0, False, "11 late of 1000 planned (> 1%)"),  # stopped early, on evidence
        (1200, 11, 1200, 30.0, False, "p99 30.0 ms > 25 ms"),  # 1,000+ answers: the p99 decides
        (300, 4, 300, 30.0, False, "4 late of 300 planned (> 1%)"),  # a short step: 1 % is 3
    ],
)
def test_a_step_fails_only_on_evidence(answered: int, late: int, planned: int, p99: float,
                                       passed: bool, reason: str) -> None:
    verdict = judge(p99_ms=p99, errors=0, schedule_kept=True, slo_ms=SLO_MS, answered=answered,
                    late=late, planned=planned)
    assert (verdict.passed, verdict.reason) == (passed, reason)


def test_errors_fail_a_step_whatever_the_counts() -> None:
    verdict = judge(p99_ms=5.0, errors=1, schedule_kept=True, slo_ms=SLO_MS, answered=2000, late=0,
                    planned=2000)
    assert not verdict.passed


def test_the_late_budget_is_one_percent_of_the_planned_arrivals() -> None:
    assert late_budget(1000) == 10.0 and late_budget(0) == 0.0


# --- repeats: median and spread ------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "median", "low", "high", "wide"),
    [
        ([1000.0, 1100.0, 1050.0], 1050.0, 1000.0, 1100.0, False),  # 9.5 %
        ([800.0, 1000.0, 1000.0], 1000.0, 800.0, 1000.0, True),  # 20 %
        ([None, 300.0, 310.0], 305.0, 300.0, 310.0, True),  # one passed no rate: left out, flagged
        ([494.0, None], 494.0, 494.0, 494.0, True),  # not 247, the median of 494 and 0
        ([None, None, None], 0.0, 0.0, 0.0, False),
        ([500.0, 600.0], 550.0, 500.0, 600.0, True),
        ([700.0], 700.0, 700.0, 700.0, False),
    ],
)
def test_median_and_spread_of_the_searches(values: list[float | None], median: float, low: float,
                                           high: float, wide: bool) -> None:
    sp = spread(values)
    assert (sp.median, sp.low, sp.high, sp.wide) == (pytest.approx(median), low, high, wide)
    answered = [v for v in values if v is not None]
    assert sp.unanswered == (len(values) - len(answered) if answered else 0)  # never met: 0 is the answer
    assert sp.values == tuple(0.0 if v is None else v for v in values)


def test_a_spread_of_fifteen_percent_is_not_flagged() -> None:
    assert not spread([850.0, 1000.0, 1000.0]).wide and spread([849.0, 1000.0, 1000.0]).wide


def test_spread_needs_a_search() -> None:
    with pytest.raises(ValueError):
        spread([])


def test_repeats_start_at_the_first_answer() -> None:
    assert repeat_ladder(1000.04, [100.0, 500.0]) == [1000.0]
    assert repeat_ladder(None, [500.0, 100.0]) == [100.0, 500.0]  # never met: as the first


def staircase(first: float, passes: Callable[[float], bool], steps: int = 4) -> SloSearch:
    """A repeat as the runner makes it (bench.plan: 10 % steps, 3 % tolerance, no confirmation)."""
    search = SloSearch(repeat_ladder(first, [first]), 0.03, steps, confirmations=0, descend=0.9,
                       min_rate=5.0, extend=1.1)
    while (step := search.next_step()) is not None:
        search.record(step[0], passes(step[0]))
    return search


@pytest.mark.parametrize("truth", [640.0, 900.0, 1040.0, 1180.0, 1400.0])
def test_a_repeat_ends_near_the_truth_above_or_below_the_first_answer(truth: float) -> None:
    """The first search said 1,000; the setup passes up to `truth`. A repeat is a measurement
    of its own: it is not held to a ladder around 1,000."""
    search = staircase(1000.0, lambda rate: rate <= truth, steps=8)
    assert search.slo_rps is not None
    assert 0.9 * truth <= search.slo_rps <= truth
    if search.first_fail is not None and search.first_fail > truth:
        assert search.first_fail / search.slo_rps - 1 <= 0.1


def test_a_repeat_refines_to_three_percent_in_four_steps_near_the_first_answer() -> None:
    search = staircase(1000.0, lambda rate: rate <= 1070.0)
    rates = [r for r, _ in search.steps]
    assert rates[:2] == [1000.0, 1100.0]  # up after the pass, then bisection below the failure
    assert len(rates) == 4 and search.slo_rps is not None
    assert 1070.0 / 1.03 <= search.slo_rps <= 1070.0


def test_a_repeat_far_above_the_truth_descends_in_growing_steps() -> None:
    """BentoML after a search that overloaded it: it fails well below the first's answer."""
    search = staircase(1000.0, lambda rate: rate <= 500.0)
    assert [r for r, _ in search.steps][:3] == [1000.0, 900.0, 729.0]  # x0.9, then x0.81
    assert search.slo_rps is not None and search.slo_rps >= 0.9 * 500.0 / 1.1


def test_a_repeat_that_never_fails_is_a_lower_bound() -> None:
    search = staircase(1000.0, lambda rate: True)
    assert [r for r, _ in search.steps] == [1000.0, 1100.0, 1210.0, 1331.0]
    assert search.bound_reached and search.slo_rps == 1331.0


def test_the_first_search_goes_past_its_ladder_while_it_passes() -> None:
    search = SloSearch([100.0, 200.0], 0.05, 8, extend=1.5)
    while (step := search.next_step()) is not None:
        search.record(step[0], step[0] <= 500.0)
    rates = [r for r, _ in search.steps]
    assert rates[:5] == [100.0, 200.0, 300.0, 450.0, 675.0]
    assert [p for r, p in search.steps if r == 675.0] == [False, False]  # the failure confirmed
    assert search.slo_rps is not None and 450.0 <= search.slo_rps <= 500.0
    assert not search.bound_reached


# --- the SLO per workload --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("p50", "slo"),
    [
        (0.56, 25.0),  # fraud with AVX-512: the floor
        (2.6, 30.0),  # 26 rounded up to 5 ms
        (3.82, 40.0),  # fraud's tuned p50 without AVX-512 (the run)
        (16.0, 160.0),  # the transformer without AVX-512: measurable, where 25 ms was not
        (2.5, 25.0),
        (2.5000001, 30.0),
    ],
)
def test_the_slo_is_derived_from_the_tuned_setups_unloaded_p50(p50: float, slo: float) -> None:
    assert derived_slo_ms(p50) == slo


@pytest.mark.parametrize("p50", [0.0, -1.0, math.inf, math.nan])
def test_a_derived_slo_needs_a_measured_p50(p50: float) -> None:
    with pytest.raises(ValueError):
        derived_slo_ms(p50)


def test_a_repeat_whose_first_rate_fails_descends_to_an_answer() -> None:
    search = SloSearch([800.0, 900.0], tolerance=0.1, max_steps=8, descend=0.6, min_rate=5.0)
    while (step := search.next_step()) is not None:
        rate, _ = step
        search.record(rate, rate <= 500.0)  # slower now than when the first search ran
    phases = [rate for rate, _ in search.steps]
    assert phases[:3] == [800.0, 800.0, 480.0]  # measured, confirmed, then 0.6x
    assert search.slo_rps is not None and 450.0 <= search.slo_rps <= 500.0


def test_a_descent_step_at_most_halves_the_failed_rate() -> None:
    """BentoML's first search: 374 RPS failed twice, then 225, then 81 by a hair; squared
    without a floor the next step was 10.5 RPS and the search ended there, at a seventh of it."""
    search = SloSearch([374.0], tolerance=0.05, max_steps=12, descend=0.6, min_rate=1.0)
    while (step := search.next_step()) is not None:
        search.record(step[0], step[0] <= 60.0)
    rates = [rate for rate, _ in search.steps]
    assert rates[:5] == [374.0, 374.0, 224.4, 112.2, 56.1]  # x0.6, then x0.5 (0.36 floored), x0.5
    assert all(b >= 0.5 * a for a, b in zip(rates, rates[1:], strict=False))
    assert search.slo_rps is not None and 60.0 / 1.05 <= search.slo_rps <= 60.0


def test_without_descent_a_failed_lowest_rate_is_never_met() -> None:
    search = SloSearch([800.0], tolerance=0.1, max_steps=8)
    while (step := search.next_step()) is not None:
        search.record(step[0], False)
    assert search.slo_rps is None and len(search.steps) == 2


def test_the_time_budget_is_shared_among_the_jobs_left() -> None:
    from bench.runner import Budget

    budget = Budget(total_s=720.0, started=0.0)
    assert budget.left(120.0) == 600.0
    # 600 s left, 100 s set aside for memory runs, 5 jobs to go, each 20 s to start: 400 s
    # of search time, 80 s each; this job's deadline is its own start plus its share.
    assert budget.job_deadline(120.0, [20.0] * 5, reserve_s=100.0) == pytest.approx(220.0)
    # A peer that starts slowly gets its longer start on top of the same share.
    assert budget.job_deadline(120.0, [60.0, 20.0], reserve_s=100.0) == pytest.approx(120 + 60 + 210)
    assert budget.job_deadline(800.0, [20.0] * 2, reserve_s=0.0) == 800.0  # spent: no time at all
    # Less left than the starts need: never past what is left.
    assert budget.job_deadline(700.0, [20.0] * 3, reserve_s=0.0) == pytest.approx(720.0)
    assert Budget(None, 0.0).job_deadline(5.0, [20.0] * 3, 10.0) == float("inf")


def test_a_jobs_time_is_shared_among_its_searches_left() -> None:
    from bench.runner import Budget

    # 90 s of the job left, 3 searches to go: 30 s for this one; the last gets the rest.
    assert Budget.search_deadline(10.0, 100.0, 3) == pytest.approx(40.0)
    # The first of 3 climbs the whole ladder: twice a repeat's share, half of the job's time.
    assert Budget.search_deadline(10.0, 100.0, 3, first=True) == pytest.approx(55.0)
    assert Budget.search_deadline(70.0, 100.0, 1) == pytest.approx(100.0)
    assert Budget.search_deadline(120.0, 100.0, 2) == 120.0  # past the job's deadline
    assert Budget.search_deadline(5.0, float("inf"), 3) == float("inf")


def test_the_budget_sets_aside_each_jobs_start_and_the_memory_starts_it_will_need(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from bench.results import MemoryRun, SetupResult
    from bench.runner import JOB_SLACK_S, MEMORY_SNAPSHOT_S, MODEL_COST_S, Environment, Job, Runner
    from bench.setups import NAIVE, TUNED, all_setups
    from bench.workload import FRAUD, WORKLOADS

    env = Environment(run_dir=tmp_path, pool=tmp_path / "pool", probe=b"{}", server_cpus=(0,), load_cpus=(1,))
    runner = Runner(QUICK, env, lambda _: None)
    split = next(s for s in all_setups() if s.column == "split" and s.headline)
    ray = next(s for s in all_setups() if s.name == "ray-serve")
    after = QUICK.memory_warmup_s + MEMORY_SNAPSHOT_S
    # Tuned's 1 worker is measured at its throughput start: one fresh start (4 workers) to come.
    assert runner._memory_reserve(Job(FRAUD, TUNED, memory=True)) == pytest.approx(TUNED.start_estimate_s(4) + after)
    # Naive starts with 3 workers: both counts are fresh starts, 4 workers' the longer.
    assert runner._memory_reserve(Job(FRAUD, NAIVE, memory=True)) == pytest.approx(
        NAIVE.start_estimate_s(1) + NAIVE.start_estimate_s(4) + 2 * after)
    assert NAIVE.start_estimate_s(4) > 3 * TUNED.start_estimate_s(4) / 2
    # A split's own count is known once it started: both before, then only what is missing.
    job = Job(FRAUD, split, memory=True)
    both = split.start_estimate_s(1) + split.start_estimate_s(4) + 2 * after
    assert runner._memory_reserve(job) == pytest.approx(both)
    ran = SetupResult("split", "fraud", "split", "", status="ok")
    ran.memory.append(MemoryRun(1, [], []))
    assert runner._memory_reserve(job, ran) == pytest.approx(split.start_estimate_s(4) + after)
    ran.status = "failed"
    assert runner._memory_reserve(job, ran) == 0.0
    plain = runner._job_overhead(Job(FRAUD, TUNED), first=False)
    assert plain == pytest.approx(TUNED.start_estimate_s(1) + 2 * QUICK.warmup_s + QUICK.unloaded_s + JOB_SLACK_S)
    # Ray's local cluster starts slowly; a job with memory at its start measures it there.
    assert runner._job_overhead(Job(FRAUD, ray), first=False) - plain == pytest.approx(
        ray.start_estimate_s(1) - TUNED.start_estimate_s(1))
    assert runner._job_overhead(Job(FRAUD, TUNED, memory=True), first=False) - plain == pytest.approx(after)
    heavy = WORKLOADS["fraud-transformer"]
    assert runner._job_overhead(Job(heavy, TUNED), first=True) - plain == pytest.approx(MODEL_COST_S)
    assert runner._job_overhead(Job(heavy, TUNED), first=False) == pytest.approx(plain)


def test_the_search_time_is_shared_by_what_each_jobs_steps_cost(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from bench.runner import Budget, Environment, Job, Runner
    from bench.setups import TUNED
    from bench.workload import FRAUD, WORKLOADS

    # 400 s of search for two jobs whose steps cost 3 s and 7 s: 120 s and 280 s.
    budget = Budget(total_s=720.0, started=0.0)
    assert budget.job_deadline(120.0, [20.0, 20.0], reserve_s=160.0, weights=[3.0, 7.0]) == pytest.approx(
        120 + 20 + 120)
    env = Environment(run_dir=tmp_path, pool=tmp_path / "pool", probe=b"{}", server_cpus=(0,), load_cpus=(1,))
    runner = Runner(QUICK, env, lambda _: None)
    heavy = WORKLOADS["fraud-transformer"]
    # Before any job of a workload has run its steps are taken to be the longest.
    assert runner._step_weight(Job(FRAUD, TUNED)) == pytest.approx(QUICK.step_cost(QUICK.min_rate_rps))
    runner._closed_rps["fraud"] = 2000.0  # its first rung, 1,000 RPS: 1 s of arrivals
    assert runner._step_weight(Job(FRAUD, TUNED)) == pytest.approx(QUICK.warm_in_s + 1.0 + QUICK.step_overhead_s)
    longest = QUICK.warm_in_s + QUICK.step_max_s + QUICK.step_overhead_s
    assert runner._step_weight(Job(heavy, TUNED)) == pytest.approx(longest)


@pytest.mark.parametrize(("slo", "own_p50", "relaxed"), [
    (25.0, None, 100.0),  # 4 x the workload's SLO
    (25.0, 9.0, 100.0),   # its own derived SLO (90 ms) is below that
    (25.0, 75.2, 755.0),  # naive without AVX-512: 10 x its own p50, rounded up to 5 ms
    (130.0, 60.0, 600.0),
])
def test_the_relaxed_slo_is_4x_the_workloads_or_the_setups_own_derived_one(
    slo: float, own_p50: float | None, relaxed: float
) -> None:
    assert relaxed_slo_ms(slo, own_p50) == relaxed


def test_the_relaxed_slo_rejects_what_is_not_a_time() -> None:
    for slo, own in ((0.0, None), (float("nan"), None), (25.0, -1.0)):
        with pytest.raises(ValueError):
            relaxed_slo_ms(slo, own)



def test_a_jobs_share_is_planned_again_by_its_own_steps_after_its_warm_up(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from bench.runner import Budget, Environment, Job, Runner
    from bench.setups import TUNED
    from bench.workload import FRAUD

    env = Environment(run_dir=tmp_path, pool=tmp_path / "pool", probe=b"{}", server_cpus=(0,), load_cpus=(1,))
    runner = Runner(QUICK, env, lambda _: None)
    runner.budget = Budget(total_s=1000.0, started=time.monotonic())
    runner._closed_rps["fraud"] = 2000.0  # the workload's steps: 1 s of arrivals at 1,000 RPS
    runner._after = [(Job(FRAUD, TUNED), 0.0)]
    runner._share_by_own_steps(closed_rps=2000.0)
    even = runner._deadline - time.monotonic()
    runner._share_by_own_steps(closed_rps=10.0)  # naive's: 5 RPS steps, 5 s of arrivals each
    slow = runner._deadline - time.monotonic()
    assert even == pytest.approx(500.0, abs=1.0)
    naive_share = QUICK.step_cost(5.0) / (QUICK.step_cost(5.0) + QUICK.step_cost(1000.0))
    assert slow == pytest.approx(1000.0 * naive_share, abs=1.0)
