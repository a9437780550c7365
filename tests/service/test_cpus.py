"""The default intra-op threads: the physical cores the process may use, under its cgroups' CPU
quota, one fewer unless they spin, at least one; on sysfs, cgroup and /proc/self/cgroup files
built here."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.inference.cpus import cpu_quota, default_intra_op_threads, physical_cores


def _sysfs(root: Path, cores: list[tuple[int, int]]) -> Path:
    """CPU i on (package, core) cores[i]."""
    for cpu, (package, core) in enumerate(cores):
        topology = root / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "physical_package_id").write_text(f"{package}\n")
        (topology / "core_id").write_text(f"{core}\n")
    return root


def _cgroup_v2(root: Path, line: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "cpu.max").write_text(line + "\n")
    return root


def _proc(tmp_path: Path, text: str) -> Path:
    """A /proc/self/cgroup."""
    path = tmp_path / "proc-self-cgroup"
    path.write_text(text)
    return path


def test_sleeping_threads_leave_a_core_for_the_event_loop_and_spinning_ones_take_all(
    tmp_path: Path,
) -> None:
    sys_cpu = _sysfs(tmp_path / "cpu", [(0, 0), (0, 1)])
    none = tmp_path / "none"
    assert default_intra_op_threads([0, 1], sys_cpu, none, none) == 1
    assert default_intra_op_threads([0, 1], sys_cpu, none, none, spinning=True) == 2
    assert default_intra_op_threads([0], sys_cpu, none, none, spinning=True) == 1
    half = _cgroup_v2(tmp_path / "half", "150000 100000")  # 1.5 CPUs of a 2-core machine
    root = _proc(tmp_path, "0::/\n")
    assert default_intra_op_threads([0, 1], sys_cpu, half, root, spinning=True) == 2
    quarter = _cgroup_v2(tmp_path / "quarter", "25000 100000")
    assert default_intra_op_threads([0, 1], sys_cpu, quarter, root, spinning=True) == 1


def test_hyperthreads_count_once(tmp_path: Path) -> None:
    # 16 CPUs on 8 cores of one package, siblings numbered i and i + 8 as Linux does.
    sys_cpu = _sysfs(tmp_path / "cpu", [(0, cpu % 8) for cpu in range(16)])
    assert physical_cores(range(16), sys_cpu) == 8
    none = tmp_path / "none"
    assert default_intra_op_threads(range(16), sys_cpu, none, none) == 7
    # Shared out among worker processes: 8 cores for 3 workers, 2 each (one for the loop).
    assert default_intra_op_threads(range(16), sys_cpu, none, none, processes=3) == 1
    assert default_intra_op_threads(range(16), sys_cpu, none, none, processes=4, spinning=True) == 2
    assert default_intra_op_threads(range(16), sys_cpu, none, none, processes=16) == 1
    # Pinned to CPUs 0-4 and 12, the sibling of 4: five cores.
    assert physical_cores([0, 1, 2, 3, 4, 12], sys_cpu) == 5


def test_a_cpu_quota_bounds_the_threads(tmp_path: Path) -> None:
    sys_cpu = _sysfs(tmp_path / "cpu", [(cpu // 32, cpu % 32) for cpu in range(64)])
    root = _proc(tmp_path, "0::/\n")  # a container's own cgroup namespace
    limited = _cgroup_v2(tmp_path / "cg", "400000 100000")  # 4 CPUs on a 64-core host
    assert cpu_quota(limited, root) == 4.0
    assert default_intra_op_threads(range(64), sys_cpu, limited, root) == 3
    half = _cgroup_v2(tmp_path / "half", "150000 100000")  # 1.5 CPUs: 2 started, 1 thread
    assert default_intra_op_threads(range(64), sys_cpu, half, root) == 1
    unlimited = _cgroup_v2(tmp_path / "max", "max 100000")
    assert cpu_quota(unlimited, root) is None
    assert default_intra_op_threads(range(64), sys_cpu, unlimited, root) == 63


def test_a_nested_cgroup_takes_the_smallest_quota_above_it(tmp_path: Path) -> None:
    """On a host (a systemd service's CPUQuota=), the process's cgroup is a path below the
    mount, and a parent's limit holds for it too."""
    mount = _cgroup_v2(tmp_path / "v2", "max 100000")
    _cgroup_v2(mount / "system.slice", "300000 100000")
    _cgroup_v2(mount / "system.slice" / "mt.service", "600000 100000")
    proc = _proc(tmp_path, "0::/system.slice/mt.service\n")
    assert cpu_quota(mount, proc) == 3.0
    assert cpu_quota(mount, _proc(tmp_path, "0::/user.slice\n")) is None  # not set there


@pytest.mark.parametrize(("quota", "expected"), [("250000", 2.5), ("-1", None)])
def test_cgroup_v1_quota(tmp_path: Path, quota: str, expected: float | None) -> None:
    group = tmp_path / "cpu" / "docker" / "abc"
    group.mkdir(parents=True)
    (group / "cpu.cfs_quota_us").write_text(quota + "\n")
    (group / "cpu.cfs_period_us").write_text("100000\n")
    proc = _proc(tmp_path, "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/\n")
    assert cpu_quota(tmp_path, proc) == expected


def test_without_sysfs_every_cpu_is_a_core_and_one_cpu_gets_one_thread(tmp_path: Path) -> None:
    missing = tmp_path / "none"
    assert physical_cores([0, 1, 2, 3], missing) == 4
    assert default_intra_op_threads([0, 1, 2, 3], missing, missing, missing) == 3
    assert default_intra_op_threads([0], missing, missing, missing) == 1


def test_this_machine_gets_at_least_one_thread() -> None:
    assert default_intra_op_threads() >= 1
