"""Process trees and CPU time from Linux's /proc, for the setups the benchmark starts.

Every figure here is read from the kernel's own accounting, never estimated:

- the process tree: each process's parent from field 4 of /proc/PID/stat;
- CPU time of a process: utime + stime (fields 14 and 15 of /proc/PID/stat, in clock
  ticks of `os.sysconf("SC_CLK_TCK")`), user and kernel time together;
- CPU time of the whole machine: the "cpu" line of /proc/stat (all fields but idle and
  iowait), so that work by other processes during a run can be reported beside it.

See proc(5). Linux only.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/PID/stat this package uses."""

    pid: int
    comm: str
    ppid: int
    utime_ticks: int
    stime_ticks: int

    @property
    def cpu_ticks(self) -> int:
        """User + kernel time, in clock ticks."""
        return self.utime_ticks + self.stime_ticks


def parse_stat(text: str) -> ProcStat:
    """Parse one /proc/PID/stat line.

    The command name (field 2) is in parentheses and may itself contain spaces and
    parentheses, so the fields after it are split from the last ')'.

    Raises:
        ValueError: not a stat line.
    """
    left, paren, rest = text.rpartition(")")
    if not paren or "(" not in left:
        raise ValueError(f"not a /proc/PID/stat line: {text[:80]!r}")
    pid_s, _, comm = left.partition(" (")
    fields = rest.split()
    # rest starts at field 3 (state): field n is fields[n - 3].
    return ProcStat(
        pid=int(pid_s),
        comm=comm,
        ppid=int(fields[1]),
        utime_ticks=int(fields[11]),
        stime_ticks=int(fields[12]),
    )


def read_stat(pid: int, proc: Path = PROC) -> ProcStat | None:
    """/proc/PID/stat of a live process, or None when it has gone."""
    try:
        return parse_stat((proc / str(pid) / "stat").read_text())
    except (FileNotFoundError, ProcessLookupError):
        return None


def all_stats(proc: Path = PROC) -> list[ProcStat]:
    """The stat of every process alive now (processes that exit meanwhile are skipped)."""
    stats = []
    for entry in proc.iterdir():
        if entry.name.isdigit():
            stat = read_stat(int(entry.name), proc)
            if stat is not None:
                stats.append(stat)
    return stats


def process_tree(roots: Iterable[int], stats: Iterable[ProcStat] | None = None) -> list[int]:
    """`roots` and all their live descendants, roots first, each pid once.

    Args:
        roots: pids of the processes the benchmark started.
        stats: a snapshot of all processes (read from /proc when None).
    """
    snapshot = list(all_stats() if stats is None else stats)
    children: dict[int, list[int]] = {}
    for stat in snapshot:
        children.setdefault(stat.ppid, []).append(stat.pid)
    alive = {stat.pid for stat in snapshot}
    tree: list[int] = []
    todo = [pid for pid in roots if pid in alive]
    while todo:
        pid = todo.pop(0)
        if pid in tree:
            continue
        tree.append(pid)
        todo.extend(sorted(children.get(pid, ())))
    return tree


def tree_cpu_ticks(pids: Iterable[int], proc: Path = PROC) -> dict[int, int]:
    """utime + stime of each live pid, in clock ticks."""
    ticks = {}
    for pid in pids:
        stat = read_stat(pid, proc)
        if stat is not None:
            ticks[pid] = stat.cpu_ticks
    return ticks


def parse_system_cpu(text: str) -> int:
    """Busy ticks of the whole machine from /proc/stat's first ("cpu") line.

    Busy = user + nice + system + irq + softirq + steal; idle and iowait are not
    counted, guest time is already inside user (proc(5)).

    Raises:
        ValueError: no aggregate "cpu" line.
    """
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] == "cpu":
            user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, parts[1:9])
            return user + nice + system + irq + softirq + steal
    raise ValueError("no 'cpu' line in /proc/stat text")


def system_cpu_ticks(proc: Path = PROC) -> int:
    """Busy clock ticks of all CPUs together since boot."""
    return parse_system_cpu((proc / "stat").read_text())


def parse_steal(text: str, cpus: Iterable[int]) -> int:
    """Steal ticks since boot of the CPUs `cpus`, summed, from /proc/stat's "cpuN" lines.

    Steal is the time the hypervisor ran something else while this virtual CPU had work
    (proc(5), the eighth value of a cpu line); on bare metal it stays 0. A CPU with no line
    (offline, or not on this machine) adds nothing.
    """
    wanted = {f"cpu{n}" for n in cpus}
    return sum(int(parts[8]) for line in text.splitlines()
               if (parts := line.split()) and parts[0] in wanted and len(parts) > 8)


def steal_ticks(cpus: Iterable[int], proc: Path = PROC) -> int:
    """Steal clock ticks of the CPUs `cpus` since boot (`parse_steal`)."""
    return parse_steal((proc / "stat").read_text(), cpus)


def process_cpu_s(pid: int, proc: Path = PROC) -> float:
    """utime + stime of a live process since it started, seconds.

    Raises:
        RuntimeError: the process is gone.
    """
    stat = read_stat(pid, proc)
    if stat is None:
        raise RuntimeError(f"process {pid} is gone")
    return stat.cpu_ticks / CLK_TCK


def machine_cpu_s(proc: Path = PROC) -> tuple[float, float]:
    """(busy, total) seconds of all CPUs together since boot, from /proc/stat's "cpu" line:
    busy as `parse_system_cpu` counts it, total with idle and iowait added."""
    text = (proc / "stat").read_text()
    busy = parse_system_cpu(text)
    (line,) = [line for line in text.splitlines() if line.split()[:1] == ["cpu"]]
    idle, iowait = (int(x) for x in line.split()[4:6])
    return busy / CLK_TCK, (busy + idle + iowait) / CLK_TCK


def cmdline(pid: int, proc: Path = PROC) -> str:
    """The process's command line, arguments joined by spaces ('' when gone)."""
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


@dataclass(frozen=True)
class CpuReading:
    """CPU used over one interval, in cores (CPU seconds per wall-clock second)."""

    by_pid: dict[int, float]  # each measured process
    machine_cores: float  # every process on the machine, busy ticks of /proc/stat
    elapsed_s: float
    stolen_cores: float = 0.0  # of the meter's `steal_cpus`: time the hypervisor took (steal)

    @property
    def cores(self) -> float:
        """The measured processes together."""
        return sum(self.by_pid.values())


class CpuMeter:
    """The benchmark's one CPU meter: utime + stime of some processes, the machine's busy
    time and the steal of the CPUs `steal_cpus` (those the processes run on), from
    construction to `read()`."""

    def __init__(self, pids: Iterable[int], proc: Path = PROC, steal_cpus: Iterable[int] = ()) -> None:
        self._proc = proc
        self._steal_cpus = tuple(steal_cpus)
        self._before = tree_cpu_ticks(pids, proc)
        self._machine = system_cpu_ticks(proc)
        self._steal = steal_ticks(self._steal_cpus, proc)
        self._started = time.monotonic()

    def read(self, pids: Iterable[int] | None = None) -> CpuReading:
        """CPU since construction of `pids` (default: those measured at construction; a
        process started since counts from zero, one that exited is left out)."""
        elapsed = max(1e-9, time.monotonic() - self._started)
        after = tree_cpu_ticks(self._before if pids is None else pids, self._proc)
        by_pid = {
            pid: (ticks - self._before.get(pid, 0)) / CLK_TCK / elapsed
            for pid, ticks in after.items()
        }
        machine = (system_cpu_ticks(self._proc) - self._machine) / CLK_TCK / elapsed
        stolen = (steal_ticks(self._steal_cpus, self._proc) - self._steal) / CLK_TCK / elapsed
        return CpuReading(by_pid, machine, elapsed, stolen)
