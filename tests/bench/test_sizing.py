"""bench.sizing: pods and cores per tier from a results.json, on a small hand-made fixture.

The fixture has the shape of `make bench`'s setup records (name, workload, column, headline,
status, server_cpus, slo_ms, slo_rps, latency_curve points with per-role CPU); its numbers
are made up for the arithmetic, not measurements.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.sizing import SizingError, capacity, sizing_report
from tests.support import REPO


def point(offered: float, achieved: float, p99: float, errors: int = 0, by_role: dict | None = None) -> dict:
    return {
        "offered_rps": offered, "achieved_rps": achieved, "p50_ms": p99 / 3, "p99_ms": p99,
        "p999_ms": p99 * 1.5, "max_ms": p99 * 2, "errors": errors,
        "cpu": None if by_role is None else {
            "setup_cores": sum(by_role.values()), "by_role": by_role,
            "load_generator_cores": 0.3, "other_cores": 0.01,
        },
    }  # fmt: skip


def fixture() -> dict[str, Any]:
    split_curve = [
        point(400, 400, 5.0, by_role={"serving": 0.05, "api": 0.01, "api worker": 0.2}),
        point(800, 799, 8.0, by_role={"serving": 0.08, "api": 0.01, "api worker": 0.42}),
        point(1200, 1195, 20.0, by_role={"serving": 0.12, "api": 0.01, "api worker": 0.65}),
        point(1600, 1450, 60.0, by_role={"serving": 0.15, "api": 0.01, "api worker": 0.84}),
    ]
    return {
        "meta": {"started": "fixture", "commit": "fixture"},
        "setups": [
            {"name": "split-rest", "workload": "fraud", "column": "split", "headline": False, "status": "ok",
             "server_cpus": [0], "slo_ms": 25.0, "slo_rps": 600.0,
             "latency_curve": [point(600, 600, 20.0, by_role={"serving": 0.2, "api worker": 0.6})]},
            {"name": "split-rest-coalescing", "workload": "fraud", "column": "split", "headline": True,
             "status": "ok", "server_cpus": [0], "slo_ms": 25.0, "slo_rps": 1200.0, "latency_curve": split_curve},
            {"name": "tuned", "workload": "fraud", "column": "tuned", "headline": False, "status": "ok",
             "server_cpus": [0], "slo_ms": 25.0, "slo_rps": 600.0,
             "latency_curve": [point(300, 300, 4.0, by_role={"tuned": 0.5, "tuned worker": 0.1}),
                               point(600, 600, 9.0, by_role={"tuned": 0.6, "tuned worker": 0.3}),
                               point(900, 880, 40.0, 3, by_role={"tuned": 0.7, "tuned worker": 0.3})]},
        ],
    }  # fmt: skip


def test_capacity_is_the_highest_step_within_the_slo_and_its_cpu_per_request() -> None:
    split = capacity(fixture()["setups"][1], slo_ms=25)
    assert split.rps == 1195 and split.p99_ms == 20.0
    assert split.cpu_ms_per_request["serving"] == pytest.approx(1000 * 0.12 / 1195)
    assert split.cpu_ms_per_request["api"] == pytest.approx(1000 * 0.66 / 1195)  # master + workers
    # A tighter SLO falls back to a lower measured step.
    assert capacity(fixture()["setups"][1], slo_ms=10).rps == 799
    # In-process: every role is the app; a step with errors never counts, even within the SLO.
    tuned = capacity(fixture()["setups"][2], slo_ms=50)
    assert tuned.rps == 600 and tuned.cpu_ms_per_request == {"app": pytest.approx(1000 * 0.9 / 600)}


def test_missing_measurements_are_refused() -> None:
    with pytest.raises(SizingError, match="no measured step met"):
        capacity(fixture()["setups"][1], slo_ms=2)
    record = fixture()["setups"][1]
    for p in record["latency_curve"]:
        p["cpu"] = None
    with pytest.raises(SizingError, match="no per-role CPU"):
        capacity(record, slo_ms=25)


def test_report_for_30m_requests_a_day_with_10x_peak() -> None:
    rps = 30e6 / 86_400 * 10
    text = sizing_report(fixture(), rps=rps, slo_ms=25)
    api_cores = rps * (1000 * 0.66 / 1195) / 1000 / 0.6
    serving_cores = rps * (1000 * 0.12 / 1195) / 1000 / 0.6
    app_cores = rps * (1000 * 0.9 / 600) / 1000 / 0.6
    assert f"{api_cores:7.1f} cores -> {max(2, math.ceil(api_cores / 2)):3d} pods x 2 CPU" in text
    assert f"{serving_cores:7.1f} cores -> {max(2, math.ceil(serving_cores)):3d} pods x 1 CPU" in text
    assert f"{app_cores:7.1f} cores -> {math.ceil(app_cores / 2):3d} pods x 2 CPU" in text
    assert "split (split-rest-coalescing)" in text and "in-process (tuned)" in text


def test_command_line(tmp_path: Path) -> None:
    results = tmp_path / "results.json"
    results.write_text(json.dumps(fixture()))
    done = subprocess.run(
        [sys.executable, "-m", "bench.sizing", str(results), "--requests-per-day", "30e6", "--peak-factor", "10",
         "--slo-ms", "25"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "3,472 requests/s at peak (30,000,000 requests/day x 10 peak / 86,400 s)" in done.stdout
    refused = subprocess.run(
        [sys.executable, "-m", "bench.sizing", str(results), "--rps", "100", "--slo-ms", "1"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert refused.returncode == 2 and "no measured step met" in refused.stderr
