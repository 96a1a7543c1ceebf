"""How a mask is written: the output formats of the library, the command line and the service.

Every mask leaves the engine as an uncompressed RLE (:mod:`sam2serve.engine.rle`); a
format turns that one RLE into what the caller asked for. :data:`FORMATS` is the one
registry of them: ``AMGParams.output_mode`` (the library), ``sam2serve run --mask-format``
and the service's ``mask_format`` take their names, descriptions and encoders from it.
``binary_mask`` (a numpy array) is for the library only: it is not JSON.

Importing this module costs no torch (the command line reads the names before the model
loads); encoding reads RLEs with engine.rle, which does import it.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "FORMATS",
    "JSON_FORMATS",
    "MaskFormatInfo",
    "encode_mask",
    "mask_to_png_base64",
    "mask_to_polygons",
]

Rle = dict[str, Any]  # engine.rle.Rle: {"size": [h, w], "counts": [int, ...]}


@dataclass(frozen=True)
class MaskFormatInfo:
    """One way of writing a mask: its name, what it looks like and how it is made."""

    name: str
    # What a value of this format is, for help texts and the API documentation.
    description: str
    # The engine's uncompressed RLE of one mask -> the mask in this format.
    encode: Callable[[Rle], Any]
    # The value is plain JSON (the command line and the service can write it).
    json: bool = True


def _coco_rle(rle: Rle) -> Rle:
    from sam2serve.engine.rle import rle_to_coco

    return rle_to_coco(rle)


def _uncompressed_rle(rle: Rle) -> Rle:
    return {"size": list(rle["size"]), "counts": list(rle["counts"])}


def _binary_mask(rle: Rle) -> np.ndarray:
    from sam2serve.engine.rle import rle_to_mask

    return rle_to_mask(rle)


def _png_base64(rle: Rle) -> str:
    return mask_to_png_base64(_binary_mask(rle))


def _polygon(rle: Rle) -> list[list[float]]:
    return mask_to_polygons(_binary_mask(rle))


# The registry; the service's documentation lists the JSON formats in this order.
FORMATS: dict[str, MaskFormatInfo] = {
    info.name: info
    for info in (
        MaskFormatInfo(
            "coco_rle",
            "{size, counts: str}, pycocotools' compressed RLE",
            _coco_rle,
        ),
        MaskFormatInfo(
            "uncompressed_rle",
            "{size, counts: [int]}, run lengths in column-major order, starting with a run "
            "of zeros",
            _uncompressed_rle,
        ),
        MaskFormatInfo(
            "png_base64",
            "a 1-bit PNG the size of the image, base64-encoded",
            _png_base64,
        ),
        MaskFormatInfo(
            "polygon",
            "the outer boundary of each region as COCO polygons [[x0, y0, x1, y1, ...], ...] "
            "through the pixel-edge midpoints; holes are not represented",
            _polygon,
        ),
        MaskFormatInfo(
            "binary_mask",
            "an (H, W) numpy bool array (library only: not JSON)",
            _binary_mask,
            json=False,
        ),
    )
}
# The formats a JSON output can hold: the choices of the command line and the service.
JSON_FORMATS: tuple[str, ...] = tuple(name for name, info in FORMATS.items() if info.json)


def encode_mask(rle: Rle, name: str) -> Any:
    """One mask, given as the engine's uncompressed RLE, in format ``name``."""
    info = FORMATS.get(name) if isinstance(name, str) else None
    if info is None:
        raise ValueError(
            f"mask format must be one of {', '.join(map(repr, FORMATS))}, got {name!r}"
        )
    return info.encode(rle)


def mask_to_png_base64(mask: np.ndarray) -> str:
    """A 1-bit PNG of the (H, W) bool mask, base64-encoded."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.asarray(mask, dtype=bool)).save(buffer, format="PNG", optimize=False)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def mask_to_polygons(mask: np.ndarray) -> list[list[float]]:
    """Outer boundaries of the mask's regions as COCO polygons ``[x0, y0, x1, y1, ...]``.

    Contours run through the pixel edges' midpoints (marching squares at level 0.5 on the
    mask padded by one pixel), counter-clockwise around set pixels; hole boundaries, which
    wind the other way, are left out as in COCO's polygon format.
    """
    from skimage.measure import find_contours

    padded = np.pad(np.asarray(mask).astype(np.uint8), 1)
    polygons = []
    for contour in find_contours(padded, 0.5, positive_orientation="high"):
        rows, cols = contour[:, 0] - 1, contour[:, 1] - 1
        # Shoelace area in (x=col, y=row): negative for the outer boundaries (holes: positive).
        signed = 0.5 * float(np.dot(cols, np.roll(rows, -1)) - np.dot(rows, np.roll(cols, -1)))
        if signed >= 0 or len(contour) < 3:
            continue
        xy = np.stack([cols, rows], axis=1)
        polygons.append([round(float(v), 2) for v in xy[:-1].reshape(-1)])
    return polygons
