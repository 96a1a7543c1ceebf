"""Meta's small-component clean-up of mask logits (``fill_holes_in_mask_scores``), used by
SAM 3's video predictor on tracked and newly detected masks.

Background components of at most ``max_area`` pixels become foreground (logit 0.1); then
foreground components of at most min(``max_area``, half the mask's area) become background
(-0.1). Components are 8-connected (skimage's default, which Meta calls on a CPU; scipy's
labelling here).
"""

from __future__ import annotations

import numpy as np
import torch
from scipy import ndimage
from torch import Tensor

_EIGHT = np.ones((3, 3), dtype=bool)


def component_areas(mask: np.ndarray) -> np.ndarray:
    """bool (H, W) -> int (H, W): each pixel's component area (0 outside the mask)."""
    labels, count = ndimage.label(mask, structure=_EIGHT)
    if count == 0:
        return np.zeros(mask.shape, dtype=np.int64)
    areas = np.bincount(labels.ravel())
    areas[0] = 0
    per_pixel: np.ndarray = areas[labels]
    return per_pixel


def fill_holes(logits: Tensor, max_area: int) -> Tensor:
    """(B, 1, H, W) mask logits with small holes filled and small sprinkles removed."""
    if max_area <= 0 or logits.shape[0] == 0:
        return logits
    background = (logits <= 0).cpu().numpy()[:, 0]
    bg_areas = np.stack([component_areas(m) for m in background])
    small_bg = torch.from_numpy(background & (bg_areas <= max_area))[:, None]
    logits = torch.where(small_bg.to(logits.device), 0.1, logits)
    foreground = (logits > 0).cpu().numpy()[:, 0]
    fg_areas = np.stack([component_areas(m) for m in foreground])
    limit = np.minimum(foreground.sum(axis=(1, 2)) // 2, max_area)[:, None, None]
    small_fg = torch.from_numpy(foreground & (fg_areas <= limit))[:, None]
    return torch.where(small_fg.to(logits.device), -0.1, logits)


__all__ = ["component_areas", "fill_holes"]
