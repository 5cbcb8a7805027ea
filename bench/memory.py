"""Memory of a setup: the sum of PSS over its process tree, from /proc/PID/smaps_rollup.

PSS (proportional set size) counts each resident page divided by the number of
processes mapping it, so the PSS of a tree sums to the memory the tree really costs:
TensorFlow's library pages shared by several workers are counted once, not once per
worker as RSS would (measured for the naive setup: 1,773 MB RSS against 1,019 MB PSS). It is the
figure a container's memory limit is closest to. smaps_rollup needs Linux >= 4.14.

PSS divides a shared page among every process that maps it, inside the setup or not:
on a machine where other processes map the same files (another TensorFlow process from
the same environment), the setup's PSS comes out lower. USS (private pages only) is
recorded beside it: it does not depend on other processes, but leaves shared library
pages out altogether.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from bench.procfs import PROC, cmdline

KIB_PER_MIB = 1024


@dataclass(frozen=True)
class ProcessMemory:
    """One process's share of a setup's memory."""

    pid: int
    role: str  # which part of the setup it is, e.g. "api master", "api worker", "serving"
    pss_mb: float
    rss_mb: float
    uss_mb: float = 0.0  # Private_Clean + Private_Dirty


@dataclass(frozen=True)
class TreeMemory:
    """A setup's memory at one moment: per process, and the total PSS in MiB."""

    processes: list[ProcessMemory]

    @property
    def pss_mb(self) -> float:
        """Sum of PSS over the tree, MiB."""
        return sum(p.pss_mb for p in self.processes)

    @property
    def rss_mb(self) -> float:
        """Sum of RSS over the tree, MiB (counts shared pages once per process)."""
        return sum(p.rss_mb for p in self.processes)

    @property
    def uss_mb(self) -> float:
        """Sum of USS (private pages) over the tree, MiB."""
        return sum(p.uss_mb for p in self.processes)


def parse_smaps_rollup(text: str) -> dict[str, int]:
    """The "Name:  N kB" fields of /proc/PID/smaps_rollup, as kB.

    The first line (the address range and "[rollup]") is skipped.
    """
    fields: dict[str, int] = {}
    for line in text.splitlines():
        name, colon, value = line.partition(":")
        parts = value.split()
        if colon and len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit():
            fields[name.strip()] = int(parts[0])
    return fields


def process_memory(pid: int, role: str, proc: Path = PROC) -> ProcessMemory | None:
    """PSS and RSS of one process, or None when it has gone (or is a kernel thread).

    Raises:
        ValueError: the kernel's smaps_rollup has no Pss line.
    """
    try:
        text = (proc / str(pid) / "smaps_rollup").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = parse_smaps_rollup(text)
    if not fields:
        return None
    if "Pss" not in fields:
        raise ValueError(f"/proc/{pid}/smaps_rollup has no Pss line")
    return ProcessMemory(
        pid=pid,
        role=role,
        pss_mb=fields["Pss"] / KIB_PER_MIB,
        rss_mb=fields.get("Rss", 0) / KIB_PER_MIB,
        uss_mb=(fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)) / KIB_PER_MIB,
    )


def tree_memory(pids: Iterable[int], roles: dict[int, str] | None = None) -> TreeMemory:
    """PSS and RSS of every live process in `pids`.

    Args:
        pids: the setup's process tree (`bench.procfs.process_tree`).
        roles: a role per pid; a pid without one is named by its command line.
    """
    roles = roles or {}
    found = []
    for pid in pids:
        memory = process_memory(pid, roles.get(pid) or cmdline(pid)[:60])
        if memory is not None:
            found.append(memory)
    return TreeMemory(found)
