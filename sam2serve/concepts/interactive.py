"""SAM 3 interactive: points, boxes and mask inputs on an image, answered by SAM 3's tracker
heads over the image's SAM 3 encoding (Meta's ``Sam3Image.predict_inst``).

The image side is the sam2 neck's, projected once per image with the encoding
(:meth:`~sam2serve.concepts.tracker_heads.TrackerHeads.embedding`, kept in
:attr:`~sam2serve.concepts.engine.ConceptEncoding.tracker`); the prompts are SAM 2.1's, and so
is the predictor (:class:`~sam2serve.engine.predictor.Predictor`: coordinates scaled to the
1008 frame, a box as two corner points before the clicks, a padding point, dynamic
multimask, low-res logits (288² at 1008 px) clamped to +-32). SAM 3 differs in one step,
which this module adds: Meta's ``SAM3InteractiveImagePredictor`` builds its transforms with
``max_hole_area=256``, so before the low-res logits are upsampled every background region
(logit <= 0, 8-connected, counted on the low-res grid) of at most 256 cells becomes
foreground (logit 10). The returned low-res logits are the decoder's, not filled, as Meta's.

Meta labels the regions with ``cc_torch`` or its Triton kernel on a GPU and with
scikit-image on the CPU; where none of them imports it skips the step with a warning (its
real stack from PyPI on a CPU: scikit-image is not among sam3's dependencies).
``max_hole_area=0`` answers as it does then. Here the regions are labelled with
scikit-image (a dependency of this project), on the host: one copy of the low-res masks.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import Tensor

from sam2serve.concepts.tracker_heads import TrackerHeads
from sam2serve.engine.predictor import Predictor

# Meta's SAM3InteractiveImagePredictor defaults (sam3 0.1.4)
MASK_THRESHOLD = 0.0
MAX_HOLE_AREA = 256
HOLE_FILL = 10.0  # what a filled hole's logits become, above the threshold


def fill_holes(low_res: Tensor, max_area: int, threshold: float = MASK_THRESHOLD) -> Tensor:
    """(N, h, w) logits with every background region (``<= threshold``, 8-connected) of at
    most ``max_area`` cells set to ``threshold + 10`` (Meta's ``SAM2Transforms`` rule)."""
    if max_area <= 0 or low_res.numel() == 0:
        return low_res
    from skimage.measure import label

    background = (low_res <= threshold).cpu().numpy()
    holes = np.zeros_like(background)
    for i, region in enumerate(background):
        labels = label(region, connectivity=2)  # 8-connected, as Meta's kernels
        counts = np.bincount(labels.ravel())
        small = counts <= max_area
        small[0] = False  # label 0 is the foreground
        holes[i] = small[labels]
    if not holes.any():
        return low_res
    fill = torch.from_numpy(holes).to(low_res.device, non_blocking=True)
    return torch.where(fill, threshold + HOLE_FILL, low_res)


class InteractivePredictor(Predictor):
    """SAM 2.1's stateless predictor on SAM 3's tracker heads, with SAM 3's hole filling
    before the upsampling (:func:`fill_holes`). Its embeddings are the encodings'
    :attr:`~sam2serve.concepts.engine.ConceptEncoding.tracker`."""

    def __init__(
        self, heads: TrackerHeads, max_hole_area: int = MAX_HOLE_AREA, **kwargs: Any
    ) -> None:
        if max_hole_area < 0:
            raise ValueError(f"max_hole_area must be >= 0; got {max_hole_area}")
        super().__init__(heads.heads, mask_threshold=MASK_THRESHOLD, **kwargs)
        self.tracker_heads = heads
        self.max_hole_area = max_hole_area

    def upscale_chunks(
        self, low_res: Tensor, size: tuple[int, int], return_logits: bool = False
    ) -> Iterator[tuple[int, Tensor]]:
        """SAM 2.1's chunked upsampling of (N, h, w) low-res logits, each chunk's holes
        filled first."""
        step = self.masks_per_chunk(size)
        for start in range(0, low_res.shape[0], step):
            chunk = fill_holes(
                low_res[start : start + step], self.max_hole_area, self.mask_threshold
            )
            for offset, part in super().upscale_chunks(chunk, size, return_logits):
                yield start + offset, part
