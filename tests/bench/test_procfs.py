"""/proc parsing (captured files) and the live process tree, CPU and PSS readers."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.memory import parse_smaps_rollup, process_memory, tree_memory
from bench.procfs import (
    CLK_TCK,
    CpuMeter,
    ProcStat,
    machine_cpu_s,
    parse_stat,
    parse_steal,
    parse_system_cpu,
    process_tree,
    read_stat,
    system_cpu_ticks,
    tree_cpu_ticks,
)

DATA = Path(__file__).parent / "data"


def test_parse_stat() -> None:
    stat = parse_stat((DATA / "proc_pid_stat.txt").read_text())
    assert (stat.pid, stat.comm, stat.ppid) == (20877, "python", 20875)
    assert (stat.utime_ticks, stat.stime_ticks) == (2, 0)
    assert stat.cpu_ticks == 2


def test_parse_stat_with_spaces_and_parentheses_in_the_name() -> None:
    stat = parse_stat((DATA / "proc_pid_stat_odd_comm.txt").read_text())
    assert (stat.pid, stat.comm, stat.ppid) == (20883, "sl (x) y", 20875)


def test_parse_stat_rejects_other_text() -> None:
    with pytest.raises(ValueError):
        parse_stat("cpu  118293 0 11324")


def test_system_cpu_busy_ticks() -> None:
    # cpu  118293 0 11324 154651 490 0 595 1261: user+nice+system+irq+softirq+steal
    assert parse_system_cpu((DATA / "proc_stat.txt").read_text()) == 118293 + 11324 + 595 + 1261


def test_smaps_rollup_fields() -> None:
    fields = parse_smaps_rollup((DATA / "smaps_rollup.txt").read_text())
    assert fields["Rss"] == 10448
    assert fields["Pss"] == 4605
    assert fields["Private_Clean"] + fields["Private_Dirty"] <= fields["Pss"]
    assert "[rollup]" not in "".join(fields)


def test_process_tree_from_a_snapshot() -> None:
    snapshot = [
        ProcStat(1, "init", 0, 0, 0),
        ProcStat(10, "gunicorn", 1, 0, 0),
        ProcStat(11, "worker", 10, 0, 0),
        ProcStat(12, "worker", 10, 0, 0),
        ProcStat(13, "child", 12, 0, 0),
        ProcStat(20, "other", 1, 0, 0),
    ]
    assert process_tree([10], snapshot) == [10, 11, 12, 13]
    assert process_tree([10, 12], snapshot) == [10, 12, 11, 13]  # roots first, once each
    assert process_tree([99], snapshot) == []


def test_live_tree_cpu_and_memory() -> None:
    # A real child that burns some CPU, then sleeps until stdin closes.
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sum(range(3_000_000)); sys.stdin.read()"],
        stdin=subprocess.PIPE,
    )
    try:
        tree = process_tree([os.getpid()])
        assert tree[0] == os.getpid()
        assert child.pid in tree
        stat = read_stat(child.pid)
        assert stat is not None and stat.ppid == os.getpid()
        ticks = tree_cpu_ticks(tree)
        assert set(ticks) <= set(tree)
        assert ticks[os.getpid()] > 0
        memory = tree_memory([os.getpid(), child.pid], {os.getpid(): "pytest"})
        assert [p.role for p in memory.processes][0] == "pytest"
        assert all(0 < p.uss_mb <= p.pss_mb <= p.rss_mb for p in memory.processes)
        assert memory.pss_mb == pytest.approx(sum(p.pss_mb for p in memory.processes))
    finally:
        child.stdin.close()  # type: ignore[union-attr]
        child.wait(10)
    assert read_stat(child.pid) is None
    assert process_memory(child.pid, "gone") is None
    assert system_cpu_ticks() > 0


def test_cpu_meter_reads_a_busy_process_and_the_machine() -> None:
    # The meter starts once the child spins: its interpreter's start-up is not what is measured
    # (on a busy or slower CPU it can take most of the window).
    spin = "import sys; sys.stdout.write('spinning\\n'); sys.stdout.flush()\nwhile True: pass"
    busy = subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE, text=True)
    try:
        assert busy.stdout is not None and busy.stdout.readline() == "spinning\n"
        meter = CpuMeter([busy.pid])
        time.sleep(0.5)
        reading = meter.read()
    finally:
        busy.kill()
        busy.wait()
    assert set(reading.by_pid) == {busy.pid}
    assert 0.2 < reading.cores <= 1.1  # one spinning thread (on a shared machine, at least some)
    assert reading.machine_cores >= reading.cores - 0.1
    assert reading.elapsed_s >= 0.5


def test_machine_cpu_is_busy_and_total_seconds_of_the_cpu_line(tmp_path: Path) -> None:
    # user nice system idle iowait irq softirq steal guest guest_nice (proc(5)); guest is in user.
    (tmp_path / "stat").write_text("cpu  100 10 50 800 40 5 5 0 30 0\ncpu0 50 5 25 400 20 2 3 0 15 0\n")
    busy, total = machine_cpu_s(tmp_path)
    assert busy == pytest.approx(170 / CLK_TCK)
    assert total == pytest.approx(1010 / CLK_TCK)


def test_steal_is_summed_over_the_named_cpus_only() -> None:
    # user nice system idle iowait irq softirq steal ... (proc(5)): steal is the eighth value.
    text = ("cpu  100 0 50 800 0 0 0 70 0 0\n"
            "cpu0 50 0 25 400 0 0 0 60 0 0\n"
            "cpu1 50 0 25 400 0 0 0 10 0 0\n"
            "intr 12345 0 0\n")
    assert parse_steal(text, [0]) == 60
    assert parse_steal(text, [0, 1]) == 70
    assert parse_steal(text, [7]) == 0  # not on this machine: nothing
    assert parse_steal(text, []) == 0


def test_cpu_meter_reads_the_steal_of_its_cpus_as_cores(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text("cpu  0 0 0 0 0 0 0 0 0 0\ncpu0 0 0 0 0 0 0 0 0 0 0\ncpu1 0 0 0 0 0 0 0 0 0 0\n")
    meter = CpuMeter([], proc=tmp_path, steal_cpus=[0])
    time.sleep(0.2)
    stolen = 0.1 * CLK_TCK  # 0.1 s stolen from cpu0, 0.5 s from cpu1 (not measured)
    stat.write_text(f"cpu  0 0 0 0 0 0 0 {stolen * 6:g} 0 0\ncpu0 0 0 0 0 0 0 0 {stolen:g} 0 0\n"
                    f"cpu1 0 0 0 0 0 0 0 {stolen * 5:g} 0 0\n")
    reading = meter.read()
    assert reading.stolen_cores == pytest.approx(0.1 / reading.elapsed_s)
