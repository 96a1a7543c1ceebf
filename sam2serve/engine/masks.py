"""Mask and crop geometry for automatic mask generation.

Same semantics as Meta's ``sam2/utils/amg.py`` (itself from SAM 1), written for this
package: point grids, crop boxes, the stability score, mask bounding boxes, moving boxes,
points and masks from a crop back to the full image, and small-region clean-up.
Small-region clean-up uses scipy's 8-connected labelling instead of OpenCV's.
"""

from __future__ import annotations

import math
from itertools import product
from typing import Literal

import numpy as np
import torch
from scipy import ndimage

__all__ = [
    "batched_mask_to_box",
    "box_xyxy_to_xywh",
    "build_all_layer_point_grids",
    "build_point_grid",
    "calculate_stability_score",
    "count_set",
    "generate_crop_boxes",
    "is_box_near_crop_edge",
    "remove_small_regions",
    "uncrop_boxes_xyxy",
    "uncrop_masks",
    "uncrop_points",
]

# 8-connectivity: diagonal neighbours join a region, as cv2.connectedComponents(..., 8).
_EIGHT_CONNECTED = np.ones((3, 3), dtype=bool)


def build_point_grid(n_per_side: int) -> np.ndarray:
    """(n*n, 2) grid of (x, y) points in [0, 1]^2, cell centres, x varying fastest."""
    offset = 1 / (2 * n_per_side)
    side = np.linspace(offset, 1 - offset, n_per_side)
    xs, ys = np.meshgrid(side, side)
    return np.stack([xs, ys], axis=-1).reshape(-1, 2)


def build_all_layer_point_grids(
    n_per_side: int, n_layers: int, scale_per_layer: int
) -> list[np.ndarray]:
    """One point grid per crop layer (layer 0 is the whole image); deeper layers'
    crops are smaller, so they get `scale_per_layer` times fewer points per side."""
    return [
        build_point_grid(int(n_per_side / (scale_per_layer**layer)))
        for layer in range(n_layers + 1)
    ]


def _crop_length(image_length: int, n_crops: int, overlap: int) -> int:
    """Side of each of `n_crops` crops that tile `image_length` with `overlap` shared."""
    return math.ceil((overlap * (n_crops - 1) + image_length) / n_crops)


def generate_crop_boxes(
    im_size: tuple[int, ...], n_layers: int, overlap_ratio: float
) -> tuple[list[list[int]], list[int]]:
    """XYXY crop boxes and their layer index: the full image, then (2^(i+1))^2 overlapping
    crops for layer i+1. Overlap is a fraction of the short side, shrinking with depth."""
    im_h, im_w = im_size
    short_side = min(im_h, im_w)
    crop_boxes = [[0, 0, im_w, im_h]]
    layer_idxs = [0]
    for layer in range(1, n_layers + 1):
        n_per_side = 2**layer
        overlap = int(overlap_ratio * short_side * (2 / n_per_side))
        crop_w = _crop_length(im_w, n_per_side, overlap)
        crop_h = _crop_length(im_h, n_per_side, overlap)
        x0s = [int((crop_w - overlap) * i) for i in range(n_per_side)]
        y0s = [int((crop_h - overlap) * i) for i in range(n_per_side)]
        # Column-major over crops (x outer, y inner), the order Meta's AMG produces.
        for x0, y0 in product(x0s, y0s):
            crop_boxes.append([x0, y0, min(x0 + crop_w, im_w), min(y0 + crop_h, im_h)])
            layer_idxs.append(layer)
    return crop_boxes, layer_idxs


def calculate_stability_score(
    mask_logits: torch.Tensor, mask_threshold: float, threshold_offset: float
) -> torch.Tensor:
    """IoU between the masks thresholded at `threshold +- offset` (..., H, W) -> (...).

    The high-threshold mask is always inside the low-threshold one, so the IoU is just
    the ratio of their areas.
    """
    intersections = count_set(mask_logits > (mask_threshold + threshold_offset))
    unions = count_set(mask_logits > (mask_threshold - threshold_offset))
    return intersections / unions


def count_set(masks: torch.Tensor) -> torch.Tensor:
    """Set pixels of bool masks (..., H, W) -> int32 (...), where the masks are.

    On the CPU numpy counts (count_nonzero): torch's sum of a bool tensor runs ~7x slower
    there, and it is most of AMG's stability scores. Elsewhere an int32 sum (no int64 copy
    of the masks)."""
    flat = masks.flatten(-2)
    if flat.device.type != "cpu" or flat.numel() == 0:
        return flat.sum(-1, dtype=torch.int32)
    rows = flat.reshape(-1, flat.shape[-1]).numpy()
    counts = np.count_nonzero(rows, axis=-1).astype(np.int32)
    return torch.from_numpy(counts).reshape(flat.shape[:-1])


def batched_mask_to_box(masks: torch.Tensor) -> torch.Tensor:
    """XYXY boxes (int64, inclusive max) around bool masks (..., H, W) -> (..., 4).

    An empty mask gets [0, 0, 0, 0].
    """
    *batch_shape, h, w = masks.shape
    if masks.numel() == 0:
        return torch.zeros(*batch_shape, 4, dtype=torch.int64, device=masks.device)
    # any() over bool reduces ~10-20x slower on the CPU than amax() over the same bytes.
    as_bytes = (masks if masks.dtype == torch.bool else masks != 0).view(torch.uint8)
    rows = as_bytes.amax(dim=-1).bool()  # (..., H): row has a set pixel
    cols = as_bytes.amax(dim=-2).bool()  # (..., W)
    y = torch.arange(h, device=masks.device)
    x = torch.arange(w, device=masks.device)
    # Unset rows/columns are pushed out of range so min/max skip them.
    top = torch.where(rows, y, h).amin(dim=-1)
    bottom = torch.where(rows, y, -1).amax(dim=-1)
    left = torch.where(cols, x, w).amin(dim=-1)
    right = torch.where(cols, x, -1).amax(dim=-1)
    boxes = torch.stack([left, top, right, bottom], dim=-1)
    is_empty = ~rows.any(dim=-1)
    return boxes.masked_fill(is_empty.unsqueeze(-1), 0)


def _shifted(coords: torch.Tensor, offsets: tuple[int, ...]) -> torch.Tensor:
    """``coords`` (..., K) plus ``offsets[k]`` in column k. Python scalars, not a tensor
    of offsets: on a GPU that tensor would be a host-to-device copy waiting for the stream."""
    if not any(offsets):
        return coords.clone()
    columns = [coords[..., k] + offset for k, offset in enumerate(offsets)]
    return torch.stack(columns, dim=-1)


def uncrop_boxes_xyxy(boxes: torch.Tensor, crop_box: list[int]) -> torch.Tensor:
    """Move XYXY boxes (..., 4) from crop coordinates to full-image coordinates."""
    x0, y0, _, _ = crop_box
    return _shifted(boxes, (x0, y0, x0, y0))


def uncrop_points(points: torch.Tensor, crop_box: list[int]) -> torch.Tensor:
    """Move (x, y) points (..., 2) from crop coordinates to full-image coordinates."""
    x0, y0, _, _ = crop_box
    return _shifted(points, (x0, y0))


def uncrop_masks(
    masks: torch.Tensor, crop_box: list[int], orig_h: int, orig_w: int
) -> torch.Tensor:
    """Zero-pad crop masks (..., h, w) to the full image (..., orig_h, orig_w)."""
    x0, y0, x1, y1 = crop_box
    if (x0, y0, x1, y1) == (0, 0, orig_w, orig_h):
        return masks
    pad_x = orig_w - (x1 - x0)
    pad_y = orig_h - (y1 - y0)
    # F.pad takes (left, right, top, bottom) for the last two dims.
    return torch.nn.functional.pad(masks, (x0, pad_x - x0, y0, pad_y - y0), value=0)


def is_box_near_crop_edge(
    boxes: torch.Tensor, crop_box: list[int], orig_box: list[int], atol: float = 20.0
) -> torch.Tensor:
    """(N,) bool: the box (in crop coordinates) touches a crop edge that is not also an
    edge of the original image, i.e. the mask is probably cut off by the crop."""
    boxes = uncrop_boxes_xyxy(boxes, crop_box).float()
    # Column by column against Python scalars (no host-to-device copy); |a - b| <= atol
    # is torch.isclose with rtol 0 on finite values.
    cut_off = torch.zeros(boxes.shape[:1], dtype=torch.bool, device=boxes.device)
    for k, (crop_edge, image_edge) in enumerate(zip(crop_box, orig_box, strict=True)):
        near_crop_edge = (boxes[:, k] - float(crop_edge)).abs() <= atol
        near_image_edge = (boxes[:, k] - float(image_edge)).abs() <= atol
        cut_off |= near_crop_edge & ~near_image_edge
    return cut_off


def box_xyxy_to_xywh(box_xyxy: torch.Tensor) -> torch.Tensor:
    """XYXY -> XYWH over the last dim (a single box or a batch); returns a new tensor."""
    xy = box_xyxy[..., :2]
    wh = box_xyxy[..., 2:] - xy
    return torch.cat([xy, wh], dim=-1)


def remove_small_regions(
    mask: np.ndarray | torch.Tensor,
    area_thresh: float,
    mode: Literal["holes", "islands"],
) -> tuple[np.ndarray, bool]:
    """Fill holes or drop islands smaller than `area_thresh` pixels in a (H, W) mask.

    Regions are 8-connected. "holes" fills background regions (including ones touching
    the border) smaller than the threshold; "islands" removes foreground regions smaller
    than it, but if every island is small the largest one is kept so the mask never
    becomes empty. Returns the mask (a host bool array) and whether it changed.
    """
    if mode not in ("holes", "islands"):
        raise ValueError(f"mode must be 'holes' or 'islands', got {mode!r}")
    if isinstance(mask, torch.Tensor):
        mask = mask.detach().cpu().numpy()
    mask = np.asarray(mask, dtype=bool)
    fill_holes = mode == "holes"
    # Label the regions we may change: background for holes, foreground for islands.
    working = mask ^ fill_holes
    labels, n_regions = ndimage.label(working, structure=_EIGHT_CONNECTED)
    sizes = np.bincount(labels.ravel(), minlength=n_regions + 1)[1:]
    is_small = sizes < area_thresh
    if not is_small.any():
        return mask, False

    # Lookup table from label to output value; label 0 is the complement of `working`.
    if fill_holes:
        lut = np.concatenate(([True], is_small))  # mask pixels stay, small holes fill in
    else:
        keep = ~is_small
        if not keep.any():
            keep[np.argmax(sizes)] = True  # first largest, in raster order of labels
        lut = np.concatenate(([False], keep))
    return lut[labels], True
