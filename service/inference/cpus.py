"""How many intra-op threads the engine's steps get when the settings name none.

ONNX Runtime's own default is one thread per physical core of the machine, which counts the
machine's cores, not the ones a container may use: under a CPU limit of 4 on a 64-core host it
starts 32 threads that the limit then throttles. So the default counts the physical cores the
process may use, its CPU affinity and the CPU quota of its cgroup and those above it (v2
`cpu.max`, v1 `cpu.cfs_quota_us`). Where the step's threads sleep between kernels, one core is
left out: the event loop, tokenizing and the search between two steps need a core too, and
waking a sleeping thread costs more than it takes over at few rows (on 2 cores one sleeping
thread answered 1.23x and 1.21x the requests of two at 1 and 8 clients, the same at 64:
benchmarks/RESULTS.md, issue 35). Where they spin (a process serving one model under no CPU
quota, service/inference/models.py), they are ready at once, and on 2 cores two of them
answered 1.03-1.24x the requests of one sleeping thread under load (fp32; the same file, issue
35's fifth part), so they take every core."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from pathlib import Path

SYS_CPU = Path("/sys/devices/system/cpu")
CGROUP = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")


def default_intra_op_threads(
    cpus: Iterable[int] | None = None,
    sys_cpu: Path = SYS_CPU,
    cgroup: Path = CGROUP,
    proc_cgroup: Path = PROC_CGROUP,
    *,
    spinning: bool = False,
    processes: int = 1,
) -> int:
    """The physical cores among `cpus` (default: this process's affinity), at most its cgroups'
    CPU quota, shared out among `processes` alike (the service's workers), one fewer unless the
    threads spin, and at least one."""
    cores = physical_cores(_affinity() if cpus is None else cpus, sys_cpu)
    quota = cpu_quota(cgroup, proc_cgroup)
    usable = (cores if quota is None else min(cores, math.ceil(quota))) // processes
    return max(1, usable if spinning else usable - 1)


def physical_cores(cpus: Iterable[int], sys_cpu: Path = SYS_CPU) -> int:
    """The distinct (package, core) pairs of `cpus`, as Linux's sysfs describes them; where it
    does not (another system, a sandbox), every CPU counts as a core."""
    cpus = list(cpus)
    cores = set()
    for cpu in cpus:
        topology = sys_cpu / f"cpu{cpu}" / "topology"
        try:
            package = (topology / "physical_package_id").read_text().strip()
            core = (topology / "core_id").read_text().strip()
        except OSError:
            return len(cpus)
        cores.add((package, core))
    return len(cores)


def cpu_quota(cgroup: Path = CGROUP, proc_cgroup: Path = PROC_CGROUP) -> float | None:
    """The CPUs' worth of time the process may use (quota / period), the smallest along its
    cgroup and the cgroups above it (a limit on a parent holds for its children); None where
    none is set. Its cgroup is the one /proc/self/cgroup names under the mount at `cgroup` (v2:
    the `0::` line, `cpu.max`; v1: the line of the `cpu` controller, `cpu/cpu.cfs_quota_us` over
    `cpu.cfs_period_us`); in a container, whose cgroup namespace makes its own cgroup "/", that
    is the mount's root."""
    v2, v1 = _cgroup_paths(proc_cgroup)
    quotas = [
        quota
        for directory in _up_to(cgroup, v2)
        if (quota := _quota(directory / "cpu.max", None)) is not None
    ] + [
        quota
        for directory in _up_to(cgroup / "cpu", v1)
        if (quota := _quota(directory / "cpu.cfs_quota_us", directory / "cpu.cfs_period_us"))
        is not None
    ]
    return min(quotas, default=None)


def _cgroup_paths(proc_cgroup: Path) -> tuple[str, str]:
    """The process's cgroup v2 path and its v1 `cpu` controller's path ("/" where unknown)."""
    v2 = v1 = "/"
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return v2, v1
    for line in lines:
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        hierarchy, controllers, path = fields
        if hierarchy == "0" and not controllers:
            v2 = path or "/"
        elif "cpu" in controllers.split(","):
            v1 = path or "/"
    return v2, v1


def _up_to(root: Path, path: str) -> list[Path]:
    """`root`/`path` and each directory above it, up to `root` itself."""
    directory = root / path.strip("/")
    return [directory, *directory.parents[: len(directory.relative_to(root).parts)]]


def _quota(quota_file: Path, period_file: Path | None) -> float | None:
    """v2 `cpu.max` ("QUOTA PERIOD", "max PERIOD"), or v1's quota and period files."""
    try:
        fields = quota_file.read_text().split()
        if period_file is not None:
            fields.append(period_file.read_text().strip())
    except OSError:
        return None
    if len(fields) != 2 or fields[0] in ("max", "-1"):
        return None
    try:
        quota, period = float(fields[0]), float(fields[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _affinity() -> set[int]:
    try:
        return os.sched_getaffinity(0)
    except AttributeError:  # not Linux
        return set(range(os.cpu_count() or 1))
