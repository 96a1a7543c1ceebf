"""Meta's ``SAM2AutomaticMaskGenerator`` API on the engine's :class:`MaskGenerator`.

The parameters are Meta's, by name and default (``sam2serve.engine.amg_params.AMGParams``
holds them, ``output_mode`` defaulting to ``"binary_mask"`` as Meta's), and ``generate``
returns Meta's records in Meta's order. Differences, from the engine: unknown or invalid
parameters raise an error naming them (Meta ignores unknown ones), and
``min_mask_region_area`` cleans the final masks on any device (SAM 1's clean-up) where
Meta's generator hands it to a CUDA-only kernel (see ``sam2serve.engine.amg``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sam2serve.compat.build import engine_predictor, load_predictor
from sam2serve.compat.image_predictor import SAM2ImagePredictor
from sam2serve.engine.amg import AMGParams, MaskGenerator, MaskRecord

__all__ = ["SAM2AutomaticMaskGenerator"]

# The arguments of from_pretrained that choose the model; the others are AMG parameters.
_LOAD_ARGUMENTS = ("checkpoint", "random_weights", "seed", "device", "mode", "backend")


class SAM2AutomaticMaskGenerator:
    """Drop-in for ``sam2.automatic_mask_generator.SAM2AutomaticMaskGenerator``.

    ``SAM2AutomaticMaskGenerator(model, points_per_side=32, ..., output_mode="binary_mask")``
    takes one of our models, an engine ``Predictor`` or a compatible
    ``SAM2ImagePredictor``, and every keyword argument of Meta's generator.
    """

    def __init__(self, model: Any, **params: Any) -> None:
        engine = engine_predictor(model)
        self.params = AMGParams.from_dict(params)  # Meta's defaults for what is not given
        self.predictor = SAM2ImagePredictor(engine)
        self._generator = MaskGenerator(engine, self.params)

    @classmethod
    def from_pretrained(cls, model_id: str = "tiny", **kwargs: Any) -> SAM2AutomaticMaskGenerator:
        """A generator for ``model_id`` (see ``SAM2ImagePredictor.from_pretrained``, whose
        keyword arguments choose the weights, device and mode); the other keyword
        arguments are AMG parameters."""
        load = {name: kwargs.pop(name) for name in _LOAD_ARGUMENTS if name in kwargs}
        return cls(load_predictor(model_id, **load), **kwargs)

    def __getattr__(self, name: str) -> Any:
        """Meta's generator keeps each parameter as an attribute (``points_per_batch``,
        ``pred_iou_thresh``, ...); they are read from the parameters here."""
        params = self.__dict__.get("params")
        if params is not None and name in AMGParams.defaults():
            return getattr(params, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def point_grids(self) -> list[np.ndarray]:
        """The normalised click grid of each crop layer, as Meta's attribute."""
        return [np.asarray(grid) for grid in self.params.layer_point_grids()]

    def generate(self, image: Any) -> list[MaskRecord]:
        """Mask records for ``image`` (an (H, W, 3) uint8 array; a path, bytes or PIL image
        also do): ``segmentation`` (in ``output_mode``), ``area``, ``bbox`` (XYWH),
        ``predicted_iou``, ``point_coords``, ``stability_score``, ``crop_box``."""
        return self._generator.generate(image)
