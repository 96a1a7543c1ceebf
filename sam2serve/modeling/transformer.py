"""Two-way transformer of the SAM mask decoder.

Prompt tokens (B of them sets, one per prompt) and the 64x64 image keys attend to each
other in both directions. The image side starts out identical for every prompt of an
image, so it is carried with batch size 1 and broadcast: the first token-to-image
attention folds all prompts into one query sequence against a single copy of the keys,
and the image keys only become per-prompt after the first image-to-token attention.
No per-prompt copy of the image features is ever made up front.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from sam2serve.modeling.common import MLP


class Attention(nn.Module):
    """Multi-head attention with an optional channel downsampling of q, k and v."""

    def __init__(self, embedding_dim: int, num_heads: int, downsample_rate: int = 1) -> None:
        super().__init__()
        self.internal_dim = embedding_dim // downsample_rate
        self.num_heads = num_heads
        if self.internal_dim % num_heads:
            raise ValueError("num_heads must divide embedding_dim // downsample_rate")
        self.q_proj = nn.Linear(embedding_dim, self.internal_dim)
        self.k_proj = nn.Linear(embedding_dim, self.internal_dim)
        self.v_proj = nn.Linear(embedding_dim, self.internal_dim)
        self.out_proj = nn.Linear(self.internal_dim, embedding_dim)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        return x.reshape(b, n, self.num_heads, c // self.num_heads).transpose(1, 2)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q: (Bq, Nq, C); k, v: (Bk, Nk, C). Batches broadcast when one of them is 1."""
        bq, nq, _ = q.shape
        bk = k.shape[0]
        q, k, v = self.q_proj(q), self.k_proj(k), self.v_proj(v)
        if bk == 1 and bq > 1:
            # Shared keys: every prompt's queries attend to the same keys, so stack the
            # queries into one sequence instead of copying the keys per prompt.
            out = F.scaled_dot_product_attention(
                self._heads(q.reshape(1, bq * nq, -1)), self._heads(k), self._heads(v)
            )
            out = out.transpose(1, 2).reshape(bq, nq, -1)
        else:
            if bq == 1 and bk > 1:
                q = q.expand(bk, -1, -1)
            out = F.scaled_dot_product_attention(self._heads(q), self._heads(k), self._heads(v))
            out = out.transpose(1, 2).reshape(out.shape[0], nq, -1)
        projected: torch.Tensor = self.out_proj(out)
        return projected


class TwoWayAttentionBlock(nn.Module):
    """Self-attention of tokens, tokens->image, token MLP, image->tokens."""

    def __init__(
        self,
        embedding_dim: int,
        num_heads: int,
        mlp_dim: int,
        attention_downsample_rate: int,
        skip_first_layer_pe: bool,
    ) -> None:
        super().__init__()
        self.self_attn = Attention(embedding_dim, num_heads)
        self.norm1 = nn.LayerNorm(embedding_dim)
        self.cross_attn_token_to_image = Attention(
            embedding_dim, num_heads, downsample_rate=attention_downsample_rate
        )
        self.norm2 = nn.LayerNorm(embedding_dim)
        self.mlp = MLP(embedding_dim, mlp_dim, embedding_dim, num_layers=2, activation=nn.ReLU)
        self.norm3 = nn.LayerNorm(embedding_dim)
        self.norm4 = nn.LayerNorm(embedding_dim)
        self.cross_attn_image_to_token = Attention(
            embedding_dim, num_heads, downsample_rate=attention_downsample_rate
        )
        # The first layer's queries are the prompt embeddings themselves, which already
        # carry their positions; SAM replaces instead of adds there.
        self.skip_first_layer_pe = skip_first_layer_pe

    def forward(
        self,
        queries: torch.Tensor,
        keys: torch.Tensor,
        query_pe: torch.Tensor,
        key_pe: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.skip_first_layer_pe:
            queries = self.self_attn(queries, queries, queries)
        else:
            q = queries + query_pe
            queries = queries + self.self_attn(q, q, queries)
        queries = self.norm1(queries)

        k = keys + key_pe
        queries = self.norm2(queries + self.cross_attn_token_to_image(queries + query_pe, k, keys))
        queries = self.norm3(queries + self.mlp(queries))

        attn_out = self.cross_attn_image_to_token(k, queries + query_pe, queries)
        keys = self.norm4(keys + attn_out)
        return queries, keys


class TwoWayTransformer(nn.Module):
    def __init__(
        self,
        depth: int = 2,
        embedding_dim: int = 256,
        num_heads: int = 8,
        mlp_dim: int = 2048,
        attention_downsample_rate: int = 2,
    ) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            TwoWayAttentionBlock(
                embedding_dim,
                num_heads,
                mlp_dim,
                attention_downsample_rate,
                skip_first_layer_pe=(i == 0),
            )
            for i in range(depth)
        )
        self.final_attn_token_to_image = Attention(
            embedding_dim, num_heads, downsample_rate=attention_downsample_rate
        )
        self.norm_final_attn = nn.LayerNorm(embedding_dim)

    def blocks(self) -> list[TwoWayAttentionBlock]:
        """``layers``, typed (an ``nn.ModuleList`` hands its items out as plain modules)."""
        return [cast(TwoWayAttentionBlock, layer) for layer in self.layers]

    def forward(
        self, image_embedding: torch.Tensor, image_pe: torch.Tensor, point_embedding: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """image_embedding (1 or B, C, h, w), image_pe (1, C, h, w), point_embedding (B, N, C).

        Returns the processed tokens (B, N, C) and image keys (B, h*w, C).
        """
        keys = image_embedding.flatten(2).transpose(1, 2)
        key_pe = image_pe.flatten(2).transpose(1, 2)
        queries = point_embedding
        for layer in self.layers:
            queries, keys = layer(queries, keys, point_embedding, key_pe)
        attn_out = self.final_attn_token_to_image(queries + point_embedding, keys + key_pe, keys)
        return self.norm_final_attn(queries + attn_out), keys
