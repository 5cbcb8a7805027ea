"""TensorFlow thread pools sized from the container's CPUs (cgroup quota, affinity), not the
host's."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import cpu_quota
from serving.model_servers import flags, server_config
from serving.model_servers.flags import ServerOptions, parse_flags
from tests.support import REPO


def test_unset_pools_take_the_schedulable_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_quota, "available_cpus", lambda: 3)
    assert flags.schedulable_cpus() == 3
    assert flags.session_threads(ServerOptions()) == (3, 3)
    assert flags.session_threads(ServerOptions(tensorflow_intra_op_parallelism=1)) == (1, 3)
    assert flags.rest_api_num_threads(ServerOptions()) == 12  # TF Serving: 4 x CPUs
    options = server_config.batching_options(parse_flags(["--model_base_path=/m", "--enable_batching"]))
    assert options is not None and options.num_batch_threads == 3  # port::MaxParallelism()


def _cgroup_v2(tmp_path: Path, cpu_max: str) -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    (root / "pod" / "serving").mkdir(parents=True)
    (root / "pod" / "cpu.max").write_text(cpu_max)
    (root / "pod" / "serving" / "cpu.max").write_text("max 100000\n")
    proc_cgroup = tmp_path / "proc-self-cgroup"
    proc_cgroup.write_text("0::/pod/serving\n")
    return root, proc_cgroup


@pytest.mark.parametrize(("cpu_max", "quota"), [("150000 100000\n", 1.5), ("max 100000\n", None)])
def test_the_quota_of_a_parent_cgroup_applies(
    tmp_path: Path, cpu_max: str, quota: float | None
) -> None:
    root, proc_cgroup = _cgroup_v2(tmp_path, cpu_max)
    assert cpu_quota.cgroup_cpu_quota(root, proc_cgroup) == quota
    cpus = cpu_quota.available_cpus(root, proc_cgroup)
    assert cpus == (min(2, cpu_quota.affinity_cpus()) if quota else cpu_quota.affinity_cpus())


def test_cgroup_v1_cfs_quota(tmp_path: Path) -> None:
    group = tmp_path / "cgroup" / "cpu,cpuacct" / "docker" / "abc"
    group.mkdir(parents=True)
    (group / "cpu.cfs_quota_us").write_text("50000\n")
    (group / "cpu.cfs_period_us").write_text("100000\n")
    proc_cgroup = tmp_path / "proc-self-cgroup"
    proc_cgroup.write_text("4:cpu,cpuacct:/docker/abc\n")
    assert cpu_quota.cgroup_cpu_quota(tmp_path / "cgroup", proc_cgroup) == 0.5
    assert cpu_quota.available_cpus(tmp_path / "cgroup", proc_cgroup) == 1


@pytest.mark.skipif(shutil.which("taskset") is None, reason="needs taskset (util-linux)")
def test_the_affinity_mask_bounds_the_pools() -> None:
    """A server pinned to one CPU sizes its pools for one CPU, whatever the host has."""
    code = (
        "from serving.model_servers import flags; o = flags.parse_flags(['--model_base_path=/m']); "
        "print(*flags.session_threads(o), flags.rest_api_num_threads(o))"
    )
    result = subprocess.run(
        ["taskset", "-c", "0", sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert result.stdout.split() == ["1", "1", "4"]


def test_cpu_quota_is_stdlib_only() -> None:
    """Both tiers import it: it must pull in neither package nor any third-party module."""
    code = (
        "import sys; before = set(sys.modules); import cpu_quota; "
        "print(sorted(m for m in set(sys.modules) - before if m.split('.')[0] in "
        "{'api', 'serving', 'numpy', 'tensorflow', 'grpc'}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert result.stdout.strip() == "[]"
