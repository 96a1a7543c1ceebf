"""Run an AOTInductor package (``.pt2``) without importing the compiler.

``torch._inductor.aoti_load_package`` imports TorchDynamo and Inductor (~1.5 s here) only
to flatten the call's arguments; our programs take and return flat tensor sequences, so
the package's C++ loader is called directly: loading three decoder programs then takes
~0.07 s. The manifest pins the torch version the packages were compiled with, and the
CPU: Inductor compiles for the exporting machine's instruction set (``-march=native``).
"""

from __future__ import annotations

import platform
from collections.abc import Sequence
from pathlib import Path

import torch


class AOTIProgram:
    """One compiled program: ``program(tensors) -> list of tensors``, inputs in the
    flattened order of the exported module's arguments."""

    def __init__(self, path: str | Path) -> None:
        # (path, model name, run single-threaded, runners, device index: -1 = default)
        self.loader = torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, -1)

    def __call__(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        # boxed_run takes ownership of the list it is given: pass a fresh one.
        return self.loader.boxed_run(list(inputs))


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; ``platform.processor()`` elsewhere): a
    package compiled for one CPU is only run on a CPU of the same name."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
