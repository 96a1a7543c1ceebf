"""How far a mode's concept instances are from the baseline's on identical weights: mask IoU
and score difference of the best queries (the bench's accuracy columns, the modes' tests).
The modes themselves are SAM 2.1's (:mod:`sam2serve.runtime.modes`), applied to SAM 3 by
:mod:`sam2serve.runtime.concepts`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sam2serve.concepts.engine import Instance

__all__ = ["Agreement", "agreement", "mask_iou"]


def mask_iou(a: np.ndarray, b: np.ndarray) -> float:
    """IoU of two bool masks; two empty masks agree (1.0)."""
    union = np.logical_or(a, b).sum()
    return 1.0 if union == 0 else float(np.logical_and(a, b).sum() / union)


@dataclass(frozen=True)
class Agreement:
    miou: float  # mean IoU of the compared instances' masks
    max_score_diff: float  # largest |score - reference score| among them
    compared: int  # instances compared


def agreement(reference: Sequence[Instance], other: Sequence[Instance], top_k: int) -> Agreement:
    """``other`` against ``reference``, instances matched by query index: both lists must
    hold every query in query order (score threshold 0). The ``top_k`` queries with the
    highest reference scores are compared: mIoU of their masks, largest score difference."""
    if len(reference) != len(other):
        raise ValueError(
            f"instances are matched by query index, so both runs must keep every query "
            f"(score threshold 0); got {len(reference)} and {len(other)}"
        )
    if top_k < 1:
        raise ValueError(f"top_k must be at least 1; got {top_k}")
    order = sorted(range(len(reference)), key=lambda i: -reference[i].score)[:top_k]
    if not order:
        return Agreement(1.0, 0.0, 0)
    ious = [mask_iou(reference[i].mask, other[i].mask) for i in order]
    diffs = [abs(reference[i].score - other[i].score) for i in order]
    return Agreement(float(np.mean(ious)), float(max(diffs)), len(order))
