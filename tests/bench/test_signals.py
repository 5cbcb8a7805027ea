"""`python -m bench` stopped by SIGTERM stops the setup it was measuring (real processes, loopback)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench.processes import REPO
from bench.procfs import process_tree


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


def test_sigterm_stops_the_running_setup(tmp_path: Path) -> None:
    bench = subprocess.Popen(
        [sys.executable, "-m", "bench", "--smoke", "--no-pin", "--workload", "fraud", "--setups", "split",
         "--slo-ms", "25", "--out", str(tmp_path)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    setup: list[int] = []
    try:
        assert bench.stdout is not None
        deadline = time.monotonic() + 120
        for line in bench.stdout:
            if "fraud/split: ready" in line or time.monotonic() > deadline:
                break
        else:
            raise AssertionError("the benchmark ended before the split was ready")
        setup = process_tree([bench.pid])[1:]
        assert setup, "the split's processes were not found under the benchmark"
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(timeout=60) == 128 + signal.SIGTERM
        deadline = time.monotonic() + 15
        while any(_alive(pid) for pid in setup) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert [pid for pid in setup if _alive(pid)] == []
    finally:
        if bench.poll() is None:
            os.killpg(bench.pid, signal.SIGKILL)
            bench.wait()
        for pid in setup:  # what a failed run left
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
