"""Run an AOTInductor package (``.pt2``) without importing the compiler.

``torch._inductor.aoti_load_package`` imports TorchDynamo and Inductor (~1.5 s here) only
to flatten the call's arguments; our programs take and return flat tensor sequences, so
the package's C++ loader is called directly: loading three decoder programs then takes
~0.07 s. A package is compiled for one target: on the CPU, the exporting machine's
instruction set (``-march=native``); on CUDA, the exporting GPU's architecture (its
kernels are cubins for that compute capability). The manifest records the target
(:func:`compile_target`) and the torch version; a package runs only where both match.
"""

from __future__ import annotations

import platform
from collections.abc import Sequence
from pathlib import Path

import torch


class AOTIProgram:
    """One compiled program: ``program(tensors) -> list of tensors``, inputs in the
    flattened order of the exported module's arguments, on the device it was compiled
    for (``device``: the CUDA device to run on; ignored for CPU packages)."""

    def __init__(self, path: str | Path, device: torch.device | str = "cpu") -> None:
        device = torch.device(device)
        index = device.index if device.type == "cuda" and device.index is not None else -1
        # (path, model name, run single-threaded, runners, device index: -1 = default)
        self.loader = torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, index)

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


def compile_target(device: torch.device | str) -> str:
    """What a package compiled on ``device`` is tied to: the CPU's model name, or the GPU's
    name and compute capability (``NVIDIA H100 80GB HBM3, sm_90``)."""
    device = torch.device(device)
    if device.type != "cuda":
        return cpu_model()
    major, minor = torch.cuda.get_device_capability(device)
    return f"{torch.cuda.get_device_name(device)}, sm_{major}{minor}"
