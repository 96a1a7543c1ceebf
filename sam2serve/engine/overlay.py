"""Masks drawn over their image, for a person to look at (``sam2serve run --overlay``).

Each mask is alpha-blended in its own colour, largest first so small masks stay visible
on top. Prompts, when asked for, are drawn over them: foreground clicks as white dots with
a black edge, background clicks (label 0) as red dots with a white edge, boxes as
rectangles in their mask's colour. Labels (a concept's phrase and score) are drawn on a band
of their mask's colour. A ``stamp`` (the CLI's "RANDOM WEIGHTS") is written in
a red band across the top, so a picture of meaningless masks cannot pass for real ones.
"""

from __future__ import annotations

import colorsys
from collections.abc import Sequence
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from sam2serve.engine.rle import coco_to_rle, rle_to_mask

__all__ = [
    "OVERLAY_ALPHA",
    "STAMP_COLOUR",
    "colour",
    "draw_labels",
    "draw_legend",
    "draw_overlay",
    "draw_stamp",
]

OVERLAY_ALPHA = 0.5
STAMP_COLOUR = (200, 0, 0)
_GOLDEN_RATIO_CONJUGATE = 0.618033988749895
_FIRST_HUE = 0.6  # blue
_FOREGROUND_DOT = ((255, 255, 255), (0, 0, 0))  # fill, outline
_BACKGROUND_DOT = ((230, 0, 0), (255, 255, 255))
_MIN_FONT_SIZE = 9  # pixels: smaller is not worth reading


def colour(index: int) -> np.ndarray:
    """Distinct, bright RGB colours (0-255): hues spaced by the golden ratio, starting from
    blue (the largest mask's), away from the red of the stamp and of skin and wood."""
    hue = (_FIRST_HUE + index * _GOLDEN_RATIO_CONJUGATE) % 1.0
    return np.array(colorsys.hsv_to_rgb(hue, 0.85, 1.0), dtype=np.float32) * 255


def draw_overlay(
    pixels: np.ndarray,
    records: Sequence[dict[str, Any]],
    show_points: bool = False,
    stamp: str | None = None,
    colour_keys: Sequence[int] | None = None,
) -> Image.Image:
    """The (H, W, 3) uint8 image with the records' masks (COCO RLE ``segmentation``) over
    it; ``show_points`` also draws each record's prompt (``point_coords``, with
    ``point_labels`` and ``box`` when it has them); ``stamp`` is written across the top.
    Colours go by area rank, or by ``colour_keys`` (one per record: a tracked object keeps
    its colour from frame to frame)."""
    canvas = pixels.astype(np.float32)
    order = sorted(range(len(records)), key=lambda i: -records[i]["area"])
    colours: dict[int, np.ndarray] = {}
    for rank, index in enumerate(order):
        mask = rle_to_mask(coco_to_rle(records[index]["segmentation"]))
        colours[index] = colour(rank if colour_keys is None else colour_keys[index])
        canvas[mask] = (1 - OVERLAY_ALPHA) * canvas[mask] + OVERLAY_ALPHA * colours[index]
    image = Image.fromarray(np.rint(canvas).clip(0, 255).astype(np.uint8))
    if show_points:
        _draw_prompts(image, records, colours)
    if stamp:
        draw_stamp(image, stamp)
    return image


def _draw_prompts(
    image: Image.Image, records: Sequence[dict[str, Any]], colours: dict[int, np.ndarray]
) -> None:
    draw = ImageDraw.Draw(image)
    radius = max(3, round(min(image.size) / 150))
    for index, record in enumerate(records):
        box = record.get("box")
        if box is not None:
            outline = tuple(int(v) for v in colours.get(index, colour(index)))
            draw.rectangle(box, outline=outline, width=max(2, radius // 2))
        points = record["point_coords"]
        labels = record.get("point_labels") or [1] * len(points)
        for (x, y), label in zip(points, labels, strict=True):
            fill, outline = _FOREGROUND_DOT if label == 1 else _BACKGROUND_DOT
            draw.ellipse(
                (x - radius, y - radius, x + radius, y + radius),
                fill=fill,
                outline=outline,
                width=1,
            )


def draw_labels(
    image: Image.Image, labels: Sequence[tuple[tuple[float, float], str, np.ndarray]]
) -> None:
    """Each ``((x, y), text, colour)``: the text in black on a band of ``colour`` whose
    top-left corner is at (x, y), moved inside the image where it would leave it."""
    draw = ImageDraw.Draw(image)
    font = _label_font(image)
    for (x, y), text, fill in labels:
        left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
        width, height = right - left + 4, bottom - top + 4
        x = min(max(0.0, x), max(0.0, image.width - width))
        y = min(max(0.0, y), max(0.0, image.height - height))
        draw.rectangle((x, y, x + width, y + height), fill=tuple(int(v) for v in fill))
        draw.text((x + 2 - left, y + 2 - top), text, fill=(0, 0, 0), font=font)


def draw_legend(image: Image.Image, entries: Sequence[tuple[str, np.ndarray]]) -> None:
    """``(text, colour)`` rows stacked in the bottom-left corner, the labels' style."""
    draw = ImageDraw.Draw(image)
    font = _label_font(image)
    step = max((draw.textbbox((0, 0), text, font=font)[3] for text, _ in entries), default=0)
    step += 6
    top = image.height - len(entries) * step
    draw_labels(
        image, [((0, top + row * step), text, fill) for row, (text, fill) in enumerate(entries)]
    )


def _label_font(image: Image.Image) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    return _font(max(_MIN_FONT_SIZE, round(min(image.size) / 40)))


def draw_stamp(image: Image.Image, text: str) -> None:
    """``text`` in white on a red band across the top of ``image``, as large as fits; on
    an image too narrow for all of it, only the part before its first colon."""
    width, height = image.size
    band = max(14, min(height // 9, width // 12))
    draw = ImageDraw.Draw(image)
    for candidate in (text, text.split(":")[0]):
        size = round(band * 0.62)
        while True:  # shrink the text until it fits the width
            font = _font(size)
            left, top, right, bottom = draw.textbbox((0, 0), candidate, font=font)
            if right - left <= width * 0.94 or size <= _MIN_FONT_SIZE:
                break
            size = max(_MIN_FONT_SIZE, int(size * 0.9))
        if right - left <= width * 0.94:
            break
    draw.rectangle((0, 0, width, band), fill=STAMP_COLOUR)
    x = (width - (right - left)) / 2 - left
    y = (band - (bottom - top)) / 2 - top
    draw.text((x, y), candidate, fill=(255, 255, 255), font=font)


def _font(size: int) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    """Pillow's bundled scalable font (FreeType builds), else its small bitmap font."""
    try:
        return ImageFont.load_default(size=size)
    except (TypeError, ImportError, OSError):  # Pillow < 10.1 or built without FreeType
        return ImageFont.load_default()
