"""torch.compile: the mode's eager image path compiled by Inductor on first use (the
warm-up pays for it). What the compilation made is kept in the compile cache
(:mod:`sam2serve.runtime.compile_cache`): a later process with the same model, mode,
device and torch loads it instead of compiling."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from sam2serve.engine.predictor import Predictor
from sam2serve.modeling.sam2 import SAM2Image
from sam2serve.runtime.build import LoadsWeights, eager_image_path, predictor_for, resolve_dtype
from sam2serve.runtime.compile_cache import CompileCached, compile_identity
from sam2serve.runtime.spec import RuntimeSpec

if TYPE_CHECKING:
    from sam2serve.runtime.backends import Backend


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


class Compiled(LoadsWeights):
    def build_from_model(self, spec: RuntimeSpec, model: SAM2Image) -> Predictor:
        return predictor_for(model, spec, compiled_image_path(model, spec))

    def versions(self) -> dict[str, str]:
        return {"torch": torch.__version__}


BACKEND: Backend = Compiled()  # mypy checks it against the Backend protocol
