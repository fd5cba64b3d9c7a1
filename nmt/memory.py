"""This process's resources as the kernel counts them: memory resident now and its peak so far,
and the CPUs it may run on."""

from __future__ import annotations

import os
import resource
import sys
from pathlib import Path


def _proc_status_mb(field: str) -> float | None:
    """A ``/proc/self/status`` figure (Linux) in MB; None where there is no such file."""
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024  # kB
    return None


def peak_memory_mb() -> float:
    """Peak resident memory of this process so far (VmHWM). Not getrusage's ru_maxrss where
    /proc has the figure: Linux carries ru_maxrss over from the parent through fork and exec,
    so a child started from a large process would report at least its parent's peak."""
    peak = _proc_status_mb("VmHWM")
    if peak is not None:
        return peak
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # bytes on macOS, else KiB
    return maxrss / 2**20 if sys.platform == "darwin" else maxrss / 1024


def resident_memory_mb() -> float:
    """Resident memory of this process now (VmRSS); NaN where /proc does not say."""
    now = _proc_status_mb("VmRSS")
    return float("nan") if now is None else now


def limit_data_growth(megabytes: float) -> None:
    """Lets this process allocate at most ``megabytes`` more (RLIMIT_DATA over its data size now,
    Linux): a larger allocation then fails with an error instead of waking the OOM killer."""
    now = _proc_status_mb("VmData")
    if now is None:
        raise OSError("a memory limit needs Linux's /proc/self/status")
    limit, hard = int((now + megabytes) * 2**20), resource.getrlimit(resource.RLIMIT_DATA)[1]
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))


def usable_cpus() -> int:
    """The CPUs this process may run on: a cpuset's (taskset, Slurm, a container's
    --cpuset-cpus), not the machine's (``os.cpu_count``: a job given 8 of 128 cores ran 128
    threads on them); a CPU quota does not show. At least one."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1
