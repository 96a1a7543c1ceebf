"""Memory attention: condition the current frame's features on the object's memories.

Each layer is pre-norm: self-attention over the frame's 64x64 tokens (RoPE), then
cross-attention from them to the memory tokens (past frames' memories with their spatial
and temporal encodings, then the object pointers), then an MLP. The output replaces the
stride-16 features the SAM heads see; on a frame with no memory the image path's
``no_mem_embed`` is added instead (see SAM2Video).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sam2serve.modeling.rope import RoPEAttention


class MemoryAttentionLayer(nn.Module):
    def __init__(self, d_model: int, mem_dim: int, ffn_dim: int, rope_theta: float) -> None:
        super().__init__()
        self.self_attn = RoPEAttention(d_model, rope_theta=rope_theta)
        self.cross_attn_image = RoPEAttention(
            d_model, kv_in_dim=mem_dim, rope_theta=rope_theta, repeat_keys=True
        )
        self.linear1 = nn.Linear(d_model, ffn_dim)
        self.linear2 = nn.Linear(ffn_dim, d_model)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)

    def forward(
        self,
        tgt: torch.Tensor,
        memory: torch.Tensor,
        memory_pos: torch.Tensor,
        num_obj_ptr_tokens: int,
        key_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """tgt (B, HW, C); memory, memory_pos (B, M, mem_dim), batch first; ``key_mask``
        (B, M) bool: the memory tokens attended to (None: all)."""
        normed = self.norm1(tgt)
        # SAM 2.1 adds no position to the self-attention inputs: RoPE is the position.
        tgt = tgt + self.self_attn(normed, normed, normed)
        normed = self.norm2(tgt)
        # Keys carry the memory's position; queries only RoPE.
        tgt = tgt + self.cross_attn_image(
            normed,
            memory + memory_pos,
            memory,
            num_k_exclude_rope=num_obj_ptr_tokens,
            key_mask=key_mask,
        )
        normed = self.norm3(tgt)
        mlp_out: torch.Tensor = self.linear2(F.relu(self.linear1(normed)))
        return tgt + mlp_out


class MemoryAttention(nn.Module):
    def __init__(
        self, d_model: int, mem_dim: int, num_layers: int, ffn_dim: int, rope_theta: float
    ) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            MemoryAttentionLayer(d_model, mem_dim, ffn_dim, rope_theta) for _ in range(num_layers)
        )
        self.norm = nn.LayerNorm(d_model)

    def forward(
        self,
        curr: torch.Tensor,
        curr_pos: torch.Tensor,
        memory: torch.Tensor,
        memory_pos: torch.Tensor,
        num_obj_ptr_tokens: int,
        key_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """curr, curr_pos (B, HW, C); memory, memory_pos (B, M, mem_dim) -> (B, HW, C);
        ``key_mask`` (B, M) bool: the memory tokens attended to (None: all).

        The current frame's position enters once, scaled by 0.1, at the input (SAM 2.1's
        pos_enc_at_input); its RoPE does the rest.
        """
        output = curr + 0.1 * curr_pos
        for layer in self.layers:
            output = layer(output, memory, memory_pos, num_obj_ptr_tokens, key_mask)
        normed: torch.Tensor = self.norm(output)
        return normed
