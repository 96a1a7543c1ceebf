"""Models and engine predictors for the compatible API: Meta's ways of naming a model
(a Hydra config file, a Hugging Face model id) mapped to our model sizes, and the one
function that turns whatever a user hands a compatible class into an engine Predictor.
"""

from __future__ import annotations

import re
import warnings
from typing import Any

from sam2serve.checkpoint import load_model
from sam2serve.config import MODEL_CONFIGS, parse_hf_id
from sam2serve.engine.predictor import Predictor
from sam2serve.modeling.sam2 import SAM2Image
from sam2serve.runtime.build import build_predictor
from sam2serve.runtime.spec import RuntimeSpec, WeightsSource

__all__ = ["build_sam2", "default_device", "engine_predictor", "load_predictor", "size_of"]

# Meta's short size names in config files (sam2.1_hiera_b+.yaml) -> our sizes.
_CONFIG_SIZES = {"t": "tiny", "s": "small", "b+": "base_plus", "l": "large"}
_CONFIG_NAME = re.compile(r"sam2(\.1)?_hiera_(t|s|b\+|l)(\.yaml)?$")


def size_of(name: str) -> str:
    """Our model size for ``name``: a size (``tiny``), one of Meta's config files
    (``configs/sam2.1/sam2.1_hiera_t.yaml``) or a Hugging Face id
    (``facebook/sam2.1-hiera-tiny``). A SAM 2.0 id is refused: its weights are loaded
    from a checkpoint file (``checkpoint=...``), never swapped for SAM 2.1's."""
    if name in MODEL_CONFIGS:
        return name
    hf = parse_hf_id(name)
    if hf is not None:
        size, is_sam21 = hf
        if not is_sam21:
            raise ValueError(
                f"{name!r} names SAM 2.0 weights: pass model size {size!r} with "
                f"checkpoint='sam2_hiera_{size}.pt' ('sam2serve download --model {name}' "
                "fetches it)"
            )
        return size
    config = _CONFIG_NAME.search(name.replace("\\", "/").rsplit("/", 1)[-1])
    if config is not None:
        return _CONFIG_SIZES[config.group(2)]
    raise ValueError(
        f"unknown model {name!r}; expected a size ({', '.join(MODEL_CONFIGS)}), one of Meta's "
        "config files (configs/sam2.1/sam2.1_hiera_t.yaml, ..._s, ..._b+, ..._l) or a Hugging "
        "Face id (facebook/sam2.1-hiera-tiny, -small, -base-plus, -large)"
    )


def default_device() -> str:
    """CUDA when there is a GPU, else the CPU (Meta's loaders default to CUDA always)."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def build_sam2(
    config_file: str,
    ckpt_path: str | None = None,
    device: str = "cuda",
    mode: str = "eval",
    hydra_overrides_extra: list[str] | None = None,
    apply_postprocessing: bool = True,
    **kwargs: Any,
) -> SAM2Image:
    """Meta's ``sam2.build_sam.build_sam2``: the image model that ``config_file`` names,
    with the weights of ``ckpt_path`` (Meta's checkpoint files load as they are).

    Without a checkpoint Meta's model is randomly initialised; here it gets seeded random
    weights, with a warning. Only what the image predictor uses exists (no Hydra, no
    training mode, Meta's image post-processing always on), so other values are refused.
    """
    if kwargs:
        raise TypeError(f"build_sam2() got unexpected arguments: {', '.join(sorted(kwargs))}")
    if mode != "eval":
        raise ValueError(f"mode must be 'eval' (sam2serve runs inference only), got {mode!r}")
    if hydra_overrides_extra:
        raise ValueError(
            f"hydra_overrides_extra {hydra_overrides_extra!r}: sam2serve has no Hydra "
            "configs; model sizes are sam2serve.config.MODEL_CONFIGS"
        )
    if not apply_postprocessing:
        raise ValueError(
            "apply_postprocessing=False is not supported: the image predictor always uses "
            "Meta's post-processing (dynamic multimask via stability)"
        )
    size = size_of(str(config_file))
    if ckpt_path is None:
        warnings.warn(
            f"build_sam2({config_file!r}) without a checkpoint: random weights (seed 0), "
            "masks are meaningless",
            stacklevel=2,
        )
        return load_model(size, random_weights=True, device=device)
    return load_model(size, checkpoint=ckpt_path, device=device)


def engine_predictor(model: Any, mode: str = "fast") -> Predictor:
    """The engine Predictor for what a compatible class was given: one of our models
    (run the ``mode`` way), an engine Predictor (used as is) or a compatible predictor
    (its engine predictor). Meta's own models are refused with the way round."""
    if isinstance(model, Predictor):
        return model
    engine = getattr(model, "engine", None)
    if isinstance(engine, Predictor):
        return engine
    if isinstance(model, SAM2Image):
        spec = RuntimeSpec(model=model.config.name, mode=mode, device=str(model.device))
        return build_predictor(spec, model=model)
    if type(model).__module__.startswith("sam2."):
        raise TypeError(
            f"got Meta's {type(model).__name__}: build the model with "
            "sam2serve.compat.build_sam2(config_file, ckpt_path) (the same arguments as "
            "Meta's) or use SAM2ImagePredictor.from_pretrained(size, checkpoint=...)"
        )
    raise TypeError(
        f"expected a sam2serve model (load_model, build_sam2), a Predictor or a "
        f"SAM2ImagePredictor, got {type(model).__name__}"
    )


def load_predictor(
    model_id: str = "tiny",
    *,
    checkpoint: str | None = None,
    random_weights: bool = False,
    seed: int = 0,
    device: str | None = None,
    mode: str = "fast",
    backend: str = "eager",
) -> Predictor:
    """The engine Predictor of ``from_pretrained``: the official checkpoint of
    ``model_id``'s size (the cache, or a download; see sam2serve.checkpoint), a given
    ``checkpoint`` or seeded random weights, run the way ``mode`` and ``backend`` say."""
    spec = RuntimeSpec(
        model=size_of(model_id), mode=mode, backend=backend, device=device or default_device()
    )
    weights = WeightsSource(checkpoint=checkpoint, random_weights=random_weights, seed=seed)
    return build_predictor(spec, weights)
