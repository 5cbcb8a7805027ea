"""The benchmark end to end: real gunicorn, real run-server.sh with `python -m serving`, the real
load generator, loopback only.

Short bounded runs (about 15 s for the ceiling, 40 s for the split, unpinned). Asserts what
the run produced, never how fast it was: speed is the benchmark's output, not a test condition.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from bench.goals import evaluate
from bench.plan import Plan
from bench.procfs import process_tree
from bench.report import write_outputs
from bench.results import CURVE_KEYS, RECORD_KEYS
from bench.runner import Environment, Job, Runner
from bench.setups import CEILING, all_setups
from bench.workload import FRAUD, body_pool, write_body_pool

pytestmark = pytest.mark.skipif(shutil.which("taskset") is None, reason="taskset not installed")

TINY = Plan(
    mode="test",
    slo_ms=25.0,  # a fixed SLO: no tuned setup started to derive one
    searches=1,
    warmup_s=0.5,
    warmup_max_s=1.5,
    step_s=0.5,
    step_max_s=0.5,
    min_requests=1,
    ladder_fractions=(0.1, 0.3),
    max_steps=3,
    memory_workers=(1, 2),
    memory_warmup_s=0.5,
)


def environment(tmp_path: Path) -> Environment:
    return Environment(
        run_dir=tmp_path,
        pool=write_body_pool(tmp_path / "bodies.jsonl", 32),
        probe=body_pool(1)[0],
        server_cpus=(),
        load_cpus=(),
    )


def test_ceiling_run_produces_a_curve_an_slo_rps_and_memory(tmp_path: Path) -> None:
    lines: list[str] = []
    results = Runner(TINY, environment(tmp_path), lines.append).run(
        [Job(FRAUD, CEILING, memory=True)]
    )
    (ceiling,) = results.setups
    assert ceiling.status == "ok", ceiling.notes
    assert ceiling.workload == "fraud" and ceiling.closed_loop_rps and ceiling.closed_loop_rps > 0
    assert 1 <= len(ceiling.latency_curve) <= TINY.max_steps
    first = ceiling.latency_curve[0]
    assert first.offered_rps == pytest.approx(TINY.ladder(ceiling.closed_loop_rps)[0])
    assert first.requests > 0 and first.cpu is not None and first.cpu.setup_cores > 0
    assert [m.workers for m in ceiling.memory] == [1, 2]
    one, two = ceiling.memory
    assert len(one.processes) == 2 and len(two.processes) == 3  # master + workers
    assert any("(search 1, sweep" in line for line in lines)
    assert any("SLO-RPS (p99 <= 25 ms)" in line for line in lines)

    results.meta = {"mode": "test", "slo_ms": 25.0}
    results.goals = evaluate(results)
    outputs = write_outputs(results, tmp_path)
    (record,) = json.loads(outputs["results.json"].read_text())["setups"]
    assert tuple(record) == RECORD_KEYS and tuple(record["latency_curve"][0]) == CURVE_KEYS
    assert outputs["slo_curves.png"].stat().st_size > 0


def test_headline_split_goes_through_run_server_and_stops_it(tmp_path: Path) -> None:
    """The split as run-server.sh starts it, measured, then every process gone."""
    split = next(s for s in all_setups() if s.headline)
    before = set(process_tree([os.getpid()]))
    lines: list[str] = []
    results = Runner(TINY, environment(tmp_path), lines.append).run(
        [Job(FRAUD, split, memory=False)]
    )
    (result,) = results.setups
    assert result.status == "ok", result.notes
    assert len(result.commands) == 1 and result.commands[0].endswith("run-server.sh")
    assert result.workers >= 1 and result.latency_curve
    roles = {role for p in result.latency_curve if p.cpu for role in p.cpu.by_role}
    assert {"serving", "api worker"} <= roles
    log = next(tmp_path.glob("fraud-split*.log")).read_text()
    assert "CPU budget: API" in log and "--rest_api_num_threads=" in log
    assert set(process_tree([os.getpid()])) <= before  # run-server, serving and API are gone
