"""The wire forms of a mask, checked against pycocotools and PIL on hand-made shapes."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import torch
from PIL import Image
from pycocotools import mask as mask_utils

from sam2serve.engine.rle import masks_to_rle
from sam2serve.server.schemas import encode_segmentation, mask_to_polygons


def square_with_hole_and_dot() -> np.ndarray:
    mask = np.zeros((20, 30), dtype=bool)
    mask[5:15, 8:20] = True
    mask[8:11, 12:15] = False  # a hole
    mask[0:3, 0:3] = True  # a second region touching the border
    return mask


@pytest.fixture
def rle():
    return masks_to_rle(torch.from_numpy(square_with_hole_and_dot())[None])[0]


def test_polygons_trace_each_region_and_leave_out_holes():
    mask = square_with_hole_and_dot()
    polygons = mask_to_polygons(mask)
    assert len(polygons) == 2  # two regions; the hole's boundary is not a polygon
    drawn = mask_utils.decode(mask_utils.merge(mask_utils.frPyObjects(polygons, 20, 30)))
    drawn = drawn.astype(bool)
    filled = mask.copy()
    filled[8:11, 12:15] = True
    assert (drawn & mask).sum() >= mask.sum() - 2  # every set pixel but corner cuts
    assert not (drawn & ~filled).any()  # nothing outside the regions


def test_empty_mask_has_no_polygons():
    assert mask_to_polygons(np.zeros((5, 5), dtype=bool)) == []


def test_coco_and_png_forms_decode_to_the_mask(rle):
    mask = square_with_hole_and_dot()
    coco = encode_segmentation(rle, "coco_rle")
    decoded = mask_utils.decode({"size": coco["size"], "counts": coco["counts"].encode()})
    assert np.array_equal(decoded.astype(bool), mask)
    png = base64.b64decode(encode_segmentation(rle, "png_base64"))
    image = Image.open(io.BytesIO(png))
    assert image.mode == "1" and image.size == (30, 20)
    assert np.array_equal(np.asarray(image).astype(bool), mask)
    uncompressed = encode_segmentation(rle, "uncompressed_rle")
    assert uncompressed == {"size": [20, 30], "counts": rle["counts"]}


def test_unknown_format_is_an_error(rle):
    with pytest.raises(ValueError, match="mask_format"):
        encode_segmentation(rle, "jpeg")
