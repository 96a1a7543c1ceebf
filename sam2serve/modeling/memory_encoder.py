"""Memory encoder: an object's mask on a frame + the frame's features -> one memory.

The mask (1024x1024, already squashed to [-10, 10] by the caller) is downsampled 16x by
four stride-2 convolutions, added to a projection of the frame's stride-16 features, mixed
by two ConvNeXt blocks and projected to mem_dim (64) channels: a 64x64 memory that memory
attention reads on later frames. Its position encoding is a fixed 2-D sine grid.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sam2serve.modeling.common import LayerNorm2d
from sam2serve.modeling.sine_encoding import grid_sine_encoding


class MaskDownSampler(nn.Module):
    """4 x (conv 3x3 stride 2, LayerNorm2d, GELU), channels 1 -> 4 -> 16 -> 64 -> 256, then a
    1x1 conv to ``embed_dim`` (parameters ``encoder.{0,1,3,4,6,7,9,10,12}`` as Meta's)."""

    def __init__(self, embed_dim: int = 256, num_layers: int = 4, stride: int = 2) -> None:
        super().__init__()
        self.encoder = nn.Sequential()
        channels = 1
        for _ in range(num_layers):
            out = channels * stride**2
            self.encoder.append(nn.Conv2d(channels, out, kernel_size=3, stride=stride, padding=1))
            self.encoder.append(LayerNorm2d(out))
            self.encoder.append(nn.GELU())
            channels = out
        self.encoder.append(nn.Conv2d(channels, embed_dim, kernel_size=1))

    def forward(self, masks: torch.Tensor) -> torch.Tensor:
        encoded: torch.Tensor = self.encoder(masks)
        return encoded


class CXBlock(nn.Module):
    """ConvNeXt block: depthwise 7x7, LayerNorm, pointwise MLP (as Linear layers, channels
    last), layer scale ``gamma``, residual."""

    def __init__(self, dim: int = 256, kernel_size: int = 7) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, kernel_size, padding=kernel_size // 2, groups=dim)
        self.norm = LayerNorm2d(dim)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(1e-6 * torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(self.dwconv(x)).permute(0, 2, 3, 1)
        y = self.gamma * self.pwconv2(F.gelu(self.pwconv1(y)))
        out: torch.Tensor = x + y.permute(0, 3, 1, 2)
        return out


class Fuser(nn.Module):
    def __init__(self, dim: int = 256, num_layers: int = 2) -> None:
        super().__init__()
        self.layers = nn.ModuleList(CXBlock(dim) for _ in range(num_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class MemoryEncoder(nn.Module):
    def __init__(self, in_dim: int = 256, out_dim: int = 64) -> None:
        super().__init__()
        self.mask_downsampler = MaskDownSampler(in_dim)
        self.pix_feat_proj = nn.Conv2d(in_dim, in_dim, kernel_size=1)
        self.fuser = Fuser(in_dim)
        self.out_proj = nn.Conv2d(in_dim, out_dim, kernel_size=1)
        self.out_dim = out_dim

    def forward(self, pix_feat: torch.Tensor, mask_input: torch.Tensor) -> torch.Tensor:
        """pix_feat (B, C, 64, 64) raw stride-16 features; mask_input (B, 1, 1024, 1024)
        already scaled (sigmoid or binarized, * 20 - 10) -> memory (B, out_dim, 64, 64)."""
        x = self.pix_feat_proj(pix_feat) + self.mask_downsampler(mask_input)
        memory: torch.Tensor = self.out_proj(self.fuser(x))
        return memory

    def position_encoding(self, height: int, width: int, device: torch.device) -> torch.Tensor:
        """(1, out_dim, H, W): the same for every memory, so computed once per state."""
        return grid_sine_encoding(self.out_dim, height, width, device)
