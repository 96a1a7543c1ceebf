"""What this host's CPU can do natively, read once from the OS (torch-free).

Which precision pays depends on the instruction set, not on the vendor string: on a CPU
with AVX512-BF16 (or AMX) bf16 products run natively and int8 products use VNNI, while on
an AVX2-only CPU bf16 is emulated and slower than fp32. Two CPUs that both call themselves
"AMD EPYC" can be either. The runtime (the backend and dtype it picks) and the benchmark
(its machine line) read the class from here.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ISA_FLAGS", "HostIsa", "host_isa"]

# The /proc/cpuinfo flags that decide which precision runs natively, in report order.
ISA_FLAGS = (
    "avx2",
    "avx512f",
    "avx512_bf16",
    "avx512_vnni",
    "avx_vnni",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)


@dataclass(frozen=True)
class HostIsa:
    """The ISA flags of :data:`ISA_FLAGS` this CPU has."""

    flags: frozenset[str]

    @property
    def native_bf16(self) -> bool:
        """bf16 products in hardware (AVX512-BF16 or AMX), not emulated."""
        return bool(self.flags & {"avx512_bf16", "amx_bf16"})

    @property
    def vnni(self) -> bool:
        """int8 products in hardware (VNNI or AMX-INT8)."""
        return bool(self.flags & {"avx512_vnni", "avx_vnni", "amx_int8"})

    @property
    def isa_class(self) -> str:
        """The class the runtime chooses by: ``amx``, ``avx512_bf16``, ``avx512_vnni``,
        ``avx512``, ``avx2`` or ``other`` (the best the CPU has)."""
        for name, needed in (
            ("amx", "amx_tile"),
            ("avx512_bf16", "avx512_bf16"),
            ("avx512_vnni", "avx512_vnni"),
            ("avx512", "avx512f"),
            ("avx2", "avx2"),
        ):
            if needed in self.flags:
                return name
        return "other"

    def describe(self) -> str:
        """E.g. ``AVX2 AVX-512 AVX512-BF16 AVX512-VNNI`` (``no AVX2`` when it has none)."""
        names = {
            "avx2": "AVX2",
            "avx512f": "AVX-512",
            "avx512_bf16": "AVX512-BF16",
            "avx512_vnni": "AVX512-VNNI",
            "avx_vnni": "AVX-VNNI",
            "amx_tile": "AMX",
            "amx_bf16": "AMX-BF16",
            "amx_int8": "AMX-INT8",
        }
        present = [names[flag] for flag in ISA_FLAGS if flag in self.flags]
        return " ".join(present) if present else "no AVX2"


def parse_cpuinfo(text: str) -> HostIsa:
    """The ISA of ``/proc/cpuinfo``'s text (its first ``flags`` line: every core of a
    machine has the same)."""
    for line in text.splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            return HostIsa(frozenset(flag for flag in ISA_FLAGS if flag in flags))
    return HostIsa(frozenset())


@functools.cache
def host_isa() -> HostIsa:
    """This machine's ISA (empty where /proc/cpuinfo cannot be read, e.g. not Linux)."""
    try:
        return parse_cpuinfo(Path("/proc/cpuinfo").read_text())
    except OSError:
        return HostIsa(frozenset())
