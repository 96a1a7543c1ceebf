"""Which backend runs a mode: the one seam every surface asks (torch-free).

The CLI's ``--backend``, the server's settings and a cluster replica's config all hand
their request here, and get back the backend name or one error that names what is wrong:

- a backend named explicitly is checked against the source of the weights: the backends
  that run ``sam2serve export`` output (``artifacts``, ``onnxruntime``) need an export
  directory, the others need weights, and an ONNX export runs on ``onnxruntime`` only;
- none, or ``auto``: an export directory runs on the backend its manifest calls for
  (:func:`~sam2serve.runtime.artifacts_kind.backend_for_artifacts`); otherwise the mode's
  backend for this device and this host's ISA class (:func:`auto_backend`).
"""

from __future__ import annotations

from sam2serve.runtime.artifacts_kind import backend_for_artifacts
from sam2serve.runtime.backends import BACKENDS
from sam2serve.runtime.host import HostIsa, host_isa
from sam2serve.runtime.spec import default_backend

__all__ = [
    "AUTO",
    "AUTO_DESCRIPTION",
    "BACKEND_CHOICES",
    "BackendChoiceError",
    "auto_backend",
    "choose_backend",
]

AUTO = "auto"
AUTO_DESCRIPTION = (
    "the backend an export directory's manifest calls for (with --artifacts), else the "
    "fastest measured for the mode on this device and CPU class: openvino for furious on "
    "CPUs with native bf16 (AVX512-BF16, AMX) and for int8, eager otherwise "
    "(docs/benchmarks.md, 'Backend auto')"
)
# What a user may ask for: auto, or a backend of the registry.
BACKEND_CHOICES: tuple[str, ...] = (AUTO, *BACKENDS)


class BackendChoiceError(ValueError):
    """A backend that cannot run what was asked; the message names both."""


def auto_backend(mode: str, device: str, isa: HostIsa | None = None) -> str:
    """The backend ``auto`` picks for ``mode`` on ``device`` (``isa``: this host's CPU by
    default) without an export directory: the winner of docs/benchmarks.md's
    'Backend auto' for the CPU's class. furious's bf16 image path runs about twice as fast
    in OpenVINO as in eager PyTorch where bf16 is native, and OpenVINO keeps its converted
    model in the cache (only the first start converts); elsewhere eager PyTorch is as fast
    or faster and starts at once. int8 runs only in OpenVINO (or from an export)."""
    if not device.startswith("cpu"):
        return default_backend(mode)
    isa = isa or host_isa()
    if mode == "furious" and isa.native_bf16:
        return "openvino"
    return default_backend(mode)


def choose_backend(requested: str | None, mode: str, device: str, artifacts: str | None) -> str:
    """The backend that runs ``mode`` on ``device`` from ``artifacts`` (an export
    directory) or from weights (``artifacts`` None)."""
    if requested is None or requested == AUTO:
        if artifacts is not None:
            return backend_for_artifacts(artifacts)
        return auto_backend(mode, device)
    if requested not in BACKENDS:
        raise BackendChoiceError(
            f"unknown backend {requested!r}; expected one of {', '.join(BACKEND_CHOICES)}"
        )
    runs_exports = BACKENDS[requested].needs_artifacts
    if runs_exports and artifacts is None:
        from_weights = ", ".join(n for n, info in BACKENDS.items() if not info.needs_artifacts)
        raise BackendChoiceError(
            f"backend {requested!r} runs 'sam2serve export' output: give the export "
            f"directory (artifacts), or a backend that starts from weights: {from_weights}"
        )
    if artifacts is not None and not runs_exports:
        raise BackendChoiceError(
            f"backend {requested!r} starts from weights, but {artifacts!r} is 'sam2serve "
            f"export' output: run it with backend {backend_for_artifacts(artifacts)!r} "
            "(or auto)"
        )
    if artifacts is not None and backend_for_artifacts(artifacts) != requested:
        raise BackendChoiceError(
            f"{artifacts!r} is run by backend {backend_for_artifacts(artifacts)!r}, not "
            f"{requested!r} (or leave the backend to auto)"
        )
    return requested
