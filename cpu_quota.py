"""How many CPUs this process may really use: the container's quota, not the host's.

`os.cpu_count()` reports the host's cores even inside a container limited to a fraction of
them; sizing worker counts or thread pools from it oversubscribes the quota. This module reads
the cgroup CPU quota and the scheduler affinity mask and returns the smaller:

* cgroup v2: `cpu.max` ("<quota> <period>" in microseconds, or "max <period>"),
* cgroup v1: `cpu.cfs_quota_us` / `cpu.cfs_period_us` (quota -1 = unlimited),

looked up in the process's own cgroup (from `/proc/self/cgroup`) and each of its ancestors up
to the mount point, the tightest limit winning: a limit on a parent group applies to its
children. Inside a container with its own cgroup namespace the own group is the mount point
itself.

Shared by both tiers and therefore stdlib only, importing neither: the API sizes its gunicorn
workers from it (`api.ops.cpu_budget`, `gunicorn.conf.py`) and the model server its TensorFlow
thread pools and batch threads (`serving.model_servers.flags`).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Final

__all__ = [
    "CGROUP_ROOT",
    "PROC_SELF_CGROUP",
    "affinity_cpus",
    "available_cpus",
    "cgroup_cpu_quota",
]

CGROUP_ROOT: Final = Path("/sys/fs/cgroup")
PROC_SELF_CGROUP: Final = Path("/proc/self/cgroup")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _own_cgroups(proc_cgroup: Path) -> dict[str, str]:
    """Controller -> the process's cgroup path, from /proc/self/cgroup.

    Lines are `hierarchy-id:controller,controller:path`; the cgroup v2 line has an
    empty controller list and is returned under the key "".
    """
    groups: dict[str, str] = {}
    for line in (_read(proc_cgroup) or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for controller in controllers.split(",") if controllers else [""]:
            groups[controller] = path
    return groups


def _ancestors(mount: Path, cgroup_path: str) -> list[Path]:
    """`mount/cgroup_path` and each parent directory up to `mount`, existing ones only."""
    rel = Path(cgroup_path.lstrip("/"))
    dirs = [mount / rel, *(mount / p for p in rel.parents)]
    seen: list[Path] = []
    for d in dirs:
        if d not in seen and d.is_dir():
            seen.append(d)
    return seen


def _v2_limit(directory: Path) -> float | None:
    text = _read(directory / "cpu.max")  # "max 100000" or "150000 100000"
    if not text:
        return None
    quota, _, period = text.partition(" ")
    try:
        if quota != "max" and int(period) > 0:
            return int(quota) / int(period)
    except ValueError:
        return None
    return None


def _v1_limit(directory: Path) -> float | None:
    quota, period = _read(directory / "cpu.cfs_quota_us"), _read(directory / "cpu.cfs_period_us")
    try:
        if quota and period and int(quota) > 0 and int(period) > 0:
            return int(quota) / int(period)
    except ValueError:
        return None
    return None


def cgroup_cpu_quota(
    root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_SELF_CGROUP
) -> float | None:
    """CPUs allowed by the tightest cgroup quota over this process (e.g. 1.5).

    Args:
        root: where the cgroup file system is mounted.
        proc_cgroup: the process's cgroup membership file.

    Returns:
        The quota in CPUs, or None when no group sets one (unlimited or unknown).
    """
    own = _own_cgroups(proc_cgroup)
    limits: list[float] = []
    for d in _ancestors(root, own.get("", "/")):  # v2 (unified)
        limit = _v2_limit(d)
        if limit is not None:
            limits.append(limit)
    v1_path = own.get("cpu", "/")
    for mount in (root / "cpu,cpuacct", root / "cpu", root):  # v1 mount layouts
        for d in _ancestors(mount, v1_path):
            limit = _v1_limit(d)
            if limit is not None:
                limits.append(limit)
    return min(limits) if limits else None


def affinity_cpus() -> int:
    """CPUs in this process's scheduler affinity mask (all cores when not Linux)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def available_cpus(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_SELF_CGROUP) -> int:
    """Whole CPUs this process can use: min(affinity mask, ceil(cgroup quota)), >= 1."""
    cpus = affinity_cpus()
    quota = cgroup_cpu_quota(root, proc_cgroup)
    if quota is not None:
        cpus = min(cpus, max(1, math.ceil(quota)))
    return max(1, cpus)
