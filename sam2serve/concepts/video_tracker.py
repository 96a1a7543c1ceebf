"""SAM 3's memory tracker: SAM 2's tracking model on SAM 3's backbone and sizes.

Meta's ``Sam3TrackerBase`` is SAM 2's ``SAM2Base`` with other sizes (1008 px input, stride
14: a 72 x 72 grid, 288 x 288 low-res masks, mask prompts of 1152 x 1152) and no backbone
of its own: its three feature levels come from a second FPN neck over SAM 3's ViT output
(:class:`~sam2serve.concepts.tracker_heads.TrackerNeck`, Meta's ``sam2_convs``, the
interactive path's neck). The math of its parts is SAM 2.1's, so the
parts are this project's SAM 2.1 modules (:mod:`sam2serve.modeling`): memory attention
(4 RoPE layers), memory encoder (its mask downsampler first resizes masks to 1152, see
:meth:`Sam3Tracker.encode_memory`), prompt encoder and mask decoder, object pointers.
Parameter names are Meta's ``tracker.*`` keys without the prefix, renamed as the tracker
heads' (:func:`tracker_state`), so a SAM 3 checkpoint loads strictly.

The model holds no per-video state: :mod:`sam2serve.concepts.video_predictor` chooses the
memories and pointers each frame attends to.

Precision (:meth:`Sam3Tracker.to_precision`, set by a concept mode through
:func:`sam2serve.runtime.concepts.apply_tracker_mode`): the memory attention, the memory
encoder and the mask decoder (with its ``conv_s0`` / ``conv_s1`` projections) compute in
their weights' dtype, their inputs converted once and their outputs returned in float32;
the prompt encoder, the pointer MLPs and every post-processing step stay float32. In
float32 (the default) every conversion is a no-op: the answers are the ones Meta's tests
compare.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sam2serve.concepts.tracker_heads import TRACKER, tracker_key
from sam2serve.modeling.common import MLP
from sam2serve.modeling.mask_decoder import MaskDecoder
from sam2serve.modeling.memory_attention import MemoryAttention
from sam2serve.modeling.memory_encoder import MemoryEncoder
from sam2serve.modeling.prompt_encoder import PromptEncoder
from sam2serve.modeling.sam2_video import (
    MASK_BIAS,
    MASK_SCALE,
    NO_OBJ_SCORE,
    decode_with_tokens,
    resize_mask,
)
from sam2serve.modeling.sine_encoding import grid_sine_encoding, temporal_sine_encoding

STRIDE = 14  # SAM 3's ViT patch size
HIDDEN, MEM_DIM = 256, 64
NUM_MASKMEM = 7  # 1 prompted + 6 previous frames
MAX_OBJ_PTRS = 16
MAX_COND_FRAMES = 4  # conditioning frames attended to (the temporally closest)
MEMORY_SELECTION_THRESH = 0.01  # Meta's mf_threshold (use_memory_selection)


@dataclass(frozen=True)
class TrackerFrame:
    """One frame's tracker features (batch 1): the lowest level (1, 256, G, G), its sine
    encoding, and the two high-resolution levels already projected by the mask decoder's
    ``conv_s0`` / ``conv_s1`` (1, 32, 4G, 4G) and (1, 64, 2G, 2G)."""

    feats: Tensor
    pos: Tensor
    high_res: tuple[Tensor, Tensor]


@dataclass(frozen=True)
class StepOutput:
    """What one tracker step gives B objects on a frame."""

    low_res: Tensor  # (B, 1, 4G, 4G) logits, NO_OBJ_SCORE where the object is absent
    obj_ptr: Tensor  # (B, 256)
    object_score: Tensor  # (B, 1) logits
    iou: Tensor  # (B, 1) the predicted IoU of the chosen mask (1 for a mask prompt)


class _Transformer(nn.Module):
    """Holds the memory attention where Meta's keys put it (``transformer.encoder``)."""

    def __init__(self, encoder: MemoryAttention) -> None:
        super().__init__()
        self.encoder = encoder


class Sam3Tracker(nn.Module):
    """SAM 3's tracker for ``image_size`` inputs (1008: SAM 3's; smaller for tests)."""

    def __init__(self, image_size: int = 1008) -> None:
        super().__init__()
        if image_size % STRIDE:
            raise ValueError(f"image size must be a multiple of {STRIDE}; got {image_size}")
        self.image_size = image_size
        self.grid = image_size // STRIDE
        self.low_res_size = 4 * self.grid
        self.input_mask_size = 16 * self.grid  # 1152 at 1008
        self.transformer = _Transformer(MemoryAttention(HIDDEN, MEM_DIM, 4, 2048, 10000.0))
        self.maskmem_backbone = MemoryEncoder(HIDDEN, MEM_DIM)
        self.sam_prompt_encoder = PromptEncoder(
            HIDDEN, (self.grid, self.grid), (image_size, image_size)
        )
        self.sam_mask_decoder = MaskDecoder()
        self.maskmem_tpos_enc = nn.Parameter(torch.zeros(NUM_MASKMEM, 1, 1, MEM_DIM))
        self.no_mem_embed = nn.Parameter(torch.zeros(1, 1, HIDDEN))
        self.no_mem_pos_enc = nn.Parameter(torch.zeros(1, 1, HIDDEN))
        self.no_obj_ptr = nn.Parameter(torch.zeros(1, HIDDEN))
        self.no_obj_embed_spatial = nn.Parameter(torch.zeros(1, MEM_DIM))
        self.mask_downsample = nn.Conv2d(1, 1, kernel_size=4, stride=4)
        self.obj_ptr_proj = MLP(HIDDEN, HIDDEN, HIDDEN, 3)
        self.obj_ptr_tpos_proj = nn.Linear(HIDDEN, MEM_DIM)

    # -- precision ----------------------------------------------------------------------------

    def to_precision(self, dtype: torch.dtype) -> Sam3Tracker:
        """The memory attention, memory encoder and mask decoder in ``dtype`` (in place):
        most of a tracked frame's products. Returns the tracker."""
        for part in (self.transformer, self.maskmem_backbone, self.sam_mask_decoder):
            part.to(dtype)
        return self

    @property
    def attention_dtype(self) -> torch.dtype:
        return self.transformer.encoder.norm.weight.dtype

    @property
    def memory_encoder_dtype(self) -> torch.dtype:
        return self.maskmem_backbone.out_proj.weight.dtype

    @property
    def decoder_dtype(self) -> torch.dtype:
        return self.sam_mask_decoder.iou_token.weight.dtype

    # -- features ---------------------------------------------------------------------------

    def frame(self, levels: tuple[Tensor, Tensor, Tensor], pos: Tensor) -> TrackerFrame:
        """The tracker neck's three levels (finest first) and the lowest level's sine
        encoding -> the frame's tracker features. Meta casts the levels to bfloat16 before
        use (``Sam3ImageOnVideoMultiGPU``, even on one device); the values are rounded the
        same way here and computed on in float32 (the high-resolution levels in the mask
        decoder's dtype)."""
        s0, s1, lowest = (level.to(torch.bfloat16).float() for level in levels)
        decoder = self.sam_mask_decoder
        dtype = self.decoder_dtype
        high_res = (decoder.conv_s0(s0.to(dtype)), decoder.conv_s1(s1.to(dtype)))
        return TrackerFrame(lowest, pos.float(), high_res)

    def memory_pos(self, device: torch.device) -> Tensor:
        """(1, 64, G, G): every memory's spatial encoding."""
        return grid_sine_encoding(MEM_DIM, self.grid, self.grid, device)

    # -- memory attention --------------------------------------------------------------------

    def condition(
        self,
        frame: TrackerFrame,
        batch: int,
        memories: list[tuple[Tensor, int]],
        pointers: list[tuple[int, Tensor]],
        max_ptr_distance: int,
    ) -> Tensor:
        """(batch, 256, G, G) features of a tracked frame attended to its memory bank.

        ``memories``: (features (batch, 64, G, G) any float dtype, index into
        ``maskmem_tpos_enc``) in Meta's order; ``pointers``: (signed frame distance,
        pointers (batch, 256)); the temporal encoding of a pointer is its distance divided
        by ``max_ptr_distance - 1`` (Meta's ``_get_tpos_enc``). The attention runs in its
        weights' dtype (:meth:`to_precision`); the result is float32."""
        device = frame.feats.device
        dtype = self.attention_dtype
        spatial_pos = self.memory_pos(device).flatten(2).transpose(1, 2)  # (1, GG, 64)
        tokens, token_pos = [], []
        for features, tpos in memories:
            tokens.append(features.float().flatten(2).transpose(1, 2))
            token_pos.append(spatial_pos + self.maskmem_tpos_enc[tpos].reshape(1, 1, -1))
        num_ptr_tokens = 0
        if pointers:
            split = HIDDEN // MEM_DIM
            distances = torch.tensor([d for d, _ in pointers], device=device)
            ptrs = torch.stack([p for _, p in pointers], dim=1)  # (B, N, 256)
            enc = temporal_sine_encoding(distances / (max_ptr_distance - 1), HIDDEN)
            enc = self.obj_ptr_tpos_proj(enc)  # (N, 64)
            tokens.append(ptrs.reshape(batch, -1, MEM_DIM))
            token_pos.append(enc.repeat_interleave(split, dim=0).unsqueeze(0))
            num_ptr_tokens = len(pointers) * split
        memory = torch.cat(tokens, dim=1).to(dtype)
        memory_pos = torch.cat([p.expand(batch, -1, -1) for p in token_pos], dim=1).to(dtype)
        _, c, h, w = frame.feats.shape
        curr = frame.feats.flatten(2).transpose(1, 2).expand(batch, -1, -1).to(dtype)
        curr_pos = frame.pos.flatten(2).transpose(1, 2).expand(batch, -1, -1).to(dtype)
        out: Tensor = self.transformer.encoder(curr, curr_pos, memory, memory_pos, num_ptr_tokens)
        return out.float().transpose(1, 2).reshape(batch, c, h, w)

    # -- SAM heads ------------------------------------------------------------------------------

    def heads(
        self,
        pix_feat: Tensor,
        frame: TrackerFrame,
        mask_input: Tensor | None,
        multimask: bool,
        points: tuple[Tensor, Tensor] | None = None,
    ) -> StepOutput:
        """SAM heads on B objects' features (B, 256, G, G); ``mask_input`` (B, 1, 4G, 4G)
        or None; ``points``: (coords (B, N, 2) in the model's input pixels, labels (B, N)
        1 / 0), or None for Meta's padding point alone (a tracked frame). The mask decoder
        runs in its weights' dtype, its outputs taken on in float32."""
        b = pix_feat.shape[0]
        encoder = self.sam_prompt_encoder
        if points is None:
            coords = pix_feat.new_zeros((b, 1, 2))
            labels = torch.full((b, 1), -1, dtype=torch.int32, device=pix_feat.device)
        else:
            coords, labels = points
        sparse = encoder.embed_points(coords, labels)  # Meta's padding point appended
        dense = encoder.no_mask_dense() if mask_input is None else encoder.embed_masks(mask_input)
        decoder = self.sam_mask_decoder
        dtype = self.decoder_dtype
        high_res = tuple(f.expand(b, -1, -1, -1).to(dtype) for f in frame.high_res)
        outputs = decode_with_tokens(
            decoder,
            pix_feat.to(dtype),
            encoder.dense_positional_encoding().to(dtype),
            sparse.to(dtype),
            dense.to(dtype),
            high_res,  # type: ignore[arg-type]  # a pair, as built
        )
        logits, iou, tokens, object_score = (t.float() for t in outputs)
        if multimask:
            best = iou[:, 1:].argmax(dim=-1, keepdim=True)  # (B, 1)
            low_res = logits[:, 1:].gather(1, best[:, :, None, None].expand_as(logits[:, :1]))
            token = tokens[:, 1:].gather(1, best[:, :, None].expand_as(tokens[:, :1]))[:, 0]
            chosen_iou = iou[:, 1:].max(dim=-1, keepdim=True).values
        else:
            low_res, chosen_iou = decoder.select_single_mask(logits, iou)
            token = tokens[:, 0]
        appearing = object_score > 0
        low_res = torch.where(appearing[:, None, None], low_res, NO_OBJ_SCORE).float()
        obj_ptr = self._gate_pointer(self.obj_ptr_proj(token), appearing.float())
        return StepOutput(low_res, obj_ptr, object_score, chosen_iou)

    def _gate_pointer(self, obj_ptr: Tensor, appearing: Tensor) -> Tensor:
        return appearing * obj_ptr + (1 - appearing) * self.no_obj_ptr

    def track(self, pix_feat: Tensor, frame: TrackerFrame) -> StepOutput:
        """A tracked frame (no prompt): multimask output, the best predicted IoU kept
        (Meta's ``multimask_output_for_tracking`` with 0 points)."""
        return self.heads(pix_feat, frame, None, multimask=True)

    def mask_as_output(self, frame: TrackerFrame, masks: Tensor) -> StepOutput:
        """Mask prompts (B, 1, 16G, 16G) in {0, 1} taken as the output (Meta's
        ``_use_mask_as_output``): logits 20 * mask - 10 downsampled to (16G / 14 * 4)
        per side, the pointer from the heads on the raw features with the mask
        (``mask_downsample``) as mask prompt, the object present iff the mask is not
        empty."""
        masks = masks.float()
        high_res = masks * MASK_SCALE + MASK_BIAS
        side = high_res.shape[-1] // STRIDE * 4
        low_res = F.interpolate(
            high_res, size=(side, side), mode="bilinear", align_corners=False, antialias=True
        )
        b = masks.shape[0]
        out = self.heads(
            frame.feats.expand(b, -1, -1, -1), frame, self.mask_downsample(masks), False
        )
        appearing = (masks.flatten(1) > 0.0).any(dim=1, keepdim=True).float()
        object_score = MASK_SCALE * appearing + MASK_BIAS
        obj_ptr = self._gate_pointer(out.obj_ptr, appearing)
        return StepOutput(low_res, obj_ptr, object_score, torch.ones_like(object_score))

    # -- memory encoding --------------------------------------------------------------------------

    def encode_memory(
        self, frame: TrackerFrame, high_res: Tensor, object_score: Tensor, binarize: bool
    ) -> Tensor:
        """B objects' mask logits (B, 1, S, S) on a frame -> memories (B, 64, G, G) in
        float32: binarized (masks from prompts) or sigmoid, * 20 - 10, resized to 16G per
        side (antialiased bilinear, Meta's ``interpol_size``) unless already that size,
        the memory encoder (in its weights' dtype), and the no-object embedding where the
        score says absent."""
        mask = (high_res > 0).float() if binarize else torch.sigmoid(high_res)
        mask = mask * MASK_SCALE + MASK_BIAS
        size = self.input_mask_size
        mask = resize_mask(mask, (size, size))
        dtype = self.memory_encoder_dtype
        pix_feat = frame.feats.expand(mask.shape[0], -1, -1, -1).to(dtype)
        features: Tensor = self.maskmem_backbone(pix_feat, mask.to(dtype)).float()
        absent = 1 - (object_score > 0).float()
        embed = self.no_obj_embed_spatial[..., None, None].expand(*features.shape)
        return features + absent[..., None, None] * embed


def tracker_state(meta_state: dict[str, Tensor]) -> dict[str, Tensor]:
    """A SAM 3 checkpoint's ``tracker.*`` tensors in :class:`Sam3Tracker`'s keys: prefix
    removed, renamed as the tracker heads' (:func:`~sam2serve.concepts.tracker_heads.tracker_key`)."""
    return {
        tracker_key(key.removeprefix(TRACKER)): value
        for key, value in meta_state.items()
        if key.startswith(TRACKER)
    }


__all__ = [
    "MAX_COND_FRAMES",
    "MAX_OBJ_PTRS",
    "MEMORY_SELECTION_THRESH",
    "NUM_MASKMEM",
    "Sam3Tracker",
    "StepOutput",
    "TrackerFrame",
    "tracker_state",
]
