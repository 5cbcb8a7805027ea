"""Goal checks (table-driven) and the report: markdown tables, plots, results.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.goals import evaluate
from bench.load import (
    ClosedLoopResult,
    FixedRateResult,
    LatencySummary,
    WrkErrors,
    WrkSummary,
    fixed_rate_result,
    parse_paced_counters,
    parse_wrk,
    read_latency_file,
)
from bench.memory import ProcessMemory
from bench.report import change, markdown_report, write_outputs
from bench.results import (
    BenchResults,
    CpuUse,
    FixedRateRun,
    MemoryRun,
    SaturationRun,
    SetupResult,
)

DATA = Path(__file__).parent / "data"
CPU = CpuUse(
    setup_cores=0.9, by_role={"api worker": 0.9}, load_generator_cores=0.2, other_cores=0.0
)


def saturation(rps: float, status_errors: int = 0) -> SaturationRun:
    duration = 10.0
    summary = WrkSummary(
        requests=int(rps * duration) + status_errors,
        duration_s=duration,
        rps=rps + status_errors / duration,
        latency_avg_ms=5.0,
        latency_stdev_ms=1.0,
        latency_max_ms=20.0,
        percentiles_ms={"50": 4.0, "99": 15.0},
        errors=WrkErrors(status=status_errors),
    )
    return SaturationRun(ClosedLoopResult(32, summary, 0.2), CPU)


def paced(offered: float, p99_ms: float, *, kept: bool = True) -> FixedRateResult:
    duration = 5.0
    sent = int(offered * duration) if kept else int(offered * duration * 0.5)
    return FixedRateResult(
        offered_rps=offered,
        connections=64,
        duration_s=duration,
        planned=int(offered * duration),
        sent=sent,
        ok=sent,
        achieved_rps=sent / duration,
        latency=LatencySummary(
            count=sent,
            avg_ms=p99_ms / 3,
            p50_ms=p99_ms / 4,
            p90_ms=p99_ms / 2,
            p99_ms=p99_ms,
            p999_ms=p99_ms * 1.5,
            max_ms=p99_ms * 2,
        ),
        errors=WrkErrors(),
        in_flight_at_end=0,
        early=0,
        load_cpu_cores=0.2,
    )


def setup(
    name: str,
    column: str,
    rps: float,
    *,
    ref_p99: float | None = None,
    kept: bool = True,
    pss: tuple[float, float] | None = None,
) -> SetupResult:
    result = SetupResult(name, column, f"{name} setup", status="ok", workers=1)
    result.saturation = saturation(rps)
    own = paced(0.8 * rps, 9.0)
    result.fixed_rate.append(FixedRateRun("80% of own saturation", 0.8, False, own, CPU))
    if ref_p99 is not None:
        ref = paced(1000.0, ref_p99, kept=kept)
        result.fixed_rate.append(FixedRateRun("reference", None, True, ref, CPU))
    if pss is not None:
        for workers, mb in zip((1, 4), pss, strict=True):
            result.memory.append(MemoryRun(workers, [ProcessMemory(1, "api", mb, mb * 2)]))
    return result


def results(
    split_rps: float = 3000.0,
    *,
    split_p99: float = 10.0,
    kept: bool = True,
    split_pss: tuple[float, float] = (600.0, 700.0),
) -> BenchResults:
    bench = BenchResults(
        meta={"mode": "test"},
        setups=[
            setup("ceiling", "ceiling", 4000.0),
            setup("naive", "naive", 30.0, pss=(1100.0, 1500.0)),
            setup("tuned", "tuned", 1900.0, ref_p99=50.0, pss=(650.0, 800.0)),
            setup("split-rest", "split", split_rps * 0.8, ref_p99=split_p99 * 2, pss=split_pss),
            setup("split-grpc", "split", split_rps, ref_p99=split_p99, kept=kept, pss=split_pss),
        ],
        reference_rps=1000.0,
    )
    bench.goals = evaluate(bench)
    return bench


def held(bench: BenchResults) -> dict[str, bool | None]:
    return {g.name: g.held for g in bench.goals}


def test_best_split_is_the_headline_column() -> None:
    bench = results()
    assert bench.best_split() is bench.setup("split-grpc")
    assert bench.column("split") is bench.setup("split-grpc")


@pytest.mark.parametrize(
    ("split_rps", "expected"),
    [
        # vs tuned 1900 (>= 1.5x), vs ceiling 4000 (>= 0.6x), vs naive 30 (>= 50x)
        (3000.0, (True, True, True)),
        (2000.0, (False, False, True)),
        (1400.0, (False, False, False)),
    ],
)
def test_throughput_goals(split_rps: float, expected: tuple[bool, bool, bool]) -> None:
    goals = held(results(split_rps))
    names = ("throughput vs tuned", "throughput vs ceiling", "throughput vs naive")
    assert tuple(goals[name] for name in names) == expected


@pytest.mark.parametrize(
    ("p99", "kept", "expected"),
    [(10.0, True, True), (12.5, True, True), (13.0, True, False), (5.0, False, False)],
)
def test_tail_latency_goal(p99: float, kept: bool, expected: bool) -> None:
    # tuned's p99 at the reference load is 50 ms: the bound is 12.5 ms
    assert held(results(split_p99=p99, kept=kept))["tail latency"] is expected


@pytest.mark.parametrize(
    ("split_pss", "expected"),
    [
        # naive (1100, 1500) x 0.6 = (660, 900); tuned (650, 800) x 0.9 = (585, 720)
        ((500.0, 600.0), {"memory vs naive @1w": True, "memory vs tuned @1w": True,
                          "memory vs naive @4w": True, "memory vs tuned @4w": True,
                          "memory per worker": True}),
        ((620.0, 730.0), {"memory vs naive @1w": True, "memory vs tuned @1w": False,
                          "memory vs naive @4w": True, "memory vs tuned @4w": False,
                          "memory per worker": True}),
        ((500.0, 650.0), {"memory per worker": False}),  # 50 MB per added worker
    ],
)
def test_memory_goals(split_pss: tuple[float, float], expected: dict[str, bool]) -> None:
    goals = held(results(split_pss=split_pss))
    assert {k: goals[k] for k in expected} == expected


def test_goals_are_not_measured_without_a_split() -> None:
    bench = results()
    bench.setups = [s for s in bench.setups if s.column != "split"]
    bench.setups.append(SetupResult("split-rest", "split", "x", status="failed", reason="boom"))
    goals = evaluate(bench)
    assert {g.held for g in goals} == {None}
    assert "failed (boom)" in goals[0].note


@pytest.mark.parametrize(
    ("before", "after", "text"),
    [
        (40.0, 6.0, "÷6.7 (−85 %)"),
        (198.0, 900.0, "×4.5 (+355 %)"),
        (None, 1.0, "–"),
        (0.0, 1.0, "–"),
    ],
)
def test_change(before: float | None, after: float | None, text: str) -> None:
    assert change(before, after) == text


def test_report_from_captured_runs(tmp_path: Path) -> None:
    """A report built from real wrk output: tables, plots and results.json agree."""
    closed = ClosedLoopResult(32, parse_wrk((DATA / "wrk_closed_latency.txt").read_text()), 0.1)
    counters = parse_paced_counters((DATA / "wrk_paced_300rps.txt").read_text())
    samples = read_latency_file(DATA / "paced_latencies_us.txt")
    run = fixed_rate_result(300.0, 16, counters, samples, 0.1)
    bench = results()
    ceiling = bench.setup("ceiling")
    assert ceiling is not None
    ceiling.saturation = SaturationRun(closed, CPU)
    ceiling.fixed_rate = [FixedRateRun("80% of own saturation", 0.8, False, run, CPU)]
    bench.setups.append(
        SetupResult(
            "split-grpc-coalescing",
            "split",
            "x",
            status="skipped",
            reason="not available yet: no coalescing field",
        )
    )

    text = markdown_report(bench)
    assert "| Metric | naive | tuned | split (split-grpc) | change (naive → split) |" in text
    assert "| Throughput at saturation (RPS) | 30 | 1,900 | 3,000 | ×100.0 (+9900 %) |" in text
    assert "not available yet: no coalescing field" in text
    assert f"{run.latency.p99_ms:,.1f}" in text  # type: ignore[union-attr]
    assert "| Latency p99 (ms) | 150 → 11 | ÷13.6 (−93 %)" in text

    out = tmp_path / "20260101T000000Z"
    out.mkdir()
    outputs = write_outputs(bench, out)
    plots = {"latency.png", "latency_p99.png", "memory.png"}
    assert set(outputs) == {"results.json", "report.md", *plots}
    for name in plots:
        assert outputs[name].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "latest").resolve() == out.resolve()
    data = json.loads(outputs["results.json"].read_text())
    by_name = {s["name"]: s for s in data["setups"]}
    assert by_name["ceiling"]["saturation"]["closed"]["summary"]["rps"] == pytest.approx(1356.05)
    assert by_name["ceiling"]["fixed_rate"][0]["result"]["latency"]["count"] == 908
    assert by_name["tuned"]["memory"][1]["pss_mb"] == 800.0
    assert {g["name"] for g in data["goals"]} >= {"throughput vs tuned", "memory per worker"}
    # a second run replaces `latest`
    second = tmp_path / "20260101T000100Z"
    second.mkdir()
    write_outputs(bench, second)
    assert (tmp_path / "latest").resolve() == second.resolve()


def test_busy_machine_and_slow_runs_are_noted() -> None:
    from dataclasses import replace

    from bench.report import notes

    bench = results(kept=False)
    tuned = bench.setup("tuned")
    assert tuned is not None and tuned.saturation is not None
    busy = replace(CPU, other_cores=1.3)
    tuned.saturation = replace(tuned.saturation, cpu=busy)
    tuned.fixed_rate[0] = replace(tuned.fixed_rate[0], cpu=busy)
    found = notes(bench)
    assert found[0].startswith("Other processes on the machine used more than 0.25 cores during 2 of")
    assert "up to 1.30 cores" in found[0]
    assert any("split-grpc, reference: sent 2,500 of 5,000 planned" in n for n in found)
