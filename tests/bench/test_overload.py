"""bench.overload: `--smoke` starts the split for real, measures its capacity and prints one row per
step with goodput beside the offered load (a few seconds of load: the figures mean nothing)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bench.overload import HEADER, SMOKE_FACTORS
from tools.processes import run_to_exit


def test_smoke_prints_a_row_per_step_with_goodput(tmp_path: Path) -> None:
    steps_file = tmp_path / "steps.json"
    done = run_to_exit(
        [sys.executable, "-m", "bench.overload", "--setups", "split", "--smoke", "--json", str(steps_file)],
        timeout_s=240,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("|")]
    assert lines[0] == "| " + " | ".join(HEADER) + " |"
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]
    assert [(r[0], float(r[1])) for r in rows] == [("split", f) for f in SMOKE_FACTORS]
    steps = json.loads(steps_file.read_text())
    for row, step in zip(rows, steps, strict=True):
        assert step["offered_rps"] > 0 and step["goodput_rps"] > 0  # the split answered within budget
        assert row[4] == f"{step['goodput_share']:.0%}"
        # every arrival offered is counted once: goodput, a 503 or another failure
        assert step["within_budget"] + step["refused_503"] + step["other_failures"] == step["planned"]
