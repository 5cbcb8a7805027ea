"""`python -m bench.oip_cost --smoke`: both tiers as real processes, every setup answered.

Asserts the table's shape and that every setup's CPU run was answered without a failure, never
a figure: speed is the benchmark's output, not a test condition.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SETUPS = ("model route (JSON)", "v2 JSON", "v2 binary")
COLUMNS = ("setup", "API CPU/request", "serving CPU/request", "answered", "failed", "closed-loop RPS", "SLO-RPS",
           "machine busy")  # fmt: skip


def test_smoke_prints_one_answered_row_per_setup() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.oip_cost", "--smoke"], cwd=REPO, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in rows[0].strip("|").split("|")]
    assert tuple(header) == COLUMNS
    body = [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[2:]]
    assert [row[0] for row in body] == list(SETUPS)
    for row in body:
        assert len(row) == len(COLUMNS), row
        cells = dict(zip(COLUMNS, row, strict=True))
        assert int(cells["answered"]) > 0, row
        assert int(cells["failed"]) == 0, row
        assert cells["API CPU/request"].endswith(" µs") and cells["serving CPU/request"].endswith(" µs"), row
        assert float(cells["closed-loop RPS"].replace(",", "")) > 0, row
        slo = cells["SLO-RPS"]
        assert slo == "not met" or float(slo.replace(",", "")) > 0, row
