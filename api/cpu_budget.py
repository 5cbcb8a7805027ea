"""How many CPUs this process may really use: the container's quota, not the host's.

`os.cpu_count()` reports the host's cores even inside a container limited to a
fraction of them; sizing worker counts or thread pools from it oversubscribes the
quota. This module reads the cgroup CPU quota and the scheduler affinity mask and
returns the smaller:

* cgroup v2: `cpu.max` ("<quota> <period>" in microseconds, or "max <period>"),
* cgroup v1: `cpu.cfs_quota_us` / `cpu.cfs_period_us` (quota -1 = unlimited),

looked up in the process's own cgroup (from `/proc/self/cgroup`) and each of its
ancestors up to the mount point, the tightest limit winning: a limit on a parent group
applies to its children. Inside a container with its own cgroup namespace the own
group is the mount point itself.

The quota reading itself lives in the top-level `cpu_quota` module, shared with the model
server (`serving` sizes its TensorFlow thread pools from it) and re-exported here; this module
adds the API's own sizing rules. Stdlib only, so `gunicorn.conf.py` can use it before any app
code is imported, and `python -m api.doctor` reports from the same numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from cpu_quota import (
    CGROUP_ROOT,
    PROC_SELF_CGROUP,
    affinity_cpus,
    available_cpus,
    cgroup_cpu_quota,
)

__all__ = [
    "CGROUP_ROOT",
    "PROC_SELF_CGROUP",
    "THREAD_ENV_VARS",
    "affinity_cpus",
    "available_cpus",
    "cgroup_cpu_quota",
    "threads_per_worker",
    "web_concurrency",
]

# Thread-pool sizes of OpenMP, MKL and OpenBLAS: read once, when each library loads.
THREAD_ENV_VARS: Final = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def web_concurrency(env: Mapping[str, str], cpus: int) -> int:
    """API worker processes: `WEB_CONCURRENCY` when set, else one per available CPU.

    Raises:
        ValueError: WEB_CONCURRENCY is set but not an integer >= 1.
    """
    raw = env.get("WEB_CONCURRENCY", "").strip()
    if not raw:
        return max(1, cpus)
    workers = int(raw)
    if workers < 1:
        raise ValueError(f"WEB_CONCURRENCY must be >= 1, got {raw!r}")
    return workers


def threads_per_worker(cpus: int, workers: int) -> int:
    """OpenMP/MKL/OpenBLAS threads per worker so that workers x threads <= cpus (>= 1).

    The API's workers do no numeric work of their own, so with one worker per CPU this
    is 1; it only grows when fewer workers than CPUs are asked for.
    """
    return max(1, cpus // max(1, workers))
