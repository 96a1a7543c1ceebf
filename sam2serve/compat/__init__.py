"""Meta's image API on sam2serve's engine, for code written against Meta's ``sam2``.

Switch by changing the imports::

    # from sam2.build_sam import build_sam2
    # from sam2.sam2_image_predictor import SAM2ImagePredictor
    # from sam2.automatic_mask_generator import SAM2AutomaticMaskGenerator
    from sam2serve.compat import SAM2AutomaticMaskGenerator, SAM2ImagePredictor, build_sam2

    model = build_sam2("configs/sam2.1/sam2.1_hiera_t.yaml", "sam2.1_hiera_tiny.pt", "cpu")
    predictor = SAM2ImagePredictor(model)           # or SAM2ImagePredictor.from_pretrained("tiny")
    predictor.set_image(image)
    masks, scores, logits = predictor.predict(point_coords=[[500, 375]], point_labels=[1])
    records = SAM2AutomaticMaskGenerator(model).generate(image)

The classes keep Meta's per-image state (that is their API); the engine underneath is
stateless (``sam2serve.engine.predictor.Predictor``), and ``predictor.embedding`` hands
the current embedding to it. A surface over engine and runtime, like the server.
"""

from __future__ import annotations

from sam2serve.compat.build import build_sam2
from sam2serve.compat.image_predictor import SAM2ImagePredictor
from sam2serve.compat.mask_generator import SAM2AutomaticMaskGenerator

__all__ = ["SAM2AutomaticMaskGenerator", "SAM2ImagePredictor", "build_sam2"]
