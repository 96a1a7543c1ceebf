"""What the benchmark ran on: CPU and its ISA, cores, memory, software versions, load."""

from __future__ import annotations

import importlib.metadata
import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["MachineInfo", "load_average", "machine_info"]


@dataclass(frozen=True)
class MachineInfo:
    cpu: str
    cpu_isa: str  # the ISA flags that decide which precision pays (runtime.host)
    torch_cpu_capability: str  # the widest vector ISA torch's CPU kernels dispatch to
    logical_cores: int
    torch_threads: int
    memory_gb: float | None
    os: str
    python: str
    torch: str
    cuda_device: str | None
    sam2: str | None  # Meta's package, the reference mode

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _memory_gb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20  # kB -> GiB
    except (OSError, ValueError, IndexError):
        pass
    return None


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine_info() -> MachineInfo:
    import torch

    from sam2serve.runtime.host import host_isa

    cuda = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return MachineInfo(
        cpu=_cpu_model(),
        cpu_isa=host_isa().describe(),
        torch_cpu_capability=torch.backends.cpu.get_cpu_capability(),
        logical_cores=os.cpu_count() or 1,
        torch_threads=torch.get_num_threads(),
        memory_gb=_memory_gb(),
        os=f"{platform.system()} {platform.release()}",
        python=platform.python_version(),
        torch=torch.__version__,
        cuda_device=cuda,
        sam2=_version("sam2"),
    )


def load_average() -> tuple[float, float, float]:
    """1, 5 and 15 minute load averages (zeros where the OS has none)."""
    try:
        return os.getloadavg()
    except OSError:
        return (0.0, 0.0, 0.0)
