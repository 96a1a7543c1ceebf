"""Masks drawn over their image, for a person to look at (``sam2serve run --overlay``).

Each mask is alpha-blended in its own colour, largest first so small masks stay visible
on top; prompt points, when asked for, are drawn as white dots with a black edge.
"""

from __future__ import annotations

import colorsys
from collections.abc import Sequence
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from sam2serve.engine.rle import coco_to_rle, rle_to_mask

__all__ = ["OVERLAY_ALPHA", "colour", "draw_overlay"]

OVERLAY_ALPHA = 0.5
_GOLDEN_RATIO_CONJUGATE = 0.618033988749895


def colour(index: int) -> np.ndarray:
    """Distinct, bright RGB colours (0-255): hues spaced by the golden ratio."""
    hue = (index * _GOLDEN_RATIO_CONJUGATE) % 1.0
    return np.array(colorsys.hsv_to_rgb(hue, 0.85, 1.0), dtype=np.float32) * 255


def draw_overlay(
    pixels: np.ndarray, records: Sequence[dict[str, Any]], show_points: bool = False
) -> Image.Image:
    """The (H, W, 3) uint8 image with the records' masks (COCO RLE ``segmentation``) over
    it; ``show_points`` also draws each record's ``point_coords``."""
    canvas = pixels.astype(np.float32)
    order = sorted(range(len(records)), key=lambda i: -records[i]["area"])
    for rank, index in enumerate(order):
        mask = rle_to_mask(coco_to_rle(records[index]["segmentation"]))
        canvas[mask] = (1 - OVERLAY_ALPHA) * canvas[mask] + OVERLAY_ALPHA * colour(rank)
    image = Image.fromarray(np.rint(canvas).clip(0, 255).astype(np.uint8))
    if show_points:
        draw = ImageDraw.Draw(image)
        radius = max(3, round(min(image.size) / 150))
        for record in records:
            for x, y in record["point_coords"]:
                draw.ellipse(
                    (x - radius, y - radius, x + radius, y + radius),
                    fill=(255, 255, 255),
                    outline=(0, 0, 0),
                    width=1,
                )
    return image
