"""How many CPU threads the model uses, and how idle OpenMP workers wait.

torch starts one OpenMP worker per core it sees, and by default idle workers spin. On a
machine busy with other work (a CI runner, a shared VM, two replicas on two cores) the
spinning workers fight each other and whatever else runs: AMG's decode stage took 98-103 s
there against 8.0-8.7 s with one thread (docs/benchmarks.md, "Threads"). So the default
is the CPUs this process may really use: its affinity mask, lowered by its cgroup's CPU
quota (containers, Kubernetes limits, Ray's num_cpus), and workers wait passively.

:func:`apply_threads` must run before torch does any parallel work; the wait policy is read
by OpenMP when it starts, so :func:`set_wait_policy` must run before torch is imported
(the CLI does both first thing).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

WAIT_POLICY_ENV = "OMP_WAIT_POLICY"
WAIT_POLICIES = ("passive", "active")
DEFAULT_WAIT_POLICY = "passive"
# The most intra-op threads a setting may ask for: far more than any host here has, and
# the same on every host, so a configuration written for a large machine still starts on
# a small one (where the extra threads only share its cores).
MAX_THREADS = 1024

_CGROUP_V2_CPU = Path("/sys/fs/cgroup/cpu.max")
_CGROUP_V1_QUOTA = Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")
_CGROUP_V1_PERIOD = Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us")


def available_cpus() -> int:
    """CPUs this process may use: its affinity mask, capped by its cgroup CPU quota."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cpus = os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    if quota is not None:
        cpus = min(cpus, max(1, math.floor(quota)))
    return max(1, cpus)


def cgroup_cpu_quota() -> float | None:
    """The cgroup's CPU quota in CPUs (e.g. 1.5), or None when there is none."""
    try:
        quota, period = _CGROUP_V2_CPU.read_text().split()[:2]
        if quota != "max":
            return int(quota) / int(period)
        return None
    except (OSError, ValueError):
        pass
    try:
        quota_us = int(_CGROUP_V1_QUOTA.read_text())
        period_us = int(_CGROUP_V1_PERIOD.read_text())
    except (OSError, ValueError):
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None


def check_threads(threads: int | None) -> int:
    """``threads``, or the default (:func:`available_cpus`) for None; ValueError naming a
    bad value."""
    if threads is None:
        return available_cpus()
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be an integer >= 1, got {threads!r}")
    if threads > MAX_THREADS:
        raise ValueError(f"threads must be at most {MAX_THREADS}, got {threads!r}")
    return threads


def apply_threads(threads: int | None = None) -> int:
    """Set torch's intra-op threads (the default: :func:`available_cpus`); returns the
    number used."""
    import torch

    count = check_threads(threads)
    if torch.get_num_threads() != count:
        torch.set_num_threads(count)
    return count


def set_wait_policy(policy: str | None = None) -> str:
    """Set how idle OpenMP workers wait, for OpenMP runtimes started after this call (an
    explicit ``OMP_WAIT_POLICY`` in the environment wins over the default)."""
    if policy is None:
        policy = os.environ.get(WAIT_POLICY_ENV, DEFAULT_WAIT_POLICY).lower()
    if policy not in WAIT_POLICIES:
        raise ValueError(f"wait policy must be one of {', '.join(WAIT_POLICIES)}, got {policy!r}")
    os.environ[WAIT_POLICY_ENV] = policy
    return policy
