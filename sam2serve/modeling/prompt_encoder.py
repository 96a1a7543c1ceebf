"""Prompt encoder: points, box corners and mask logits -> sparse and dense embeddings.

Coordinates arrive in the 1024x1024 input frame. Points are encoded with random Fourier
features of their pixel-centre position plus a learned embedding per label:
-1 padding ("not a point"), 0 negative, 1 positive, 2 box top-left, 3 box bottom-right.
"""

from __future__ import annotations

import math
from typing import cast

import torch
from torch import nn

from sam2serve.modeling.common import LayerNorm2d

# The label SAM's prompt encoder embeds as "not a point" (padding).
PADDING_LABEL = -1


def points_or_padding(
    coords: torch.Tensor | None,
    labels: torch.Tensor | None,
    batch: int,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The (B, N, 2) coordinates and (B, N) int32 labels a video model's heads take for
    ``batch`` objects: the points given, or without points (a tracked frame) one padding
    point (0, 0) per object, as Meta's tracker passes: the mask decoder always sees at
    least the padding tokens. Every VideoModel's ``forward_heads`` pads through here."""
    if coords is not None and labels is not None:
        return coords, labels
    return (
        torch.zeros((batch, 1, 2), device=device),
        torch.full((batch, 1), PADDING_LABEL, dtype=torch.int32, device=device),
    )


class PositionEmbeddingRandom(nn.Module):
    """Random Fourier features of normalised (x, y) coordinates."""

    positional_encoding_gaussian_matrix: torch.Tensor  # a buffer (registered in __init__)

    def __init__(self, num_pos_feats: int) -> None:
        super().__init__()
        self.register_buffer("positional_encoding_gaussian_matrix", torch.randn((2, num_pos_feats)))

    def encode(self, coords01: torch.Tensor) -> torch.Tensor:
        """coords in [0, 1], shape (..., 2) -> (..., 2 * num_pos_feats)."""
        projected = (2 * coords01 - 1) @ self.positional_encoding_gaussian_matrix
        projected = 2 * math.pi * projected
        return torch.cat([projected.sin(), projected.cos()], dim=-1)

    def dense(self, h: int, w: int) -> torch.Tensor:
        """Encoding of every cell centre of an h x w grid, shape (C, h, w)."""
        device = self.positional_encoding_gaussian_matrix.device
        grid = torch.ones((h, w), device=device, dtype=torch.float32)
        y = (grid.cumsum(dim=0) - 0.5) / h
        x = (grid.cumsum(dim=1) - 0.5) / w
        return self.encode(torch.stack([x, y], dim=-1)).permute(2, 0, 1)

    def encode_pixels(self, coords: torch.Tensor, image_size: tuple[int, int]) -> torch.Tensor:
        """coords in pixels (x, y) of an image of ``image_size`` (h, w)."""
        h, w = image_size
        coords = coords.to(torch.float32)
        # Divided by Python scalars, not a (2,) tensor built here: on a GPU such a tensor
        # is a host-to-device copy, which waits for the stream, on every prompt chunk.
        return self.encode(torch.stack([coords[..., 0] / w, coords[..., 1] / h], dim=-1))


class PromptEncoder(nn.Module):
    num_point_embeddings = 4  # negative, positive, box top-left, box bottom-right

    def __init__(
        self,
        embed_dim: int,
        image_embedding_size: tuple[int, int],
        input_image_size: tuple[int, int],
        mask_in_chans: int = 16,
    ) -> None:
        super().__init__()
        self.embed_dim = embed_dim
        self.image_embedding_size = image_embedding_size
        self.input_image_size = input_image_size
        self.pe_layer = PositionEmbeddingRandom(embed_dim // 2)
        self.point_embeddings = nn.ModuleList(
            nn.Embedding(1, embed_dim) for _ in range(self.num_point_embeddings)
        )
        self.not_a_point_embed = nn.Embedding(1, embed_dim)
        self.mask_input_size = (4 * image_embedding_size[0], 4 * image_embedding_size[1])
        self.mask_downscaling = nn.Sequential(
            nn.Conv2d(1, mask_in_chans // 4, kernel_size=2, stride=2),
            LayerNorm2d(mask_in_chans // 4),
            nn.GELU(),
            nn.Conv2d(mask_in_chans // 4, mask_in_chans, kernel_size=2, stride=2),
            LayerNorm2d(mask_in_chans),
            nn.GELU(),
            nn.Conv2d(mask_in_chans, embed_dim, kernel_size=1),
        )
        self.no_mask_embed = nn.Embedding(1, embed_dim)

    def dense_positional_encoding(self) -> torch.Tensor:
        """(1, C, 64, 64): the encoding the mask decoder adds to the image keys."""
        return self.pe_layer.dense(*self.image_embedding_size).unsqueeze(0)

    def embed_points(self, coords: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """(B, N, 2) pixel coords in the input frame and (B, N) labels -> (B, N, C).

        A padding point (label -1) is always appended: Meta's image predictor passes box
        corners as labelled points, so its prompt encoder always pads.
        """
        b = coords.shape[0]
        coords = torch.cat([coords + 0.5, coords.new_zeros((b, 1, 2))], dim=1)  # pixel centres
        labels = torch.cat([labels, labels.new_full((b, 1), PADDING_LABEL)], dim=1)
        embedding = self.pe_layer.encode_pixels(coords, self.input_image_size)
        labels = labels.unsqueeze(-1)
        embedding = torch.where(labels == PADDING_LABEL, self.not_a_point_embed.weight, embedding)
        for label, learned in enumerate(self.point_embeddings):
            weight = cast(nn.Embedding, learned).weight
            embedding = torch.where(labels == label, embedding + weight, embedding)
        return embedding

    def embed_masks(self, mask_logits: torch.Tensor) -> torch.Tensor:
        """(B, 1, 256, 256) logits -> (B, C, 64, 64)."""
        embedded: torch.Tensor = self.mask_downscaling(mask_logits)
        return embedded

    def no_mask_dense(self) -> torch.Tensor:
        """(1, C, 64, 64) dense embedding used when no mask is given (broadcast over prompts)."""
        h, w = self.image_embedding_size
        return self.no_mask_embed.weight.reshape(1, -1, 1, 1).expand(1, -1, h, w)
