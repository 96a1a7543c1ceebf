"""Fixed sine position encodings of the video path (no parameters).

Two kinds, both as in Meta's SAM2 so that the numbers agree bit for bit:

* a 2-D encoding of a feature grid (DETR-style, normalised coordinates times 2*pi): the
  FPN neck's encoding of the stride-16 level (the keys of the current frame in memory
  attention) and the memory encoder's encoding of each memory (mem_dim channels);
* a 1-D encoding of a signed frame distance, the temporal position of object pointers.
"""

from __future__ import annotations

import math

import torch


def grid_sine_encoding(
    channels: int, height: int, width: int, device: torch.device, temperature: float = 10000.0
) -> torch.Tensor:
    """(1, channels, height, width): y features in the first half, x in the second; within
    each half, sine of the even frequencies interleaved with cosine of the odd ones."""
    half = channels // 2
    eps, scale = 1e-6, 2 * math.pi
    y = torch.arange(1, height + 1, dtype=torch.float32, device=device).view(1, -1, 1)
    x = torch.arange(1, width + 1, dtype=torch.float32, device=device).view(1, 1, -1)
    y = y.repeat(1, 1, width)
    x = x.repeat(1, height, 1)
    # Coordinates normalised by the last row/column (1-based), as DETR does.
    y = y / (y[:, -1:, :] + eps) * scale
    x = x / (x[:, :, -1:] + eps) * scale
    dim_t = torch.arange(half, dtype=torch.float32, device=device)
    dim_t = temperature ** (2 * (dim_t // 2) / half)
    pos_x = x[..., None] / dim_t
    pos_y = y[..., None] / dim_t
    pos_x = torch.stack((pos_x[..., 0::2].sin(), pos_x[..., 1::2].cos()), dim=4).flatten(3)
    pos_y = torch.stack((pos_y[..., 0::2].sin(), pos_y[..., 1::2].cos()), dim=4).flatten(3)
    return torch.cat((pos_y, pos_x), dim=3).permute(0, 3, 1, 2)


def temporal_sine_encoding(
    positions: torch.Tensor, channels: int, temperature: float = 10000.0
) -> torch.Tensor:
    """(N,) float positions -> (N, channels): all sines, then all cosines."""
    half = channels // 2
    dim_t = torch.arange(half, dtype=torch.float32, device=positions.device)
    dim_t = temperature ** (2 * (dim_t // 2) / half)
    angles = positions.unsqueeze(-1) / dim_t
    return torch.cat([angles.sin(), angles.cos()], dim=-1)
