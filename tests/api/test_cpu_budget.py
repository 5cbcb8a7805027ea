"""CPU quota detection from fake cgroup trees (v2 `cpu.max`, v1 CFS files), and the split of
one container's CPUs between the two tiers (`python -m api.ops.cpu_budget`, run by run-server.sh)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from api.ops.cpu_budget import (
    affinity_cpus,
    available_cpus,
    cgroup_cpu_quota,
    num_batch_threads,
    one_container_budget,
    shell_assignments,
    threads_per_worker,
    web_concurrency,
)
from tests.support import REPO


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


@pytest.fixture
def proc_v2(tmp_path: Path) -> Path:
    """/proc/self/cgroup of a process in a cgroup namespace (its group is the root)."""
    path = tmp_path / "proc-cgroup"
    path.write_text("0::/\n")
    return path


@pytest.mark.parametrize(
    ("cpu_max", "quota"),
    [("150000 100000", 1.5), ("200000 100000", 2.0), ("50000 100000", 0.5), ("max 100000", None)],
)
def test_v2_cpu_max(tmp_path: Path, proc_v2: Path, cpu_max: str, quota: float | None) -> None:
    root = tmp_path / "cgroup"
    write(root / "cpu.max", cpu_max)
    assert cgroup_cpu_quota(root, proc_v2) == quota


def test_v2_tightest_limit_of_own_group_and_ancestors_wins(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    proc = tmp_path / "proc-cgroup"
    proc.write_text("0::/kubepods/pod1/ctr\n")
    write(root / "kubepods" / "cpu.max", "max 100000")
    write(root / "kubepods" / "pod1" / "cpu.max", "300000 100000")
    write(root / "kubepods" / "pod1" / "ctr" / "cpu.max", "max 100000")
    assert cgroup_cpu_quota(root, proc) == 3.0
    write(root / "kubepods" / "pod1" / "ctr" / "cpu.max", "120000 100000")
    assert cgroup_cpu_quota(root, proc) == 1.2


@pytest.mark.parametrize("layout", ["cpu,cpuacct", "cpu", ""])
def test_v1_cfs_quota_in_each_mount_layout(tmp_path: Path, layout: str) -> None:
    root = tmp_path / "cgroup"
    proc = tmp_path / "proc-cgroup"
    proc.write_text("4:memory:/\n2:cpu,cpuacct:/\n0::/\n")
    d = root / layout if layout else root
    write(d / "cpu.cfs_quota_us", "250000")
    write(d / "cpu.cfs_period_us", "100000")
    assert cgroup_cpu_quota(root, proc) == 2.5


def test_v1_unlimited_quota(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    proc = tmp_path / "proc-cgroup"
    proc.write_text("2:cpu,cpuacct:/\n")
    write(root / "cpu" / "cpu.cfs_quota_us", "-1")
    write(root / "cpu" / "cpu.cfs_period_us", "100000")
    assert cgroup_cpu_quota(root, proc) is None


def test_v1_nested_group_without_namespace(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    proc = tmp_path / "proc-cgroup"
    proc.write_text("3:cpu,cpuacct:/docker/abc\n")
    write(root / "cpu,cpuacct" / "docker" / "abc" / "cpu.cfs_quota_us", "100000")
    write(root / "cpu,cpuacct" / "docker" / "abc" / "cpu.cfs_period_us", "100000")
    assert cgroup_cpu_quota(root, proc) == 1.0


@pytest.mark.parametrize("junk", ["", "garbage", "12 x", "100000 0"])
def test_malformed_or_missing_files_mean_no_quota(tmp_path: Path, proc_v2: Path, junk: str) -> None:
    root = tmp_path / "cgroup"
    write(root / "cpu.max", junk)
    assert cgroup_cpu_quota(root, proc_v2) is None
    assert cgroup_cpu_quota(tmp_path / "nothing-here", tmp_path / "no-proc-file") is None


def test_available_cpus_rounds_the_quota_up_and_caps_at_affinity(
    tmp_path: Path, proc_v2: Path
) -> None:
    root = tmp_path / "cgroup"
    write(root / "cpu.max", "50000 100000")
    assert available_cpus(root, proc_v2) == 1
    write(root / "cpu.max", "150000 100000")
    assert available_cpus(root, proc_v2) == min(2, affinity_cpus())
    write(root / "cpu.max", f"{1000 * 100000} 100000")
    assert available_cpus(root, proc_v2) == affinity_cpus()


def test_web_concurrency_and_threads_per_worker() -> None:
    assert web_concurrency({}, 3) == 3
    assert web_concurrency({"WEB_CONCURRENCY": " 5 "}, 3) == 5
    with pytest.raises(ValueError):
        web_concurrency({"WEB_CONCURRENCY": "0"}, 3)
    with pytest.raises(ValueError):
        web_concurrency({"WEB_CONCURRENCY": "many"}, 3)
    assert threads_per_worker(cpus=4, workers=4) == 1
    assert threads_per_worker(cpus=4, workers=2) == 2
    assert threads_per_worker(cpus=2, workers=8) == 1


# --- one container, two tiers (run-server.sh) ----------------------------------------------


@pytest.mark.parametrize(
    ("cpus", "env", "workers", "serving"),
    [
        (1, {}, 1, 1),  # one CPU: the tiers take turns (doctor says so)
        (2, {}, 1, 1),
        (3, {}, 2, 1),
        (4, {}, 2, 2),
        (8, {}, 4, 4),
        (4, {"WEB_CONCURRENCY": "3"}, 3, 1),  # the API's workers set: serving gets the rest
        (2, {"WEB_CONCURRENCY": "4"}, 4, 1),
    ],
)
def test_one_container_budget_splits_the_cpus(
    cpus: int, env: dict[str, str], workers: int, serving: int
) -> None:
    budget = one_container_budget(cpus, env)
    assert (budget.api_workers, budget.serving_session_threads) == (workers, serving)
    assert (budget.serving_intra_op, budget.serving_inter_op, budget.api_threads_per_worker) == (1, 1, 1)
    if cpus >= 2 and "WEB_CONCURRENCY" not in env:
        assert budget.api_workers + budget.serving_session_threads <= cpus


def test_serving_flags_leave_what_serving_args_set() -> None:
    budget = one_container_budget(4, {})
    assert budget.serving_flags([]) == [
        "--tensorflow_intra_op_parallelism=1",
        "--tensorflow_inter_op_parallelism=1",
        "--rest_api_num_threads=2",
    ]
    assert budget.serving_flags(["--rest_api_num_threads", "8"]) == [
        "--tensorflow_intra_op_parallelism=1",
        "--tensorflow_inter_op_parallelism=1",
    ]
    assert budget.serving_flags(["--tensorflow_session_parallelism=2"]) == [
        "--rest_api_num_threads=2"
    ]


@pytest.mark.parametrize(
    ("args", "text"),
    [
        ([], ""),
        (["--enable_batching"], "num_batch_threads { value: 2 }\n"),
        (["--enable_batching=true"], "num_batch_threads { value: 2 }\n"),
        (["--enable_batching=false"], ""),
        (["--enable_batching", "--batching_parameters_file=/x"], ""),  # the user's file wins
    ],
)
def test_batch_threads_follow_the_budget(args: list[str], text: str) -> None:
    assert one_container_budget(4, {}).batching_parameters(args) == text


def test_num_batch_threads_of_a_parameters_file() -> None:
    assert num_batch_threads("max_batch_size { value: 64 }\nnum_batch_threads { value: 3 }\n") == 3
    assert num_batch_threads("max_batch_size { value: 64 }\n") is None


def test_shell_assignments_are_what_run_server_evaluates() -> None:
    text = shell_assignments(
        one_container_budget(2, {}), {"OMP_NUM_THREADS": "2", "SERVING_ARGS": "--enable_batching"}
    )
    assert text.splitlines() == [
        "WEB_CONCURRENCY=1",
        "MKL_NUM_THREADS=1",  # OMP_NUM_THREADS was set: left alone
        "OPENBLAS_NUM_THREADS=1",
        "SERVING_BUDGET_FLAGS='--tensorflow_intra_op_parallelism=1 "
        "--tensorflow_inter_op_parallelism=1 --rest_api_num_threads=1'",
        "SERVING_BUDGET_BATCHING='num_batch_threads { value: 1 }",
        "'",
    ]


def _budget_cli(*args: str, cpus: str | None = None, env: dict[str, str] | None = None) -> str:
    command = [sys.executable, "-m", "api.ops.cpu_budget", *args]
    if cpus is not None:
        command = ["taskset", "-c", cpus, *command]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={"PATH": os.environ["PATH"], **(env or {})}, check=True)
    return done.stdout


@pytest.mark.skipif(shutil.which("taskset") is None or len(os.sched_getaffinity(0)) < 2,
                    reason="needs taskset and 2 CPUs")
@pytest.mark.parametrize(("cpus", "workers", "threads"), [("0", 1, 1), ("0,1", 1, 1)])
def test_the_budget_follows_the_affinity_mask(cpus: str, workers: int, threads: int) -> None:
    out = _budget_cli(cpus=cpus)
    assert f"WEB_CONCURRENCY={workers}\n" in out
    assert f"--rest_api_num_threads={threads}'" in out


def test_the_budget_follows_a_cgroup_quota(tmp_path: Path, proc_v2: Path) -> None:
    write(tmp_path / "cpu.max", "50000 100000")  # half a CPU: one whole CPU for both tiers
    out = _budget_cli(f"--cgroup-root={tmp_path}", f"--proc-cgroup={proc_v2}",
                      env={"WEB_CONCURRENCY": "2"})
    assert "WEB_CONCURRENCY=2\n" in out and "--rest_api_num_threads=1'" in out
