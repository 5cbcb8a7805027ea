"""CPU quota detection from fake cgroup trees (v2 `cpu.max`, v1 CFS files)."""

from __future__ import annotations

from pathlib import Path

import pytest

from api.cpu_budget import (
    affinity_cpus,
    available_cpus,
    cgroup_cpu_quota,
    threads_per_worker,
    web_concurrency,
)


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
