"""RoIAlign with torchvision's semantics, in plain torch.

SAM 3 pools image features inside each exemplar box with ``torchvision.ops.roi_align``
(output 7x7, spatial_scale 1, adaptive sampling ratio, ``aligned=False``); torchvision is
not a dependency of this project (it cannot be installed next to every torch build), so
the same arithmetic is written here: for each output bin, the mean of
``ceil(roi_size / output_size)`` x ... bilinear samples, with torchvision's border rules
(a sample more than one pixel outside the map counts as 0; others are clamped).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def _bilinear(feature: Tensor, ys: Tensor, xs: Tensor) -> Tensor:
    """feature (C, H, W) sampled at every (ys[i], xs[j]) -> (C, len(ys), len(xs))."""
    height, width = feature.shape[-2:]

    def axis(coords: Tensor, size: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        inside = (coords >= -1.0) & (coords <= size)
        c = coords.clamp(min=0.0)
        low = c.floor().long()
        at_edge = low >= size - 1
        low = torch.where(at_edge, torch.full_like(low, size - 1), low)
        high = torch.where(at_edge, low, low + 1)
        c = torch.where(at_edge, low.to(c.dtype), c)
        frac = c - low.to(c.dtype)
        return low, high, frac, inside

    y_low, y_high, ly, y_in = axis(ys, height)
    x_low, x_high, lx, x_in = axis(xs, width)
    hy, hx = 1.0 - ly, 1.0 - lx
    rows_low, rows_high = feature[:, y_low, :], feature[:, y_high, :]
    value = (
        hy[:, None] * hx[None, :] * rows_low[:, :, x_low]
        + hy[:, None] * lx[None, :] * rows_low[:, :, x_high]
        + ly[:, None] * hx[None, :] * rows_high[:, :, x_low]
        + ly[:, None] * lx[None, :] * rows_high[:, :, x_high]
    )
    return value * (y_in[:, None] & x_in[None, :]).to(value.dtype)


def roi_align(
    features: Tensor, boxes: list[Tensor] | tuple[Tensor, ...], output_size: int
) -> Tensor:
    """features (B, C, H, W); boxes[b] (K_b, 4) xyxy in feature pixels -> (sum K_b, C, S, S)."""
    out = []
    for index, image_boxes in enumerate(boxes):
        feature = features[index]
        for box in image_boxes.to(torch.float32).tolist():
            x1, y1, x2, y2 = box
            roi_w, roi_h = max(x2 - x1, 1.0), max(y2 - y1, 1.0)
            bin_w, bin_h = roi_w / output_size, roi_h / output_size
            grid_w, grid_h = math.ceil(roi_w / output_size), math.ceil(roi_h / output_size)
            iy = torch.arange(grid_h, dtype=torch.float32)
            ix = torch.arange(grid_w, dtype=torch.float32)
            bins = torch.arange(output_size, dtype=torch.float32)
            ys = (y1 + bins[:, None] * bin_h + (iy[None, :] + 0.5) * bin_h / grid_h).flatten()
            xs = (x1 + bins[:, None] * bin_w + (ix[None, :] + 0.5) * bin_w / grid_w).flatten()
            sampled = _bilinear(feature.float(), ys, xs)  # (C, S*gh, S*gw)
            channels = sampled.shape[0]
            pooled = sampled.view(channels, output_size, grid_h, output_size, grid_w).mean((2, 4))
            out.append(pooled.to(features.dtype))
    if not out:
        return features.new_zeros((0, features.shape[1], output_size, output_size))
    return torch.stack(out)
