"""The same random weights in our model and in Meta's, loaded from one checkpoint file
shaped like an official one (``{"model": state_dict}`` with the video keys included)."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from reference import import_reference

from sam2serve.checkpoint import random_state_dict
from sam2serve.config import get_config

META_CONFIGS = {"tiny": "t", "small": "s", "base_plus": "b+", "large": "l"}


def build_meta_model(size: str) -> torch.nn.Module:
    """Meta's SAM2Base for ``size`` (apply_postprocessing as in build_sam2), random init."""
    import_reference()
    warnings.filterwarnings("ignore", module="hydra")
    warnings.filterwarnings("ignore", category=UserWarning, message=".*register_new_resolver.*")
    from sam2.build_sam import build_sam2

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1234)
        return build_sam2(f"configs/sam2.1/sam2.1_hiera_{META_CONFIGS[size]}.yaml", None, "cpu")


def write_official_like_checkpoint(size: str, seed: int, path: Path) -> Path:
    """Our seeded random image weights (every tensor perturbed, so each one matters) plus
    Meta's video/memory tensors, saved as ``{"model": ...}`` like Meta's published files."""
    image_state = random_state_dict(get_config(size), seed)
    full = dict(build_meta_model(size).state_dict())
    assert set(image_state) <= set(full), "our keys must be a subset of Meta's"
    full.update(image_state)
    torch.save({"model": full}, path)
    return path


def load_meta_model(size: str, checkpoint: Path) -> torch.nn.Module:
    """Meta's model with Meta's own loader (strict about every key) from ``checkpoint``."""
    import_reference()
    from sam2.build_sam import _load_checkpoint

    model = build_meta_model(size)
    _load_checkpoint(model, str(checkpoint))
    return model.eval()
