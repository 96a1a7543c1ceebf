"""Backends: what executes a mode's image path and decoder. One registry, torch-free.

Each backend is a module with a ``BACKEND`` object implementing :class:`Backend`, listed
once in :data:`BACKENDS` with the devices and modes it supports (read without importing
the module, so the CLI, the bench and config files can offer and check names cheaply).
Adding a backend is one new module here plus one line in :data:`BACKENDS`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from sam2serve.engine.predictor import Predictor
    from sam2serve.modeling.sam2 import SAM2Image
    from sam2serve.runtime.spec import RuntimeSpec, WeightsSource


class Backend(Protocol):
    """How a backend builds the predictor a spec describes."""

    def build(self, spec: RuntimeSpec, weights: WeightsSource) -> Predictor:
        """The predictor for ``spec`` with ``weights`` (checkpoint, random, or artifacts)."""
        ...

    def build_from_model(self, spec: RuntimeSpec, model: SAM2Image) -> Predictor:
        """The predictor for ``spec`` around an already loaded ``model``."""
        ...

    def versions(self) -> dict[str, str]:
        """Versions of the runtimes it uses (written into outputs and manifests)."""
        ...


@dataclass(frozen=True)
class BackendInfo:
    name: str
    description: str
    module: str
    devices: tuple[str, ...]
    # Modes it runs (None: all of them).
    modes: tuple[str, ...] | None = None
    # Whether it starts from 'sam2serve export' artifacts instead of weights.
    needs_artifacts: bool = False

    def load(self) -> Backend:
        backend: Backend = importlib.import_module(self.module).BACKEND
        return backend


_FAST_MODES = ("fast", "furious")
# The torch backends compute in floating point: int8 needs integer kernels (OpenVINO's, via
# NNCF quantisation; ONNX Runtime's).
_FLOAT_MODES = ("baseline", "fast", "furious")
_OPENVINO_MODES = (*_FAST_MODES, "int8")
# What 'sam2serve export --format onnx' writes and backend 'onnxruntime' runs: fp32 graphs,
# or the image encoder quantised to int8.
ONNX_EXPORT = "onnx"
# What 'sam2serve export --format compile-cache' writes: backend compile's compilation, for
# the cache it loads at start-up (sam2serve.runtime.compile_cache).
COMPILE_CACHE_EXPORT = "compile-cache"
COMPILE_CACHE_MODES = ("fast", "furious")
ONNX_MODES = ("fast", "int8")
# What runs video tracking is the trackers' registry: sam2serve.runtime.trackers.
# The devices artifacts are exported for and run on, per image-path format. Manifests,
# loaders and checks are per device (the manifest names the device and the compile
# target), but CUDA is not offered: AOTInductor packages compiled for a GPU crashed the
# process when loaded (docs/benchmarks.md, "GPU").
ARTIFACT_IMAGE_PATH_DEVICES = {"openvino": ("cpu",), "aoti": ("cpu",)}
ARTIFACT_DEVICES = ("cpu",)

BACKENDS: dict[str, BackendInfo] = {
    info.name: info
    for info in (
        BackendInfo(
            "eager",
            "PyTorch eager",
            "sam2serve.runtime.backends.eager",
            ("cpu", "cuda"),
            _FLOAT_MODES,
        ),
        BackendInfo(
            "compile",
            "the image path through torch.compile (Inductor) at start-up",
            "sam2serve.runtime.backends.compiled",
            ("cpu", "cuda"),
            _FLOAT_MODES,
        ),
        BackendInfo(
            "openvino",
            "the image path converted and compiled with OpenVINO at start-up (mode int8: "
            "quantised by NNCF first, on calibration photographs)",
            "sam2serve.runtime.backends.openvino",
            ("cpu",),
            _OPENVINO_MODES,
        ),
        BackendInfo(
            "artifacts",
            "'sam2serve export' artifacts: the image path (OpenVINO or AOTInductor) and the "
            "mask decoder (AOTInductor), nothing compiled at start-up",
            "sam2serve.runtime.backends.artifacts",
            ARTIFACT_DEVICES,
            _OPENVINO_MODES,
            needs_artifacts=True,
        ),
        BackendInfo(
            "onnxruntime",
            "'sam2serve export --format onnx' files through ONNX Runtime: the image encoder "
            "(fp32, or int8 with mode int8) and the prompt decoder",
            "sam2serve.runtime.backends.onnxruntime",
            ("cpu", "cuda"),
            ONNX_MODES,
            needs_artifacts=True,
        ),
    )
}
DEFAULT_BACKEND = "eager"
# What backend 'artifacts' loads, as 'sam2serve export' writes it: the image path as
# OpenVINO (IR + a blob compiled for this CPU) or as an AOTInductor package, and the fast
# mask decoder as AOTInductor programs or left to run eagerly.
ARTIFACT_IMAGE_PATHS = ("openvino", "aoti")
ARTIFACT_DECODERS = ("aoti", "eager")


def get_backend_info(name: str) -> BackendInfo:
    try:
        return BACKENDS[name]
    except KeyError:
        raise ValueError(
            f"unknown backend {name!r}; expected one of {', '.join(BACKENDS)}"
        ) from None
