"""The targets (table-driven, synthetic results), the results.json schema, and the report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.goals import evaluate, one_cpu_limit
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
        late=0 if passed else int(rate * 0.1), schedule_kept=True, stopped_early=stopped, generator_lag_p99_ms=0.01,
        generator_busy_cores=0.05, cpu=cpu,
    )


def setup(name: str, slo_rps: float | None, *, workload: str = "fraud", column: str = "",
          headline: bool = False, curve: list[CurvePoint] | None = None,
          pss: tuple[float, float] | None = None) -> SetupResult:
    result = SetupResult(name, workload, column or name.split("-")[0], f"the {name} setup",
                         headline=headline, status="ok", slo_rps=slo_rps, workers=1,
                         closed_loop_rps=(slo_rps or 10.0) * 1.3, searches=[slo_rps])
    result.latency_curve = curve if curve is not None else (
        [point(slo_rps, 2.0, 20.0)] if slo_rps else [point(10.0, 40.0, 60.0)]
    )
    if pss:
        for workers, mb in zip((1, 4), pss, strict=True):
            result.memory.append(MemoryRun(workers, [ProcessMemory(1, "api", mb, mb * 2)]))
    return result


def run(*, split_rps: float = 1400.0, tuned_rps: float = 650.0, ceiling_rps: float = 1800.0,
        split_p99_at_tuned: float = 8.0, split_p50_low: float = 2.3,
        heavy: tuple[float | None, float | None] = (800.0, 150.0),
        split_pss: tuple[float, float] = (600.0, 650.0),
        peers: tuple[float, float] = (500.0, 400.0),
        peer_pss_at_4: tuple[float, float] = (1200.0, 1800.0)) -> BenchResults:
    """A run shaped like the quick plan's; every rate and latency set by the caller."""
    tuned = setup("tuned", tuned_rps, curve=[
        point(0.1 * tuned_rps, 2.0, 4.0, phase="reference"), point(tuned_rps, 4.0, 20.0)],
        pss=(800.0, 900.0))
    split = setup("split", split_rps, headline=True, curve=[
        point(split_rps, 3.0, 22.0), point(tuned_rps, 2.0, split_p99_at_tuned, phase="reference"),
        point(0.1 * tuned_rps, split_p50_low, 5.0, phase="reference")], pss=split_pss)
    heavy_split, heavy_tuned = heavy
    bento_pss, ray_pss = peer_pss_at_4
    return BenchResults(meta={"slo_ms": None, "mode": "test", "slo": {
        "fraud": {"slo_ms": 25.0, "how": "test"}, "fraud-transformer": {"slo_ms": 40.0, "how": "test"}},
        "model_cost": {"fraud-transformer": {"batch_ms": {"1": 2.6, "8": 6.4, "16": 12.0, "32": 33.0}}}},
        setups=[
        setup("ceiling", ceiling_rps, pss=(60.0, 110.0)),
        setup("naive", None, pss=(1000.0, 2000.0)),
        tuned,
        split,
        setup("split-coalescing", 2 * split_rps, column="split"),
        setup("bentoml", 900.0, column="peer", pss=(700.0, bento_pss)),
        setup("ray-serve", 700.0, column="peer", pss=(1100.0, ray_pss)),
        setup("tuned", heavy_tuned, workload="fraud-transformer"),
        setup("split", heavy_split, workload="fraud-transformer", headline=True),
        setup("bentoml", peers[0], workload="fraud-transformer", column="peer"),
        setup("ray-serve", peers[1], workload="fraud-transformer", column="peer"),
    ])


def held(results: BenchResults) -> dict[str, bool | None]:
    return {g.name: g.held for g in evaluate(results)}


@pytest.mark.parametrize(
    ("split_rps", "tuned_rps", "vs_tuned", "vs_ceiling"),
    [(1400.0, 650.0, True, True), (1350.0, 1400.0, False, True), (1350.0, 1350.0, True, True),
     (1340.0, 650.0, True, False)],  # ceiling 1,800: 0.75x is 1,350
)
def test_slo_rps_targets(split_rps: float, tuned_rps: float, vs_tuned: bool, vs_ceiling: bool) -> None:
    goals = held(run(split_rps=split_rps, tuned_rps=tuned_rps))
    assert (goals["SLO-RPS vs tuned"], goals["SLO-RPS vs ceiling"]) == (vs_tuned, vs_ceiling)


def test_the_headline_split_is_judged_not_the_fastest_variant() -> None:
    results = run(split_rps=600.0)  # split-coalescing has 1,200
    goals = {g.name: g for g in evaluate(results)}
    assert goals["SLO-RPS vs tuned"].held is False
    assert goals["SLO-RPS vs tuned"].measured.startswith("600.0 / 650.0")


@pytest.mark.parametrize(("p50", "expected"), [(2.5, True), (2.51, False)])
def test_median_at_low_load(p50: float, expected: bool) -> None:
    assert held(run(split_p50_low=p50))["median at low load"] is expected  # tuned p50 2.0


@pytest.mark.parametrize(
    ("heavy", "expected"),
    [((375.0, 150.0), True), ((370.0, 150.0), False), ((None, 150.0), False), ((600.0, None), None)],
)
def test_heavier_model_target(heavy: tuple[float | None, float | None], expected: bool | None) -> None:
    assert held(run(heavy=heavy))["heavier model"] is expected


@pytest.mark.parametrize(("peers", "expected"), [((500.0, 400.0), True), ((900.0, 400.0), False)])
def test_heavier_model_against_the_best_peer(peers: tuple[float, float], expected: bool) -> None:
    goals = {g.name: g for g in evaluate(run(peers=peers))}  # split 800
    assert goals["heavier model vs peers"].held is expected
    assert "(bentoml)" in goals["heavier model vs peers"].target


@pytest.mark.parametrize(("peer_pss", "expected"), [((1200.0, 1800.0), True), ((1000.0, 1800.0), False)])
def test_memory_against_the_lightest_peer_at_4_workers(peer_pss: tuple[float, float], expected: bool) -> None:
    goals = {g.name: g for g in evaluate(run(peer_pss_at_4=peer_pss))}  # split 650 at 4
    assert goals["memory vs peers @4w"].held is expected


def test_one_cpu_limit_takes_the_largest_batch_the_slo_allows() -> None:
    costs = {1: 2.6, 8: 6.4, 16: 12.0, 32: 33.0}
    limit = one_cpu_limit(costs, api_ms_per_request=0.3, slo_ms=40.0)
    # 16 rows: one round 12.0 + 16 x 0.3 = 16.8 ms, twice 33.6 <= 40; 32 rows would be 2 x 42.6.
    assert limit is not None and limit.batch == 16
    assert limit.rps == pytest.approx(1000 * 16 / 16.8)
    assert one_cpu_limit(costs, api_ms_per_request=0.3, slo_ms=5.0) is None


def test_the_one_cpu_estimate_is_reported_never_held() -> None:
    goals = {g.name: g for g in evaluate(run())}
    goal = goals["heavier model, 1-CPU limit"]
    assert goal.held is None and "split 800" in goal.measured


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
    for name in ("SLO-RPS vs tuned", "median at low load",
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
        assert record["searches"] == [record["slo_rps"]]
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
    results.setups[3].searches = [1300.0, 1400.0, 1700.0]
    table = slo_table(results)
    assert ("| fraud | 25 ms | split | headline (product default) | 1,400 | **1,300–1,700 (3 searches, 29%) > 15 %** "
            "| 3.0 / 22.0 |") in table
    assert "| fraud | 25 ms | split-coalescing | variant | 2,800 |" in table
    assert "| fraud | 25 ms | naive | naive | never met |" in table
    assert "| fraud | 25 ms | bentoml | peer | 900 |" in table
    assert any("searches disagree by 29%" in n for n in notes(results))
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


def relaxed(result: SetupResult, workload_slo_ms: float = 25.0) -> SetupResult:
    """`result` as the runner leaves a setup that never met the workload's SLO and was
    searched at the relaxed one (bench.slo.relaxed_slo_ms)."""
    result.relaxed_from_ms, result.slo_ms = workload_slo_ms, 4 * workload_slo_ms
    return result


def test_a_figure_at_the_relaxed_slo_is_shown_with_its_slo_and_compared_with_nothing() -> None:
    results = run(peers=(500.0, 400.0))  # split 800 on the heavier model
    ray = results.get("fraud-transformer", "ray-serve")
    assert ray is not None
    ray.slo_rps, ray.searches = 2000.0, [2000.0]  # faster than bentoml, but at 160 ms
    relaxed(ray, 40.0)
    naive = results.get("fraud", "naive")
    assert naive is not None
    naive.slo_rps, naive.searches = 12.0, [12.0]
    naive.latency_curve = [point(12.0, 40.0, 90.0, slo_ms=100.0)]
    relaxed(naive)
    goals = {g.name: g for g in evaluate(results)}
    assert goals["heavier model vs peers"].held is True  # against bentoml's 500, not ray's 2,000
    assert "(bentoml)" in goals["heavier model vs peers"].target
    table = slo_table(results)
    assert "| fraud | 100 ms | naive | naive | never met at 25 ms; at 100 ms: 12 |" in table
    assert "| fraud-transformer | 160 ms | ray-serve | peer | never met at 40 ms; at 160 ms: 2,000 |" in table


def test_a_relaxed_tuned_leaves_the_targets_unmeasured() -> None:
    results = run()
    tuned = results.get("fraud", "tuned")
    assert tuned is not None
    relaxed(tuned)
    goals = held(results)
    assert goals["SLO-RPS vs tuned"] is None and goals["median at low load"] is None


def test_a_search_that_passed_no_rate_is_left_out_of_the_median_and_said_so() -> None:
    results = run()
    split = results.get("fraud", "split")
    assert split is not None
    split.searches = [494.0, None]
    split.slo_rps = split.spread.median if split.spread else None
    assert split.slo_rps == 494.0
    row = next(line for line in slo_table(results).splitlines() if "| fraud | 25 ms | split |" in line)
    assert "494–494 (2 searches, 0%; 1 passed no rate, left out)" in row
