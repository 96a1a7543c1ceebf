"""Rotary position encoding (axial, 2-D) and the attention layer that uses it.

Memory attention places the current frame's 64x64 tokens and every memory frame's 64x64
tokens on the same grid by rotating queries and keys by their (x, y) position: the
similarity of a query and a key then depends on their relative offset, whichever frame the
key comes from (the key frequencies are the query's, repeated once per memory frame).
Object-pointer tokens have no spatial position; they are appended after the spatial keys
and left unrotated (``num_k_exclude_rope``).

Complex arithmetic (as in Meta's code) keeps the rounding identical to Meta's. ONNX has
no complex type, so an ONNX export rotates with the rotations' real and imaginary parts
(:func:`rotate_real`): the same products and sums as the complex multiplication, in the
same order, so the same numbers; eager keeps the complex form, which torch runs several
times faster.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import nn


def axial_frequencies(
    head_dim: int, end_x: int, end_y: int, theta: float = 10000.0
) -> torch.Tensor:
    """(end_x * end_y, head_dim // 2) complex: x rotations in the first half of each
    token's pairs, y rotations in the second; tokens in row-major (y, x) order."""
    quarter = head_dim // 4
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 4)[:quarter].float() / head_dim))
    t = torch.arange(end_x * end_y, dtype=torch.float32)
    t_x = (t % end_x).float()
    t_y = torch.div(t, end_x, rounding_mode="floor").float()
    angles_x = torch.outer(t_x, freqs)
    angles_y = torch.outer(t_y, freqs)
    rot_x = torch.polar(torch.ones_like(angles_x), angles_x)
    rot_y = torch.polar(torch.ones_like(angles_y), angles_y)
    return torch.cat([rot_x, rot_y], dim=-1)


@functools.lru_cache(maxsize=16)
def grid_rotations(
    head_dim: int, tokens: int, theta: float, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The rotations of a square grid of ``tokens`` cells: complex (tokens, head_dim / 2),
    then its real and imaginary parts. A constant (it depends on nothing but the shape),
    cached and shared by every attention layer: an ONNX export that registers these very
    tensors as buffers holds them once, as initializers, and finds them computed (the
    complex ones cannot be traced)."""
    side = int(math.sqrt(tokens))
    # Made as normal tensors even when the first call comes in inference mode: the cache
    # outlives the call, and an export traced later cannot save inference tensors.
    with torch.inference_mode(False):
        freqs = axial_frequencies(head_dim, side, side, theta).to(device)
        return freqs, freqs.real.contiguous(), freqs.imag.contiguous()


@functools.lru_cache(maxsize=16)
def grid_rotations_as(
    head_dim: int, tokens: int, theta: float, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`grid_rotations`' real and imaginary parts in ``dtype`` (bf16 / fp16 for the
    reduced-precision memory attention), converted once and kept."""
    _, cos, sin = grid_rotations(head_dim, tokens, theta, device)
    with torch.inference_mode(False):
        return cos.to(dtype), sin.to(dtype)


def rotate(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Rotate (..., N, D) by freqs (N, D/2) complex; consecutive channel pairs are the
    real and imaginary parts."""
    as_complex = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(as_complex * freqs).flatten(-2).type_as(x)


def rotate_real(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, native: bool = False
) -> torch.Tensor:
    """:func:`rotate` in real arithmetic, ``cos`` / ``sin`` (N, D/2) the rotations' real and
    imaginary parts: (a + bi)(c + di) = (ac - bd) + (ad + bc)i, each product rounded and
    then summed, as torch's complex multiplication does, so the result is bit-identical.
    ``native``: in ``x``'s own dtype (cos / sin in it too), not in float32: the
    reduced-precision attention's way, with no round trip of x through float32."""
    pairs = (x if native else x.float()).reshape(*x.shape[:-1], -1, 2)
    real, imag = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack([real * cos - imag * sin, real * sin + imag * cos], dim=-1)
    return rotated.flatten(-2).type_as(x)


class RoPEAttention(nn.Module):
    """Multi-head attention with axial RoPE on queries and (the first) keys.

    ``kv_in_dim`` lets keys/values come from the narrower memory (mem_dim channels).
    Parameter names follow Meta's (q_proj, k_proj, v_proj, out_proj).
    """

    def __init__(
        self,
        embedding_dim: int,
        num_heads: int = 1,
        kv_in_dim: int | None = None,
        rope_theta: float = 10000.0,
        repeat_keys: bool = False,
    ) -> None:
        super().__init__()
        kv_in_dim = embedding_dim if kv_in_dim is None else kv_in_dim
        self.num_heads = num_heads
        self.q_proj = nn.Linear(embedding_dim, embedding_dim)
        self.k_proj = nn.Linear(kv_in_dim, embedding_dim)
        self.v_proj = nn.Linear(kv_in_dim, embedding_dim)
        self.out_proj = nn.Linear(embedding_dim, embedding_dim)
        self.head_dim = embedding_dim // num_heads
        self.rope_theta = rope_theta
        # Cross-attention to memories: several frames of keys share the query grid.
        self.repeat_keys = repeat_keys

    def frequencies(self, tokens: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        """:func:`grid_rotations` of a square grid of ``tokens`` cells (an ONNX trace sees
        the size as a tensor: the grid is fixed, so it becomes the constant it is)."""
        return grid_rotations(self.head_dim, int(tokens), self.rope_theta, device)

    def _rotate(self, x: torch.Tensor, grid_tokens: int) -> torch.Tensor:
        """x (..., grid_tokens, D) rotated by the grid's positions."""
        if x.dtype in (torch.bfloat16, torch.float16):
            # Reduced precision (furious): rotate in it, never round-tripping via float32.
            cos, sin = grid_rotations_as(
                self.head_dim, int(grid_tokens), self.rope_theta, x.device, x.dtype
            )
            return rotate_real(x, cos, sin, native=True)
        freqs, cos, sin = self.frequencies(grid_tokens, x.device)
        # ONNX has no complex type, and Inductor generates no code for complex operators
        # (it falls back to eager kernels): the same numbers in real arithmetic.
        if torch.onnx.is_in_onnx_export() or torch.compiler.is_compiling():
            return rotate_real(x, cos, sin)
        return rotate(x, freqs)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        return x.reshape(b, n, self.num_heads, c // self.num_heads).transpose(1, 2)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        num_k_exclude_rope: int = 0,
        key_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """q (B, Nq, C) on a square grid; k, v (B, Nk, kv_in_dim), the last
        ``num_k_exclude_rope`` keys without position; ``key_mask`` (B, Nk) bool: the keys
        attended to (None: all; a padded memory bank masks its padding)."""
        q = self._heads(self.q_proj(q))
        k = self._heads(self.k_proj(k))
        v = self._heads(self.v_proj(v))
        grid = q.shape[-2]
        num_rope = k.shape[-2] - num_k_exclude_rope
        if num_rope != grid and not self.repeat_keys:
            raise ValueError("keys on another grid than the queries need repeat_keys=True")
        q = self._rotate(q, grid)
        if num_rope > 0:
            b, heads, _, d = k.shape
            # Memory frames as their own axis, each rotated by the query grid's positions
            # (broadcast: the frame count stays a dynamic axis in an ONNX export).
            frames = k[:, :, :num_rope].reshape(b, heads, -1, grid, d)
            rotated = self._rotate(frames, grid).reshape(b, heads, num_rope, d)
            k = torch.cat([rotated, k[:, :, num_rope:]], dim=2)
        mask = None if key_mask is None else key_mask[:, None, None, :]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        b, heads, n, d = out.shape
        projected: torch.Tensor = self.out_proj(out.transpose(1, 2).reshape(b, n, heads * d))
        return projected
