"""How many intra-op threads the engine's steps get when the settings name none.

ONNX Runtime's own default is one thread per physical core of the machine. Two things make that
wrong for this service. The decoder step is not all the work: the event loop, tokenizing and the
search between two steps need a core too, and on 2 cores one intra-op thread answered 1.23x the
requests of two at 1 and 8 clients, the same at 64, with a p50 of 20.0 against 24.7 ms
(benchmarks/RESULTS.md, issue 35). And ONNX Runtime counts the machine's cores, not the ones a
container may use: under a CPU limit of 4 on a 64-core host it starts 32 threads that the
limit then throttles. So the default is one fewer than the physical cores the process may use,
counting its CPU affinity and its cgroup's CPU quota (v2 `cpu.max`, v1 `cpu.cfs_quota_us`),
and at least one.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from pathlib import Path

SYS_CPU = Path("/sys/devices/system/cpu")
CGROUP = Path("/sys/fs/cgroup")


def default_intra_op_threads(
    cpus: Iterable[int] | None = None, sys_cpu: Path = SYS_CPU, cgroup: Path = CGROUP
) -> int:
    """One fewer than the physical cores among `cpus` (default: this process's affinity),
    at most the cgroup's CPU quota, and at least one."""
    allowed = sorted(_affinity() if cpus is None else cpus)
    cores = physical_cores(allowed, sys_cpu)
    quota = cpu_quota(cgroup)
    usable = cores if quota is None else min(cores, math.ceil(quota))
    return max(1, usable - 1)


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


def cpu_quota(cgroup: Path = CGROUP) -> float | None:
    """The CPUs' worth of time the process's cgroup may use (quota / period), None unlimited."""
    for quota_file, period_file in (
        (cgroup / "cpu.max", None),  # v2: "QUOTA PERIOD" or "max PERIOD"
        (cgroup / "cpu" / "cpu.cfs_quota_us", cgroup / "cpu" / "cpu.cfs_period_us"),  # v1
    ):
        try:
            fields = quota_file.read_text().split()
            if period_file is not None:
                fields.append(period_file.read_text().strip())
        except OSError:
            continue
        if len(fields) != 2 or fields[0] in ("max", "-1"):
            return None
        try:
            quota, period = float(fields[0]), float(fields[1])
        except ValueError:
            return None
        return quota / period if quota > 0 and period > 0 else None
    return None


def _affinity() -> set[int]:
    try:
        return os.sched_getaffinity(0)
    except AttributeError:  # not Linux
        return set(range(os.cpu_count() or 1))
