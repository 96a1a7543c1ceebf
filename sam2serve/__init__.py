"""sam2serve: a fast, faithful Segment Anything 2 engine for images.

from sam2serve import load_model, Predictor, MaskGenerator
predictor = Predictor(load_model("tiny", random_weights=True))
"""

from sam2serve.checkpoint import CheckpointError, load_model
from sam2serve.engine.amg import AMGParams, MaskGenerator
from sam2serve.engine.image import ImageError, load_image
from sam2serve.engine.predictor import Embedding, Prediction, Predictor, PromptError

__all__ = [
    "AMGParams",
    "CheckpointError",
    "Embedding",
    "ImageError",
    "MaskGenerator",
    "Prediction",
    "Predictor",
    "PromptError",
    "load_image",
    "load_model",
]
