"""A failed step during which the hypervisor took the servers' CPUs is measured again
(`bench.slo.stolen_too_much`, `bench.runner.Runner.step`)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bench.plan import QUICK
from bench.results import BenchResults, CpuUse, CurvePoint, SetupResult
from bench.runner import Environment, Runner
from bench.slo import STOLEN_REMEASURES, STOLEN_SHARE, stolen_too_much


def point(passed: bool, stolen_cores: float) -> CurvePoint:
    return CurvePoint(
        offered_rps=500.0, achieved_rps=500.0, p50_ms=3.0, p99_ms=30.0 if not passed else 10.0,
        p999_ms=40.0, max_ms=45.0, errors=0, phase="sweep", passed=passed,
        verdict="" if passed else "40 late of 1000 planned (> 1%)", duration_s=2.0, requests=1000,
        late=0 if passed else 40, schedule_kept=True, stopped_early="", generator_lag_p99_ms=0.1,
        generator_busy_cores=0.2,
        cpu=CpuUse(setup_cores=0.7, by_role={}, load_generator_cores=0.2, other_cores=0.0,
                   stolen_cores=stolen_cores),
        search=1,
    )


def runner_measuring(tmp_path: Path, points: list[CurvePoint], said: list[str]) -> Runner:
    env = Environment(run_dir=tmp_path, pool=tmp_path / "pool", probe=b"{}", server_cpus=(0,), load_cpus=(1,))
    runner = Runner(QUICK, env, said.append)
    measured: Iterator[CurvePoint] = iter(points)
    runner._measure_step = lambda *_args, **_kwargs: next(measured)  # type: ignore[method-assign]
    return runner


def step(runner: Runner, curve: list[CurvePoint]) -> CurvePoint:
    running: Any = SimpleNamespace(workload=SimpleNamespace(name="fraud"), setup=SimpleNamespace(name="split"))
    load: Any = None  # the measurement is replaced: nothing is sent
    return runner.step(running, load, 500.0, "sweep", curve, search=1)


def test_the_stolen_share_is_the_late_share_per_server_cpu() -> None:
    assert not stolen_too_much(STOLEN_SHARE, 1)
    assert stolen_too_much(STOLEN_SHARE * 1.01, 1)
    assert not stolen_too_much(STOLEN_SHARE * 1.5, 2)  # two CPUs: twice the CPU time to steal from
    assert not stolen_too_much(0.0, 0)


def test_a_failure_with_the_servers_cpus_stolen_is_measured_again(tmp_path: Path) -> None:
    said: list[str] = []
    runner = runner_measuring(tmp_path, [point(False, 0.06), point(True, 0.0)], said)
    curve: list[CurvePoint] = []
    answer = step(runner, curve)
    assert answer.passed and not answer.disturbed
    assert [p.passed for p in curve] == [False, True]
    assert curve[0].disturbed and "6% of a core stolen by the hypervisor: measured again" in curve[0].verdict
    assert any("measured again" in line for line in said)


def test_a_failure_without_steal_and_a_pass_with_it_stand(tmp_path: Path) -> None:
    for first in (point(False, STOLEN_SHARE / 2), point(True, 0.3)):
        curve: list[CurvePoint] = []
        answer = step(runner_measuring(tmp_path, [first], []), curve)
        assert curve == [first] and answer is first


def test_the_measurements_again_are_bounded(tmp_path: Path) -> None:
    stolen = [point(False, 0.2) for _ in range(STOLEN_REMEASURES + 3)]
    curve: list[CurvePoint] = []
    answer = step(runner_measuring(tmp_path, stolen, []), curve)
    assert len(curve) == STOLEN_REMEASURES + 1
    assert not answer.passed and not answer.disturbed  # the last one counts, as measured
    assert all(p.disturbed for p in curve[:-1])


def test_the_report_says_how_much_was_stolen_and_what_was_measured_again() -> None:
    from bench.report import notes

    result = SetupResult("split", "fraud", "split", "", server_cpus=[0])
    disturbed = replace(point(False, 0.06), disturbed=True)
    result.latency_curve = [disturbed, point(True, 0.004), point(True, 0.0)]
    (line,) = [n for n in notes(BenchResults(meta={}, setups=[result])) if "hypervisor" in n]
    assert "during 2 of 3 steps" in line and "in 1 (up to 6% of a core" in line
    assert "1 failed step(s) of those were measured again" in line
