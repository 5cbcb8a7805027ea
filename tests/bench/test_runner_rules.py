"""The runner's rules, with the measurements replaced: a setup whose first search meets the
workload's SLO at no rate is searched again at the relaxed SLO, so that every setup gets a
number (`bench.runner.Runner._search_or_relax`); a memory start is measured with all its
workers up, and records the count of its own snapshot (`Runner._memory`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bench.plan import QUICK
from bench.results import CurvePoint, SetupResult
from bench.runner import Environment, Runner
from bench.slo import relaxed_slo_ms


def measured(rate: float, passed: bool, search: int) -> CurvePoint:
    return CurvePoint(
        offered_rps=rate, achieved_rps=rate, p50_ms=14.0, p99_ms=20.0 if passed else 40.0,
        p999_ms=45.0, max_ms=50.0, errors=0, phase="sweep", passed=passed,
        verdict="" if passed else "3 late of 57 planned (> 1%)", duration_s=5.0, requests=int(rate * 5),
        late=0 if passed else 3, schedule_kept=True, stopped_early="", generator_lag_p99_ms=0.1,
        generator_busy_cores=0.1, search=search,
    )


def runner_where(tmp_path: Path, passes: Callable[[float, float], bool], slos: list[float]) -> Runner:
    """A runner whose steps pass when `passes(rate, slo_ms)`; each step's SLO goes to `slos`."""
    env = Environment(run_dir=tmp_path, pool=tmp_path / "pool", probe=b"{}", server_cpus=(0,), load_cpus=(1,))
    runner = Runner(QUICK, env, lambda _line: None)

    def measure(_running: Any, _load: Any, rate: float, _phase: str, search: int, slo_ms: float) -> CurvePoint:
        slos.append(slo_ms)
        return measured(rate, passes(rate, slo_ms), search)

    runner._measure_step = measure  # type: ignore[method-assign]
    return runner


def search(runner: Runner, unloaded_p50_ms: float, slo_ms: float = 25.0) -> tuple[SetupResult, float]:
    result = SetupResult("ray-serve", "fraud", "peer", "Ray Serve", slo_ms=slo_ms)
    result.unloaded_p50_ms = unloaded_p50_ms
    running: Any = SimpleNamespace(workload=SimpleNamespace(name="fraud"), setup=SimpleNamespace(name="ray-serve"))
    return result, runner._search_or_relax(running, None, result, 160.0, slo_ms)


def test_a_first_search_that_passes_no_rate_is_followed_by_searches_at_the_relaxed_slo(tmp_path: Path) -> None:
    slos: list[float] = []
    # Its p99 is above 25 ms at every rate (its unloaded p50, 10.9 ms, is below it), within 110 ms up to 60 RPS.
    runner = runner_where(tmp_path, lambda rate, slo: slo > 25.0 and rate <= 60.0, slos)
    result, slo = search(runner, unloaded_p50_ms=10.9)
    assert slo == relaxed_slo_ms(25.0, 10.9) == result.slo_ms == 110.0
    assert result.relaxed_from_ms == 25.0
    assert result.slo_rps is not None and 50.0 <= result.slo_rps <= 60.0
    assert len(result.searches) == QUICK.searches and None not in result.searches
    assert result.workload_slo_rps is None  # a figure at the relaxed SLO is compared with nothing
    # The first search's steps, all judged at 25 ms, stay in the curve as probes; the searches
    # at 110 ms are numbered from 1 again.
    probes = [p for p in result.latency_curve if p.phase == "probe"]
    assert probes and all(p.search == 0 and not p.passed for p in probes)
    assert slos[:len(probes)] == [25.0] * len(probes) and set(slos[len(probes):]) == {110.0}
    assert {p.search for p in result.latency_curve if p.phase != "probe"} == {1, 2, 3}
    assert any("searched at the relaxed SLO, 110 ms" in note for note in result.notes)


def test_a_first_search_without_an_answer_in_its_share_of_the_budget_gives_the_rest_to_the_relaxed_slo(
        tmp_path: Path) -> None:
    slos: list[float] = []
    runner = runner_where(tmp_path, lambda rate, slo: slo > 25.0 and rate <= 60.0, slos)
    runner._deadline = time.monotonic() + 10.0  # a 7 s step: the first search's share holds one
    result, slo = search(runner, unloaded_p50_ms=10.9)
    assert slo == 110.0 and result.relaxed_from_ms == 25.0
    # It goes on past its share until it has failed at a quarter of its closed-loop RPS (160)
    # or below (80 RPS, measured again, 48, then 24), and no further.
    probes = [p.offered_rps for p in result.latency_curve if p.phase == "probe"]
    rates = sorted(set(probes))
    assert slos.count(25.0) == len(probes) and rates[0] <= 0.25 * 160.0 < rates[1]
    assert result.slo_rps is not None  # a search without an answer yet goes on: a number


def test_a_first_search_that_failed_only_near_its_closed_loop_rps_descends_before_it_hands_over(
        tmp_path: Path) -> None:
    """The heavier model's split failed its first rung (half its closed-loop RPS) at the
    workload's SLO and was handed over to the relaxed one after that step, though it met
    the workload's SLO lower down."""
    slos: list[float] = []
    runner = runner_where(tmp_path, lambda rate, slo: rate <= 50.0, slos)
    runner._deadline = time.monotonic() + 10.0
    result, slo = search(runner, unloaded_p50_ms=9.2)
    assert slo == 25.0 and result.relaxed_from_ms is None and set(slos) == {25.0}
    assert result.workload_slo_rps is not None and result.workload_slo_rps <= 50.0


def test_a_setup_that_meets_the_workloads_slo_somewhere_is_not_relaxed(tmp_path: Path) -> None:
    slos: list[float] = []
    runner = runner_where(tmp_path, lambda rate, slo: rate <= 30.0, slos)
    result, slo = search(runner, unloaded_p50_ms=10.9)
    assert slo == 25.0 and result.relaxed_from_ms is None and set(slos) == {25.0}
    assert result.workload_slo_rps is not None and result.workload_slo_rps <= 30.0
    assert not any(p.phase == "probe" for p in result.latency_curve)


def test_a_setup_that_meets_no_slo_at_all_ends_without_a_number(tmp_path: Path) -> None:
    slos: list[float] = []
    runner = runner_where(tmp_path, lambda rate, slo: False, slos)
    result, slo = search(runner, unloaded_p50_ms=10.9)
    assert slo == 110.0 and result.slo_rps is None and result.relaxed_from_ms == 25.0
    assert slos.count(25.0) == sum(1 for p in result.latency_curve if p.phase == "probe")


def test_memory_waits_for_the_workers_it_was_started_with_and_counts_its_own_snapshot(
        tmp_path: Path, monkeypatch: Any) -> None:
    """Ready means one worker answers: a split started with 4 API workers counted 2 at ready
    and 3 a second later, and its 4-worker PSS was recorded as 3 workers'."""
    import bench.runner as runner_module
    from bench.memory import ProcessMemory, TreeMemory

    class Starting:
        """A split whose API workers come up one per look at its process tree, up to 4."""

        setup = SimpleNamespace(name="split")
        workload = SimpleNamespace(name="fraud")
        looks = 0

        @property
        def workers(self) -> int:
            self.looks += 1
            return min(4, 1 + self.looks)

        def pids(self) -> list[int]:
            return list(range(10, 10 + min(4, 1 + self.looks)))

        def roles(self) -> dict[int, str]:
            return {pid: "api worker" for pid in self.pids()}

    running = Starting()
    monkeypatch.setattr(runner_module, "run_closed_loop", lambda *_a, **_k: None)
    ticks = iter(range(1, 100))  # each look at the CPU ticks: every worker has used more
    monkeypatch.setattr(runner_module, "tree_cpu_ticks", lambda pids: dict.fromkeys(pids, next(ticks)))
    monkeypatch.setattr(runner_module, "tree_memory", lambda pids, roles: TreeMemory(
        [ProcessMemory(pid, roles[pid], 26.0, 40.0) for pid in pids]))
    env = Environment(run_dir=tmp_path, pool=tmp_path / "pool", probe=b"{}", server_cpus=(0,), load_cpus=(1,))
    runner = Runner(QUICK, env, lambda _line: None)
    monkeypatch.setattr(runner, "wait_idle", lambda _running: True)
    monkeypatch.setattr(runner, "load_settings", lambda _running: None)
    run: Any = runner._memory(running, workers=4)  # type: ignore[arg-type]
    assert run.workers == 4 and len(run.processes) == 4 and run.notes == []
