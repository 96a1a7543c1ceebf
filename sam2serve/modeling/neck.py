"""FPN neck: projects the four Hiera stages to ``d_model`` channels.

Only the two coarsest kept levels get the top-down path (nearest-neighbour 2x upsampling
plus the lateral projection); the two finest levels are lateral projections only.
The neck's sine position encoding is used by the video memory path alone, so the image
path does not compute it.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import nn


class FpnNeck(nn.Module):
    def __init__(
        self, d_model: int, backbone_channel_list: tuple[int, ...], top_down_levels: tuple[int, ...]
    ) -> None:
        super().__init__()
        # convs[0] projects the coarsest stage (channel lists run lowest resolution first).
        self.convs = nn.ModuleList()
        for channels in backbone_channel_list:
            lateral = nn.Sequential()
            lateral.add_module("conv", nn.Conv2d(channels, d_model, kernel_size=1))
            self.convs.append(lateral)
        self.top_down_levels = tuple(top_down_levels)

    def weight_dtype(self) -> torch.dtype:
        """The dtype of the neck's (and so the encoder's) weights."""
        return cast(nn.Conv2d, self.convs[0].conv).weight.dtype

    def forward(self, stages: list[torch.Tensor]) -> list[torch.Tensor]:
        """``stages`` highest resolution first; returns the levels in the same order."""
        last = len(self.convs) - 1
        out: list[torch.Tensor] = [stages[0]] * len(stages)
        previous: torch.Tensor | None = None
        for level in range(last, -1, -1):
            lateral = self.convs[last - level](stages[level])
            if level in self.top_down_levels and previous is not None:
                top_down = F.interpolate(
                    previous.to(torch.float32), scale_factor=2.0, mode="nearest"
                )
                previous = lateral + top_down
            else:
                previous = lateral
            out[level] = previous
        return out
