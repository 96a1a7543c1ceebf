"""torch.compile: the mode's eager image path compiled by Inductor on first use (the
warm-up pays for it). What the compilation made is kept in the compile cache
(:mod:`sam2serve.runtime.compile_cache`): a later process with the same model, mode,
device and torch loads it instead of compiling. :func:`export_compile_cache` writes that
compilation ahead of time ('sam2serve export --format compile-cache')."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from sam2serve.checkpoint import load_model
from sam2serve.engine.predictor import Predictor
from sam2serve.modeling.sam2 import SAM2Image
from sam2serve.runtime.build import LoadsWeights, eager_image_path, predictor_for, resolve_dtype
from sam2serve.runtime.compile_cache import CompileCached, compile_identity
from sam2serve.runtime.spec import RuntimeSpec
from sam2serve.runtime.warmup import warm_up

if TYPE_CHECKING:
    from sam2serve.runtime.build import Backend


def compiled_image_path(
    model: SAM2Image,
    spec: RuntimeSpec,
    out: Path | None = None,
    describe: dict[str, Any] | None = None,
) -> CompileCached:
    """The mode's image path through torch.compile, its first call cached (``out``: write
    the compilation there, 'sam2serve export --format compile-cache')."""
    spec = resolve_dtype(spec)
    image_path = eager_image_path(model, spec)
    # The input is always (B, 3, 1024, 1024): only the batch varies, so one graph.
    compiled = torch.compile(image_path, dynamic=False)
    assert spec.dtype is not None  # resolved above
    identity = compile_identity(spec.model, spec.mode, spec.dtype, model.device)
    return CompileCached(compiled, identity, out=out, describe=describe)


def export_compile_cache(
    size: str,
    mode: str,
    out: str | Path,
    *,
    device: str = "cpu",
    checkpoint: str | None = None,
    random_weights: bool = False,
    seed: int = 0,
    command: str | None = None,
    progress: Callable[[str], None] = lambda step: None,
) -> dict[str, Any]:
    """'sam2serve export --format compile-cache': compile ``mode``'s image path of the
    ``size`` model on ``device`` (the warm-up's first call) and write the entry into
    ``out``; returns its manifest. The weights' values are inputs of the compiled graph,
    not part of it: random weights make the same entry as the checkpoint."""
    spec = resolve_dtype(RuntimeSpec(size, mode, "compile", device=device))
    model = load_model(size, checkpoint, random_weights=random_weights, seed=seed, device=device)
    started = time.perf_counter()
    progress("image path: torch.compile (minutes on a CPU)")
    describe = {
        "model": size,
        "mode": mode,
        "precision": spec.dtype,
        "target": compile_identity(size, mode, str(spec.dtype), device)["target"],
        "weights": model.weights_info.as_dict(),
        "command": command,
    }
    image_path = compiled_image_path(model, spec, out=Path(out), describe=describe)
    warm_up(predictor_for(model, spec, image_path))
    if image_path.manifest is None:
        raise OSError(f"torch.compile left nothing to write into {out}")
    return {**image_path.manifest, "export_seconds": round(time.perf_counter() - started, 1)}


class Compiled(LoadsWeights):
    def build_from_model(self, spec: RuntimeSpec, model: SAM2Image) -> Predictor:
        return predictor_for(model, spec, compiled_image_path(model, spec))

    def versions(self) -> dict[str, str]:
        return {"torch": torch.__version__}


BACKEND: Backend = Compiled()  # mypy checks it against the Backend protocol
