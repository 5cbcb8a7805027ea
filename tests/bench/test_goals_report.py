"""The targets (table-driven, synthetic results), the results.json schema, and the report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.goals import evaluate
from bench.memory import ProcessMemory
from bench.report import markdown_report, notes, slo_table, write_outputs
from bench.results import (
    CURVE_KEYS,
    RECORD_KEYS,
    BenchResults,
    CpuUse,
    CurvePoint,
    MemoryRun,
    SetupResult,
)

CPU = CpuUse(setup_cores=0.9, by_role={"api worker": 0.9}, load_generator_cores=0.2,
             other_cores=0.0)
ISSUE_CURVE_KEYS = ("offered_rps", "achieved_rps", "p50_ms", "p99_ms", "p999_ms", "max_ms",
                    "errors")


def point(rate: float, p50: float, p99: float, *, phase: str = "sweep", slo_ms: float = 25.0,
          errors: int = 0, cpu: CpuUse = CPU, stopped: str = "") -> CurvePoint:
    passed = errors == 0 and p99 <= slo_ms
    return CurvePoint(
        offered_rps=rate, achieved_rps=rate, p50_ms=p50, p99_ms=p99, p999_ms=p99 * 1.2,
        max_ms=p99 * 1.5, errors=errors, phase=phase, passed=passed,
        verdict="" if passed else "p99 over", duration_s=2.5, requests=int(rate * 2.5),
        schedule_kept=True, stopped_early=stopped, generator_lag_p99_ms=0.01,
        generator_busy_cores=0.05, cpu=cpu,
    )


def setup(name: str, slo_rps: float | None, *, workload: str = "fraud", column: str = "",
          headline: bool = False, curve: list[CurvePoint] | None = None,
          pss: tuple[float, float] | None = None) -> SetupResult:
    result = SetupResult(name, workload, column or name.split("-")[0], f"the {name} setup",
                         headline=headline, status="ok", slo_rps=slo_rps, workers=1,
                         closed_loop_rps=(slo_rps or 10.0) * 1.3)
    result.latency_curve = curve if curve is not None else (
        [point(slo_rps, 2.0, 20.0)] if slo_rps else [point(10.0, 40.0, 60.0)]
    )
    if pss:
        for workers, mb in zip((1, 4), pss, strict=True):
            result.memory.append(MemoryRun(workers, [ProcessMemory(1, "api", mb, mb * 2)]))
    return result


def run(*, split_rps: float = 1400.0, tuned_rps: float = 650.0, ceiling_rps: float = 2000.0,
        split_p99_at_tuned: float = 8.0, split_p50_low: float = 2.5,
        heavy: tuple[float | None, float | None] = (800.0, 150.0),
        split_pss: tuple[float, float] = (600.0, 650.0)) -> BenchResults:
    """A run shaped like the quick plan's; every rate and latency set by the caller."""
    tuned = setup("tuned", tuned_rps, curve=[
        point(0.1 * tuned_rps, 2.0, 4.0, phase="reference"), point(tuned_rps, 4.0, 20.0)],
        pss=(800.0, 900.0))
    split = setup("split", split_rps, headline=True, curve=[
        point(split_rps, 3.0, 22.0), point(tuned_rps, 2.0, split_p99_at_tuned, phase="reference"),
        point(0.1 * tuned_rps, split_p50_low, 5.0, phase="reference")], pss=split_pss)
    heavy_split, heavy_tuned = heavy
    return BenchResults(meta={"slo_ms": 25.0, "mode": "test"}, setups=[
        setup("ceiling", ceiling_rps, pss=(60.0, 110.0)),
        setup("naive", None, pss=(1000.0, 2000.0)),
        tuned,
        split,
        setup("split-coalescing", 2 * split_rps, column="split"),
        setup("tuned", heavy_tuned, workload="fraud-transformer"),
        setup("split", heavy_split, workload="fraud-transformer", headline=True),
    ])


def held(results: BenchResults) -> dict[str, bool | None]:
    return {g.name: g.held for g in evaluate(results)}


@pytest.mark.parametrize(
    ("split_rps", "vs_tuned", "vs_ceiling"),
    [(1400.0, True, True), (1200.0, False, True), (1300.0, True, True), (1100.0, False, False)],
)
def test_slo_rps_targets(split_rps: float, vs_tuned: bool, vs_ceiling: bool) -> None:
    goals = held(run(split_rps=split_rps))
    assert (goals["SLO-RPS vs tuned"], goals["SLO-RPS vs ceiling"]) == (vs_tuned, vs_ceiling)


def test_the_headline_split_is_judged_not_the_fastest_variant() -> None:
    results = run(split_rps=1000.0)  # split-coalescing has 2,000
    goals = {g.name: g for g in evaluate(results)}
    assert goals["SLO-RPS vs tuned"].held is False
    assert goals["SLO-RPS vs tuned"].measured.startswith("1,000.0 / 650.0")


@pytest.mark.parametrize(("p99", "expected"), [(10.0, True), (10.5, False)])
def test_tail_at_tuned_slo_rps(p99: float, expected: bool) -> None:
    assert held(run(split_p99_at_tuned=p99))["tail at tuned's SLO-RPS"] is expected


@pytest.mark.parametrize(("p50", "expected"), [(3.0, True), (3.01, False)])
def test_median_at_low_load(p50: float, expected: bool) -> None:
    assert held(run(split_p50_low=p50))["median at low load"] is expected  # tuned p50 2.0


@pytest.mark.parametrize(
    ("heavy", "expected"),
    [((600.0, 150.0), True), ((590.0, 150.0), False), ((None, 150.0), False), ((600.0, None), None)],
)
def test_heavier_model_target(heavy: tuple[float | None, float | None], expected: bool | None) -> None:
    assert held(run(heavy=heavy))["heavier model"] is expected


@pytest.mark.parametrize(
    ("split_pss", "expected"),
    [
        ((500.0, 600.0), {"memory vs naive @1w": True, "memory vs tuned @1w": True,
                          "memory vs naive @4w": True, "memory vs tuned @4w": True,
                          "memory per worker": True}),
        ((720.0, 820.0), {"memory vs naive @1w": False, "memory vs tuned @1w": True,
                          "memory vs tuned @4w": False, "memory per worker": True}),
        ((500.0, 650.0), {"memory per worker": False}),  # 50 MB per added worker
    ],
)
def test_memory_targets(split_pss: tuple[float, float], expected: dict[str, bool]) -> None:
    goals = held(run(split_pss=split_pss))
    assert {k: goals[k] for k in expected} == expected


def test_nothing_is_held_that_was_not_measured() -> None:
    results = run()
    results.setups = [s for s in results.setups if s.name != "split" or s.workload != "fraud"]
    goals = {g.name: g for g in evaluate(results)}
    for name in ("SLO-RPS vs tuned", "tail at tuned's SLO-RPS", "median at low load",
                 "memory vs naive @1w", "memory per worker"):
        assert goals[name].held is None and "split: not run" in goals[name].note


def test_a_tuned_that_never_meets_the_slo_leaves_the_ratio_unmeasured() -> None:
    goals = {g.name: g for g in evaluate(run(tuned_rps=0.0))}
    assert goals["SLO-RPS vs tuned"].held is None


def test_results_json_schema(tmp_path: Path) -> None:
    results = run()
    results.goals = evaluate(results)
    run_dir = tmp_path / "20261201T000000Z"
    run_dir.mkdir()
    outputs = write_outputs(results, run_dir)
    assert set(outputs) == {"results.json", "report.md", "slo_curves.png", "memory.png"}
    data = json.loads(outputs["results.json"].read_text())
    assert set(data) == {"meta", "setups", "goals"}
    for record in data["setups"]:
        assert tuple(record) == RECORD_KEYS
        assert record["workload"] in ("fraud", "fraud-transformer")
        assert record["slo_ms"] == 25.0
        assert record["slo_rps"] is None or isinstance(record["slo_rps"], float)
        rates = [p["offered_rps"] for p in record["latency_curve"]]
        assert rates == sorted(rates) and rates
        for p in record["latency_curve"]:
            assert tuple(p) == CURVE_KEYS
            assert all(isinstance(p[k], (int, float)) for k in ISSUE_CURVE_KEYS)
    naive = next(r for r in data["setups"] if r["name"] == "naive")
    assert naive["slo_rps"] is None
    split = next(r for r in data["setups"] if r["name"] == "split" and r["workload"] == "fraud")
    assert split["headline"] is True and split["memory"][1]["pss_mb"] == 650.0
    assert {g["name"] for g in data["goals"]} >= {"SLO-RPS vs tuned", "heavier model"}
    assert (tmp_path / "latest").resolve() == run_dir.resolve()


def test_report_tables_name_the_headline_and_unmet_slos() -> None:
    results = run()
    results.goals = evaluate(results)
    table = slo_table(results)
    assert "| fraud | split | headline (product default) | 1,400 | 3.0 / 22.0 |" in table
    assert "| fraud | split-coalescing | variant | 2,800 |" in table
    assert "| fraud | naive | naive | never met |" in table
    report = markdown_report(results)
    assert "![p50 and p99 against offered load](slo_curves.png)" in report
    assert "## Targets" in report and "heavier model" in report


def test_busy_machine_and_early_stops_are_noted() -> None:
    results = run()
    busy = CpuUse(setup_cores=0.5, by_role={}, load_generator_cores=0.1, other_cores=0.9)
    results.setups[2].latency_curve.append(point(900.0, 30.0, 80.0, cpu=busy, phase="refine",
                                                 stopped="p99 above the SLO"))
    results.setups[3].status, results.setups[3].reason = "failed", "serving exited"
    found = notes(results)
    assert any("more than 0.25 cores during 1 of" in n for n in found)
    assert "fraud/split: failed: serving exited" in found
    assert "stopped early: p99 above the SLO; lower bounds" in markdown_report(results)
