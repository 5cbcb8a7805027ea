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
adds the sizing rules: the API's alone (`web_concurrency`, `threads_per_worker`, what
`gunicorn.conf.py` uses when the API has its container to itself), and the split of one
container's CPUs between both tiers (`one_container_budget`, what `run-server.sh` starts:
`python -m api.ops.cpu_budget` prints it as shell assignments). Stdlib only, so
`gunicorn.conf.py` and `run-server.sh` can use it before any app code is imported, and
`python -m api.ops.doctor` reports from the same numbers.
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
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
    "OneContainerBudget",
    "affinity_cpus",
    "available_cpus",
    "cgroup_cpu_quota",
    "flag_value",
    "num_batch_threads",
    "one_container_budget",
    "shell_assignments",
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


# --- one container, two tiers (run-server.sh) -------------------------------------------


def flag_value(args: Sequence[str], name: str) -> str | None:
    """The value of `--name=V` / `--name V` in model-server arguments (the last one wins, as
    in the server's own parser); "" for a bare `--name`; None when absent."""
    flag = f"--{name}"
    value = None
    for i, arg in enumerate(args):
        if arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
        elif arg == flag:
            following = args[i + 1] if i + 1 < len(args) else ""
            value = "" if following.startswith("--") else following
    return value


def num_batch_threads(parameters_text: str) -> int | None:
    """`num_batch_threads { value: N }` of a BatchingParameters text proto, None if unset."""
    match = re.search(r"num_batch_threads\s*\{\s*value\s*:\s*(\d+)\s*\}", parameters_text)
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class OneContainerBudget:
    """How `run-server.sh` shares `cpus` whole CPUs between the API and the serving tier.

    The API gets `api_workers` uvicorn workers with one OpenMP/MKL/OpenBLAS thread each (it
    does no numeric work). Serving gets `serving_session_threads` Session runs at once
    (`--rest_api_num_threads`, the request threads that run Predict for REST and gRPC in
    `python -m serving`; `num_batch_threads` when batching is on), each on one thread:
    `--tensorflow_intra_op_parallelism=1` and `--tensorflow_inter_op_parallelism=1` (a run
    executes on its calling thread). So at most api_workers + serving_session_threads
    threads are busy at once, no more than the CPUs from two CPUs up.
    """

    cpus: int
    api_workers: int
    serving_session_threads: int
    api_threads_per_worker: int = 1
    serving_intra_op: int = 1
    serving_inter_op: int = 1

    def serving_flags(self, serving_args: Sequence[str]) -> list[str]:
        """The model-server flags of this budget that `serving_args` does not set itself."""
        wanted = {
            "tensorflow_intra_op_parallelism": self.serving_intra_op,
            "tensorflow_inter_op_parallelism": self.serving_inter_op,
            "rest_api_num_threads": self.serving_session_threads,
        }
        if flag_value(serving_args, "tensorflow_session_parallelism") is not None:
            del wanted["tensorflow_intra_op_parallelism"], wanted["tensorflow_inter_op_parallelism"]
        return [f"--{k}={v}" for k, v in wanted.items() if flag_value(serving_args, k) is None]

    def batching_parameters(self, serving_args: Sequence[str]) -> str:
        """A BatchingParameters text proto with this budget's `num_batch_threads`, when
        batching is on without a parameters file (TF Serving's default would be one batch
        thread per CPU); "" otherwise. Every other parameter keeps TF Serving's default."""
        enabled = flag_value(serving_args, "enable_batching")
        if enabled is None or enabled.lower() in ("false", "0"):
            return ""
        if flag_value(serving_args, "batching_parameters_file"):
            return ""
        return f"num_batch_threads {{ value: {self.serving_session_threads} }}\n"


def one_container_budget(cpus: int, env: Mapping[str, str]) -> OneContainerBudget:
    """The split of `cpus` whole CPUs that `run-server.sh` starts (see `OneContainerBudget`).

    Serving gets half the CPUs, rounded down (at least one session thread), the API the rest
    (at least one worker): on 2 CPUs one each, on 4 two each. The fraud MLP costs serving
    about 0.2 ms of CPU per request against the API's 0.5 ms, a model of a few milliseconds
    the other way round, so neither tier's share is right for every model: `WEB_CONCURRENCY`
    sets the API's workers and serving gets what is left; serving flags in `SERVING_ARGS`
    win over this budget's.

    Raises:
        ValueError: WEB_CONCURRENCY is set but not an integer >= 1.
    """
    cpus = max(1, cpus)
    if env.get("WEB_CONCURRENCY", "").strip():
        workers = web_concurrency(env, cpus)
        serving = max(1, cpus - workers)
    else:
        serving = max(1, cpus // 2)
        workers = max(1, cpus - serving)
    return OneContainerBudget(cpus=cpus, api_workers=workers, serving_session_threads=serving)


def shell_assignments(budget: OneContainerBudget, env: Mapping[str, str]) -> str:
    """What `run-server.sh` evaluates: `WEB_CONCURRENCY`, the API's thread variables (those
    not set already), `SERVING_BUDGET_FLAGS` and `SERVING_BUDGET_BATCHING` (a parameters
    file's text, or empty), each `NAME=value` on its own line, shell-quoted."""
    serving_args = shlex.split(env.get("SERVING_ARGS", ""))
    lines = [f"WEB_CONCURRENCY={budget.api_workers}"]
    lines += [
        f"{var}={budget.api_threads_per_worker}" for var in THREAD_ENV_VARS if not env.get(var)
    ]
    lines.append("SERVING_BUDGET_FLAGS=" + shlex.quote(" ".join(budget.serving_flags(serving_args))))
    lines.append(
        "SERVING_BUDGET_BATCHING=" + shlex.quote(budget.batching_parameters(serving_args))
    )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """`python -m api.ops.cpu_budget`: print the one-container budget as shell assignments."""
    import os

    parser = argparse.ArgumentParser(prog="python -m api.ops.cpu_budget", description=main.__doc__)
    parser.add_argument("--cgroup-root", type=Path, default=CGROUP_ROOT)
    parser.add_argument("--proc-cgroup", type=Path, default=PROC_SELF_CGROUP)
    args = parser.parse_args(argv)
    env = os.environ if env is None else env
    try:
        budget = one_container_budget(available_cpus(args.cgroup_root, args.proc_cgroup), env)
    except ValueError as exc:
        print(f"python -m api.ops.cpu_budget: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(shell_assignments(budget, env))
    return 0


if __name__ == "__main__":
    sys.exit(main())
