"""SAM2Image: the image path of SAM2 — image encoder (Hiera + FPN neck), prompt encoder
and mask decoder — with Meta's module names, so official checkpoints load key for key.

The video/memory modules of Meta's SAM2Base are not built; their checkpoint keys are
skipped by name in :mod:`sam2serve.checkpoint`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from sam2serve.config import ModelConfig, WeightsInfo
from sam2serve.modeling.hiera import Hiera
from sam2serve.modeling.mask_decoder import DecoderOutput, MaskDecoder
from sam2serve.modeling.neck import FpnNeck
from sam2serve.modeling.prompt_encoder import PromptEncoder


@dataclass
class ImageFeatures:
    """Per-image features the SAM heads use, batch first."""

    image_embed: torch.Tensor  # (B, 256, 64, 64), no_mem_embed already added
    high_res_feats: tuple[torch.Tensor, torch.Tensor]  # (B, 32, 256, 256), (B, 64, 128, 128)


class ImageEncoder(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.trunk = Hiera(cfg.trunk)
        self.neck = FpnNeck(cfg.d_model, cfg.trunk.channel_list, cfg.fpn_top_down_levels)
        self.scalp = cfg.scalp

    def forward(self, images: torch.Tensor) -> list[torch.Tensor]:
        """Normalised (B, 3, 1024, 1024) -> FPN levels at strides 4, 8, 16."""
        levels: list[torch.Tensor] = self.neck(self.trunk(images))
        return levels[: len(levels) - self.scalp]


class SAM2Image(nn.Module):
    weights_info: WeightsInfo  # where the weights came from: set by sam2serve.checkpoint

    def __init__(self, cfg: ModelConfig, with_image_encoder: bool = True) -> None:
        """``with_image_encoder=False`` builds the SAM heads only, for when the image path
        runs from an ahead-of-time artifact (no trunk to initialise or hold)."""
        super().__init__()
        self.config = cfg
        self.image_size = cfg.image_size
        self.image_encoder = ImageEncoder(cfg) if with_image_encoder else None
        size = cfg.embedding_size
        self.sam_prompt_encoder = PromptEncoder(
            embed_dim=cfg.d_model,
            image_embedding_size=(size, size),
            input_image_size=(cfg.image_size, cfg.image_size),
        )
        self.sam_mask_decoder = MaskDecoder(transformer_dim=cfg.d_model)
        # Learned "no memory" embedding: in SAM2 the image path is the video path on a
        # frame with no memories, and this is what stands in for them.
        self.no_mem_embed = nn.Parameter(torch.zeros(1, 1, cfg.d_model))

    @property
    def device(self) -> torch.device:
        return self.no_mem_embed.device

    def encoder_levels(
        self, images: torch.Tensor, autocast_dtype: torch.dtype | None = None
    ) -> list[torch.Tensor]:
        """Normalised (B, 3, 1024, 1024) images -> the FPN levels (strides 4, 8, 16) in the
        heads' dtype, before any head sees them (the image and the video paths share this).

        The encoder may run in a lower precision than the heads (furious mode keeps the
        heads in fp32): with its weights cast (the CPU), or under autocast to
        ``autocast_dtype`` (CUDA, as Meta runs it). Its outputs are cast to the heads'
        dtype here; fp16 features that overflowed are an error, never silent inf/NaN."""
        encoder = self.image_encoder
        assert encoder is not None, "built without the image encoder (with_image_encoder=False)"
        encoder_dtype = encoder.neck.weight_dtype()
        heads_dtype = self.no_mem_embed.dtype
        levels: list[torch.Tensor]
        if autocast_dtype is None:
            levels = encoder(images.to(encoder_dtype))
        else:
            with torch.autocast(images.device.type, dtype=autocast_dtype):
                levels = encoder(images)
        if torch.float16 in (autocast_dtype, encoder_dtype):
            raise_on_overflow(levels, "the image encoder")
        return [level.to(heads_dtype) for level in levels]

    def encode_image(
        self, images: torch.Tensor, autocast_dtype: torch.dtype | None = None
    ) -> ImageFeatures:
        """Normalised (B, 3, 1024, 1024) images -> the features the SAM heads consume
        (the encoder's precision: :meth:`encoder_levels`)."""
        s0, s1, lowest = self.encoder_levels(images, autocast_dtype)
        decoder = self.sam_mask_decoder
        image_embed = lowest + self.no_mem_embed.reshape(1, -1, 1, 1)
        return ImageFeatures(image_embed, (decoder.conv_s0(s0), decoder.conv_s1(s1)))

    def decode_masks(
        self,
        image_embed: torch.Tensor,
        high_res_feats: tuple[torch.Tensor, torch.Tensor],
        point_coords: torch.Tensor | None,
        point_labels: torch.Tensor | None,
        mask_input: torch.Tensor | None,
        multimask_output: bool,
    ) -> DecoderOutput:
        """Masks for B prompts on ONE image (features with batch 1).

        point_coords (B, N, 2) in the 1024 input frame (box corners included as points with
        labels 2 and 3), point_labels (B, N), mask_input (B, 1, 256, 256) logits or None.
        Without points (a mask prompt alone) there are no sparse tokens at all.
        """
        encoder = self.sam_prompt_encoder
        if point_coords is None:
            if mask_input is None:
                raise ValueError("decode_masks needs points or a mask input")
            sparse = image_embed.new_zeros((mask_input.shape[0], 0, image_embed.shape[1]))
        else:
            assert point_labels is not None, "point_coords without point_labels"
            sparse = encoder.embed_points(point_coords, point_labels)
        dense = encoder.no_mask_dense() if mask_input is None else encoder.embed_masks(mask_input)
        output: DecoderOutput = self.sam_mask_decoder(
            image_embed,
            encoder.dense_positional_encoding(),
            sparse,
            dense,
            high_res_feats,
            multimask_output,
        )
        return output


def raise_on_overflow(tensors: Sequence[torch.Tensor], where: str) -> None:
    """float16 results that overflowed are an error, never silent inf/NaN (a host sync:
    only the float16 paths call it)."""
    if not all(bool(torch.isfinite(tensor).all()) for tensor in tensors):
        raise FloatingPointError(f"{where} overflowed float16; run mode 'fast' (fp32) on this GPU")
