"""sam2serve: a fast, faithful Segment Anything 2 engine for images.

from sam2serve import load_model, Predictor, MaskGenerator
predictor = Predictor(load_model("tiny", random_weights=True))

The names below are imported on first use, so importing a torch-free part of the package
(the command line's parsers, the settings, the runtime vocabulary) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Each public name and the module that defines it.
_EXPORTS = {
    "AMGParams": "sam2serve.engine.amg",
    "CheckpointError": "sam2serve.checkpoint",
    "Embedding": "sam2serve.engine.predictor",
    "ImageError": "sam2serve.engine.image",
    "MaskGenerator": "sam2serve.engine.amg",
    "Prediction": "sam2serve.engine.predictor",
    "Predictor": "sam2serve.engine.predictor",
    "Prompt": "sam2serve.engine.prompts",
    "PromptError": "sam2serve.engine.prompts",
    "load_image": "sam2serve.engine.image",
    "load_model": "sam2serve.checkpoint",
}

__all__ = [
    "AMGParams",
    "CheckpointError",
    "Embedding",
    "ImageError",
    "MaskGenerator",
    "Prediction",
    "Predictor",
    "Prompt",
    "PromptError",
    "load_image",
    "load_model",
]

if TYPE_CHECKING:
    from sam2serve.checkpoint import CheckpointError, load_model
    from sam2serve.engine.amg import AMGParams, MaskGenerator
    from sam2serve.engine.image import ImageError, load_image
    from sam2serve.engine.predictor import Embedding, Prediction, Predictor
    from sam2serve.engine.prompts import Prompt, PromptError


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sam2serve' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
