"""Hiera: the hierarchical vision transformer trunk of SAM2's image encoder.

Four stages at strides 4, 8, 16 and 32. Most blocks attend within local windows; a few
named blocks attend globally. At the first block of each later stage the queries are
max-pooled 2x2 ("q-pooling"), which halves the resolution while the keys and values
keep the finer grid, and the channel width and head count double.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sam2serve.config import HieraConfig
from sam2serve.modeling.common import MLP


class PatchEmbed(nn.Module):
    """7x7 stride-4 convolution; returns channels-last (B, H, W, C)."""

    def __init__(self, embed_dim: int, in_chans: int = 3) -> None:
        super().__init__()
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=7, stride=4, padding=3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        projected: torch.Tensor = self.proj(x)
        return projected.permute(0, 2, 3, 1)


def pool_nhwc(x: torch.Tensor, pool: nn.Module) -> torch.Tensor:
    pooled: torch.Tensor = pool(x.permute(0, 3, 1, 2))
    return pooled.permute(0, 2, 3, 1)


def to_windows(x: torch.Tensor, size: int) -> tuple[torch.Tensor, tuple[int, int]]:
    """(B, H, W, C) -> (B * nWindows, size, size, C), zero-padding H and W up to a multiple."""
    b, h, w, c = x.shape
    pad_h, pad_w = (-h) % size, (-w) % size
    if pad_h or pad_w:
        x = F.pad(x, (0, 0, 0, pad_w, 0, pad_h))
    hp, wp = h + pad_h, w + pad_w
    x = x.view(b, hp // size, size, wp // size, size, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, size, size, c), (hp, wp)


def from_windows(
    windows: torch.Tensor, size: int, padded_hw: tuple[int, int], hw: tuple[int, int]
) -> torch.Tensor:
    """Inverse of :func:`to_windows`, dropping the padding."""
    hp, wp = padded_hw
    b = windows.shape[0] // ((hp // size) * (wp // size))
    x = windows.reshape(b, hp // size, wp // size, size, size, -1).permute(0, 1, 3, 2, 4, 5)
    x = x.reshape(b, hp, wp, -1)
    return x[:, : hw[0], : hw[1], :] if (hp, wp) != hw else x


class MultiScaleAttention(nn.Module):
    """Self-attention whose queries are optionally pooled to a coarser grid."""

    def __init__(
        self, dim: int, dim_out: int, num_heads: int, q_pool: nn.Module | None = None
    ) -> None:
        super().__init__()
        self.dim_out = dim_out
        self.num_heads = num_heads
        self.q_pool = q_pool
        self.qkv = nn.Linear(dim, dim_out * 3)
        self.proj = nn.Linear(dim_out, dim_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, h, w, _ = x.shape
        qkv = self.qkv(x).reshape(b, h * w, 3, self.num_heads, -1)
        q, k, v = qkv.unbind(2)
        if self.q_pool is not None:
            q = pool_nhwc(q.reshape(b, h, w, -1), self.q_pool)
            h, w = q.shape[1:3]
            q = q.reshape(b, h * w, self.num_heads, -1)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        )
        projected: torch.Tensor = self.proj(out.transpose(1, 2).reshape(b, h, w, -1))
        return projected


class MultiScaleBlock(nn.Module):
    def __init__(
        self,
        dim: int,
        dim_out: int,
        num_heads: int,
        window_size: int,
        q_stride: tuple[int, int] | None,
        mlp_ratio: float = 4.0,
    ) -> None:
        super().__init__()
        self.dim, self.dim_out = dim, dim_out
        self.window_size = window_size
        self.q_stride = q_stride
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.pool = nn.MaxPool2d(kernel_size=q_stride, stride=q_stride) if q_stride else None
        self.attn = MultiScaleAttention(dim, dim_out, num_heads, q_pool=self.pool)
        self.norm2 = nn.LayerNorm(dim_out, eps=1e-6)
        self.mlp = MLP(dim_out, int(dim_out * mlp_ratio), dim_out, num_layers=2, activation=nn.GELU)
        if dim != dim_out:
            self.proj = nn.Linear(dim, dim_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x
        x = self.norm1(x)
        if self.dim != self.dim_out:
            # The residual path changes width (and, with q-pooling, resolution) too.
            shortcut = self.proj(x)
            if self.pool is not None:
                shortcut = pool_nhwc(shortcut, self.pool)

        window = self.window_size
        if window > 0:
            hw = (x.shape[1], x.shape[2])
            x, padded_hw = to_windows(x, window)
        x = self.attn(x)
        if window > 0:
            if self.q_stride:
                # q-pooling shrank every window; unpartition on the pooled grid.
                window = window // self.q_stride[0]
                hw = (shortcut.shape[1], shortcut.shape[2])
                padded_hw = (hw[0] + (-hw[0]) % window, hw[1] + (-hw[1]) % window)
            x = from_windows(x, window, padded_hw, hw)

        x = shortcut + x
        mlp_out: torch.Tensor = self.mlp(self.norm2(x))
        return x + mlp_out


class Hiera(nn.Module):
    """Returns the four stage outputs as NCHW tensors, highest resolution first."""

    def __init__(self, cfg: HieraConfig) -> None:
        super().__init__()
        self.stage_ends = [sum(cfg.stages[: i + 1]) - 1 for i in range(len(cfg.stages))]
        q_pool_blocks = [end + 1 for end in self.stage_ends[:-1]][: cfg.q_pool]
        self.patch_embed = PatchEmbed(cfg.embed_dim)
        # Windowed positional embedding: a coarse background embedding interpolated to the
        # grid plus a per-window embedding tiled over it (arXiv:2311.05613).
        self.pos_embed = nn.Parameter(
            torch.zeros(1, cfg.embed_dim, *cfg.window_pos_embed_bkg_spatial_size)
        )
        first_window = cfg.window_spec[0]
        self.pos_embed_window = nn.Parameter(
            torch.zeros(1, cfg.embed_dim, first_window, first_window)
        )

        self.blocks = nn.ModuleList()
        dim, heads, stage = cfg.embed_dim, cfg.num_heads, 0
        for i in range(sum(cfg.stages)):
            dim_out = dim
            # The window size lags by one block: the first block of a stage still uses the
            # previous stage's window (its queries are pooled into the new resolution).
            window = 0 if i in cfg.global_att_blocks else cfg.window_spec[stage]
            if i - 1 in self.stage_ends:
                dim_out = int(dim * cfg.dim_mul)
                heads = int(heads * cfg.head_mul)
                stage += 1
            self.blocks.append(
                MultiScaleBlock(
                    dim=dim,
                    dim_out=dim_out,
                    num_heads=heads,
                    window_size=window,
                    q_stride=cfg.q_stride if i in q_pool_blocks else None,
                )
            )
            dim = dim_out

    def positional_embedding(self, hw: tuple[int, int]) -> torch.Tensor:
        background = F.interpolate(self.pos_embed, size=hw, mode="bicubic")
        reps = [b // w for b, w in zip(background.shape, self.pos_embed_window.shape)]
        return (background + self.pos_embed_window.tile(reps)).permute(0, 2, 3, 1)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        x = self.patch_embed(x)
        x = x + self.positional_embedding((x.shape[1], x.shape[2]))
        outputs = []
        for i, block in enumerate(self.blocks):
            x = block(x)
            if i in self.stage_ends:
                outputs.append(x.permute(0, 3, 1, 2))
        return outputs
