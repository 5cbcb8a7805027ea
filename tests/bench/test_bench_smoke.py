"""The benchmark end to end: real gunicorn, real `python -m serving`, real wrk, loopback.

Short bounded runs (about 15 s for the ceiling, 30 s for the split). Asserts what the run produced, never how fast
it was: speed is the benchmark's output, not a test condition.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from bench.plan import Plan
from bench.report import write_outputs
from bench.runner import Environment, Runner
from bench.setups import CEILING
from bench.workload import body_pool, write_body_pool

pytestmark = pytest.mark.skipif(
    shutil.which("wrk") is None or shutil.which("taskset") is None,
    reason="wrk not installed (apt-get install wrk)",
)

TINY = Plan(
    mode="test",
    warmup_s=1.0,
    saturation_s=1.0,
    fixed_rate_s=1.0,
    load_fractions=(0.5,),
    saturation_connections=8,
    fixed_rate_connections=8,
    memory_workers=(1, 2),
    warmup_max_s=2.0,
    memory_warmup_s=1.0,
)


def test_ceiling_run_produces_every_figure(tmp_path: Path) -> None:
    env = Environment(
        run_dir=tmp_path,
        pool=write_body_pool(tmp_path / "bodies.jsonl", 32),
        probe=body_pool(1)[0],
        server_cpus=(),
        load_cpus=(),
    )
    lines: list[str] = []
    results = Runner(TINY, env, lines.append).run([CEILING])

    (ceiling,) = results.setups
    assert ceiling.status == "ok", ceiling.notes
    assert ceiling.saturation is not None
    assert ceiling.rps is not None and ceiling.rps > 0
    assert ceiling.saturation.closed.summary.errors.total == 0
    assert ceiling.saturation.cpu.setup_cores > 0

    (paced,) = ceiling.fixed_rate
    assert paced.fraction == 0.5
    assert paced.result.offered_rps == pytest.approx(0.5 * ceiling.rps)
    assert paced.result.latency is not None and paced.result.latency.count > 0
    assert paced.result.errors.total == 0

    assert [m.workers for m in ceiling.memory] == [1, 2]
    one, two = ceiling.memory
    assert len(one.processes) == 2 and len(two.processes) == 3  # master + workers
    assert 0 < one.pss_mb < two.pss_mb

    assert any("ceiling: saturation" in line for line in lines)
    assert any("fixed rate" in line for line in lines)

    results.meta = {"mode": "test"}
    outputs = write_outputs(results, tmp_path)
    assert "ceiling" in outputs["report.md"].read_text()


def test_split_rest_run_shares_and_stops_its_model_server(tmp_path: Path) -> None:
    """The split (serving + API) through the runner: measured, then everything stopped."""
    from bench.procfs import process_tree
    from bench.setups import all_setups

    split = next(s for s in all_setups() if s.name == "split-rest")
    env = Environment(
        run_dir=tmp_path,
        pool=write_body_pool(tmp_path / "bodies.jsonl", 32),
        probe=body_pool(1)[0],
        server_cpus=(),
        load_cpus=(),
    )
    before = set(process_tree([os.getpid()]))
    plan = replace(TINY, memory_workers=(1,))
    results = Runner(plan, env, lambda line: None).run([split])

    (result,) = results.setups
    assert result.status == "ok", result.notes
    assert result.rps is not None and result.rps > 0
    roles = set(result.saturation.cpu.by_role) if result.saturation else set()
    assert {"serving", "api worker"} <= roles
    (memory,) = result.memory
    assert {p.role for p in memory.processes} >= {"serving", "api", "api worker"}
    assert set(process_tree([os.getpid()])) <= before  # serving and API are gone
