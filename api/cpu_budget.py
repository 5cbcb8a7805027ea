"""How many CPUs this process may really use: the container's quota, not the host's.

`os.cpu_count()` reports the host's cores even inside a container limited to a
fraction of them; sizing worker counts or thread pools from it oversubscribes the
quota. This module reads the cgroup CPU quota (v2 `cpu.max`, v1
`cpu.cfs_quota_us` / `cpu.cfs_period_us`) and the scheduler affinity mask, and
returns the smaller. Stdlib only, so `gunicorn.conf.py` can use it before any app
code is imported.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def cgroup_cpu_quota(root: Path = CGROUP_ROOT) -> float | None:
    """CPUs allowed by the cgroup quota (e.g. 1.5), or None when unlimited/unknown."""
    v2 = _read(root / "cpu.max")  # "max 100000" or "150000 100000"
    if v2:
        quota, _, period = v2.partition(" ")
        if quota != "max" and period:
            return int(quota) / int(period)
        return None
    quota_s = _read(root / "cpu" / "cpu.cfs_quota_us") or _read(root / "cpu.cfs_quota_us")
    period_s = _read(root / "cpu" / "cpu.cfs_period_us") or _read(root / "cpu.cfs_period_us")
    if quota_s and period_s and int(quota_s) > 0:
        return int(quota_s) / int(period_s)
    return None


def available_cpus(root: Path = CGROUP_ROOT) -> int:
    """Whole CPUs this process can use: min(affinity mask, ceil(cgroup quota)), >= 1."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    quota = cgroup_cpu_quota(root)
    if quota is not None:
        cpus = min(cpus, max(1, math.ceil(quota)))
    return max(1, cpus)
