"""RoIAlign with torchvision's semantics, in plain torch, on the features' device.

SAM 3 pools image features inside each exemplar box with ``torchvision.ops.roi_align``
(output S x S = 7 x 7, spatial_scale 1, adaptive sampling ratio, ``aligned=False``);
torchvision is not a dependency of this project (it cannot be installed next to every torch
build), so the same arithmetic is written here: each output bin is the mean of
``ceil(roi_h / S) x ceil(roi_w / S)`` bilinear samples, with torchvision's border rules (a
sample more than one pixel outside the map counts as 0; others are clamped to it).

The number of samples depends on the box's size, a value on the device. Reading it back
would stall a GPU on every request (the text-only prompt carries one padding box too), so
the shapes here depend on the feature map only: a bilinear sample is a weighted sum of the
map's rows times a weighted sum of its columns, so a bin's mean is ``A_y @ F @ A_x^T`` where
``A_y[bin, row]`` sums the row weights of the bin's samples (likewise ``A_x``). Only the
samples within one pixel of the map have weights, and consecutive samples are more than
half a pixel apart once a box spans more than S pixels (fewer than S samples otherwise), so
a window of ``max(S, 2 * size + 5)`` samples per axis, placed on the device where the first
one on the map falls, holds every sample that counts: no host read, any box.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _axis_weights(start: Tensor, end: Tensor, size: int, bins: int) -> tuple[Tensor, Tensor]:
    """One axis of every box: ``start``/``end`` (N,) in feature pixels -> the bins' summed
    bilinear weights over the map's ``size`` rows (N, bins, size) and the samples per bin
    (N,), as torchvision places the samples (float32, on the boxes' device)."""
    extent = torch.clamp(end - start, min=1.0)
    bin_size = extent / bins
    grid = torch.ceil(extent / bins)  # samples per bin
    step = bin_size / grid
    window = max(bins, 2 * size + 5)
    # The first sample at or after -1 (samples before it weigh 0), one early for rounding.
    first = torch.floor((-1.0 - start) / step - 0.5) - 1.0
    first = torch.clamp(first, min=0.0).long()
    index = first[:, None] + torch.arange(window, device=start.device)  # (N, window)
    per_bin = grid.long()[:, None]
    which_bin, within = index // per_bin, index % per_bin
    counted = which_bin < bins
    # torchvision: start + bin * bin_size + (i + 0.5) * bin_size / grid, in that order.
    coord = (
        start[:, None]
        + which_bin.to(start.dtype) * bin_size[:, None]
        + (within.to(start.dtype) + 0.5) * bin_size[:, None] / grid[:, None]
    )
    inside = counted & (coord >= -1.0) & (coord <= size)
    coord = coord.clamp(min=0.0)
    low = coord.floor().long()
    at_edge = low >= size - 1
    low = torch.where(at_edge, size - 1, low)
    high = torch.where(at_edge, low, low + 1)
    coord = torch.where(at_edge, low.to(coord.dtype), coord)
    frac = coord - low.to(coord.dtype)
    weight = inside.to(coord.dtype)
    rows = torch.zeros(*index.shape, size, dtype=coord.dtype, device=coord.device)
    rows.scatter_add_(-1, low[..., None], ((1.0 - frac) * weight)[..., None])
    rows.scatter_add_(-1, high[..., None], (frac * weight)[..., None])
    to_bin = torch.nn.functional.one_hot(which_bin.clamp(max=bins - 1), bins)
    to_bin = to_bin.to(coord.dtype) * counted[..., None].to(coord.dtype)
    return torch.einsum("nkb,nks->nbs", to_bin, rows), grid


def _pool(features: Tensor, rows: Tensor, cols: Tensor) -> Tensor:
    """features (b, C, H, W) float32; rows (b, K, S, H), cols (b, K, S, W) -> (b * K, C, S, S):
    ``rows @ feature @ cols^T`` per box, the columns first (one matrix product per call)."""
    b, k, s, width = cols.shape
    channels, height = features.shape[1], features.shape[2]
    by_cols = torch.matmul(features, cols.reshape(b, 1, k * s, width).transpose(-1, -2))
    by_cols = by_cols.view(b, channels, height, k, s)  # (b, C, H, K, S)
    pooled = torch.einsum("bkyh,bchkx->bkcyx", rows, by_cols)
    return pooled.reshape(b * k, channels, s, s)


def roi_align(
    features: Tensor, boxes: list[Tensor] | tuple[Tensor, ...], output_size: int
) -> Tensor:
    """features (B, C, H, W); boxes[b] (K_b, 4) xyxy in feature pixels -> (sum K_b, C, S, S),
    computed in float32 on the features' device, returned in their dtype."""
    height, width = features.shape[-2:]
    counts = [int(image_boxes.shape[0]) for image_boxes in boxes]
    if sum(counts) == 0:
        return features.new_zeros((0, features.shape[1], output_size, output_size))
    xyxy = torch.cat(list(boxes)).to(device=features.device, dtype=torch.float32)
    rows, grid_h = _axis_weights(xyxy[:, 1], xyxy[:, 3], height, output_size)
    cols, grid_w = _axis_weights(xyxy[:, 0], xyxy[:, 2], width, output_size)
    cols = cols / (grid_h * grid_w).clamp(min=1.0)[:, None, None]  # the bins' means
    used = [index for index, count in enumerate(counts) if count]
    if len(set(counts)) == 1:  # as transformers calls it: the same count for every image
        k = counts[0]
        shape = (len(counts), k, output_size)
        pooled = _pool(features.float(), rows.view(*shape, height), cols.view(*shape, width))
    else:
        starts = [sum(counts[:index]) for index in used]
        pooled = torch.cat(
            [
                _pool(
                    features[index : index + 1].float(),
                    rows[start : start + counts[index]][None],
                    cols[start : start + counts[index]][None],
                )
                for index, start in zip(used, starts, strict=True)
            ]
        )
    return pooled.to(features.dtype)
