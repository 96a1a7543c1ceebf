"""The process-wide settings, applied once by an entry point before it builds predictors.

torch's CPU threads and CUDA's TF32 switches belong to the process, not to a predictor, so
no constructor sets them (building a second predictor must not change the first one's
numerics or threads). Each entry point (the commands that load a model, the cluster's
replica, the bench's worker) calls :func:`configure_process` once with the spec it runs.

TF32 is allowed on CUDA only where the spec's mode allows it (furious). That is the
process's setting; a predictor of an exact mode keeps TF32 off for its own calls whatever
the process allows (:mod:`sam2serve.engine.tf32`), so a furious process that also holds a
fast predictor still computes fast exactly.
"""

from __future__ import annotations

from sam2serve.runtime.modes import get_mode
from sam2serve.runtime.spec import RuntimeSpec
from sam2serve.runtime.threads import apply_threads


def configure_process(spec: RuntimeSpec) -> int:
    """torch's CPU threads (``spec.threads``, default the CPUs this process may use) and,
    for a CUDA spec, TF32 as its mode allows; returns the threads used. Call it before any
    parallel work, model loading included."""
    threads = apply_threads(spec.threads)
    if spec.device_type == "cuda":
        import torch

        allow = get_mode(spec.mode).allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = allow
        torch.backends.cudnn.allow_tf32 = allow
    return threads


__all__ = ["configure_process"]
