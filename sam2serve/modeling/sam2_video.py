"""SAM2Video: SAM 2's tracking model — the image path (SAM2Image: encoder, prompt encoder,
mask decoder) plus the memory path that carries an object from frame to frame.

On each frame an object is either *prompted* (clicks, a box or a mask: a conditioning
frame) or *tracked*. Tracking conditions the frame's stride-16 features on the object's
memory bank (memory attention over past memories and object pointers), then runs the SAM
heads without prompts. After each frame the predicted mask is encoded into a new memory
(memory encoder) and the chosen output token becomes the frame's object pointer.

Parameter names are exactly Meta's SAM2Base's, so official checkpoints load strictly with
every key. Which frames enter the memory bank is the predictor's business
(sam2serve.engine.video); the model turns the selected memories into tokens.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from sam2serve.config import ModelConfig
from sam2serve.modeling.common import MLP
from sam2serve.modeling.mask_decoder import MaskDecoder
from sam2serve.modeling.memory_attention import MemoryAttention
from sam2serve.modeling.memory_encoder import MemoryEncoder
from sam2serve.modeling.prompt_encoder import points_or_padding
from sam2serve.modeling.sam2 import SAM2Image, raise_on_overflow
from sam2serve.modeling.sine_encoding import grid_sine_encoding, temporal_sine_encoding

# Logit given to every pixel of an object judged absent (Meta's NO_OBJ_SCORE).
NO_OBJ_SCORE = -1024.0
# A mask prompt used as output becomes logits MASK_SCALE * mask + MASK_BIAS
# (sigmoid(-10) ~ 4.5e-5: "certainly background").
MASK_SCALE, MASK_BIAS = 20.0, -10.0


@dataclass
class FrameFeatures:
    """One frame's encoder outputs as the video path needs them (batch 1 or B)."""

    vision_feats: torch.Tensor  # (B, C, 64, 64) stride-16 features, no no_mem_embed
    vision_pos: torch.Tensor  # (1, C, 64, 64) the neck's sine encoding of that level
    high_res_feats: tuple[torch.Tensor, torch.Tensor]  # conv_s0 / conv_s1 projections

    def select(self, index: int) -> FrameFeatures:
        """Frame ``index`` of a batch of frames, as a batch of one."""
        s0, s1 = self.high_res_feats
        return FrameFeatures(
            self.vision_feats[index : index + 1],
            self.vision_pos,
            (s0[index : index + 1], s1[index : index + 1]),
        )


@dataclass
class SpatialMemory:
    """One memory slot of B objects, and its slot in the temporal embedding: one index for
    all of them, or one per object (objects whose banks differ but have the same length
    run as one batch)."""

    features: torch.Tensor  # (B, mem_dim, 64, 64), any float dtype (stored as bfloat16)
    # index into maskmem_tpos_enc (num_maskmem - 1 for prompted frames), or B of them
    tpos_index: int | tuple[int, ...]


@dataclass
class ObjectPointers:
    """Object pointers of B objects in N slots and their signed frame distances: per slot
    one distance for all objects, or a tuple of B (one per object)."""

    pointers: torch.Tensor  # (N, B, C)
    distances: list[int] | list[int | tuple[int, ...]]  # current frame - pointer's frame
    max_distance: int  # the normaliser of the temporal encoding


def resize_mask(mask: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Masks or logits (B, C, H, W) at ``size`` (h, w): as given when already that size,
    else resized in float32 (bilinear, antialiased, as Meta's mask inputs)."""
    if tuple(mask.shape[-2:]) == tuple(size):
        return mask
    return F.interpolate(
        mask.float(), size=size, mode="bilinear", align_corners=False, antialias=True
    )


def _per_object(values: Sequence[int | tuple[int, ...]], batch: int) -> list[list[int]] | None:
    """``values`` (one int, or a tuple of ``batch`` ints, per slot) as per-object lists
    (batch, slots); None when every slot's value is shared."""
    if all(isinstance(value, int) for value in values):
        return None
    return [
        [value if isinstance(value, int) else value[row] for value in values]
        for row in range(batch)
    ]


def upload(values: Sequence[object], device: torch.device) -> torch.Tensor:
    """Small host integers on ``device`` without a blocking copy (a pageable host-to-device
    copy with ``non_blocking`` is staged at once and waits for nothing)."""
    return torch.tensor(values).to(device, non_blocking=True)


def pad_tokens(
    tokens: torch.Tensor, pos: torch.Tensor, slots: int, tokens_per_slot: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tokens (B, M, D) and positions (B or 1, M, D) of slots of ``tokens_per_slot``
    tokens each, padded with zeros to at least ``slots`` slots, and the (B, M') bool mask
    of the real ones."""
    b, m, d = tokens.shape
    target = max(m, slots * tokens_per_slot)
    mask = torch.ones((b, target), dtype=torch.bool, device=tokens.device)
    if target == m:
        return tokens, pos, mask
    mask[:, m:] = False
    pad = tokens.new_zeros((b, target - m, d))
    return (
        torch.cat([tokens, pad], dim=1),
        torch.cat([pos.expand(b, -1, -1), pad], dim=1),
        mask,
    )


@dataclass
class HeadsOutput:
    """What the SAM heads give one frame for B objects."""

    low_res_masks: torch.Tensor  # (B, 1, 256, 256) logits, NO_OBJ_SCORE if absent
    obj_ptr: torch.Tensor  # (B, C)
    object_score_logits: torch.Tensor  # (B, 1)


class SAM2Video(SAM2Image):
    # condition_on_memory takes banks that differ per object (same length): the predictor
    # runs all objects of a frame as one batch (a model without it: one batch per bank).
    per_object_banks = True

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        video = cfg.video
        self.video_config = video
        hidden, mem_dim = cfg.d_model, video.mem_dim
        self.memory_attention = MemoryAttention(
            hidden,
            mem_dim,
            video.memory_attention_layers,
            video.memory_attention_ffn_dim,
            video.rope_theta,
        )
        self.memory_encoder = MemoryEncoder(hidden, mem_dim)
        self.num_maskmem = video.num_maskmem
        self.mem_dim = mem_dim
        # Temporal embedding of memory slots: [num_maskmem - 1] is for prompted frames,
        # [t - 1] for the frame t steps before the current one.
        self.maskmem_tpos_enc = nn.Parameter(torch.zeros(video.num_maskmem, 1, 1, mem_dim))
        # Unused by SAM 2.1 (directly_add_no_mem_embed) but part of every checkpoint.
        self.no_mem_pos_enc = nn.Parameter(torch.zeros(1, 1, hidden))
        self.no_obj_ptr = nn.Parameter(torch.zeros(1, hidden))
        self.no_obj_embed_spatial = nn.Parameter(torch.zeros(1, mem_dim))
        # A mask prompt's pointer comes from the SAM heads fed the mask downsampled 4x.
        self.mask_downsample = nn.Conv2d(1, 1, kernel_size=4, stride=4)
        self.obj_ptr_proj = MLP(hidden, hidden, hidden, 3)
        self.obj_ptr_tpos_proj = nn.Linear(hidden, mem_dim)

    # -- frame features -------------------------------------------------------------------

    def encode_frames(
        self, images: torch.Tensor, autocast_dtype: torch.dtype | None = None
    ) -> FrameFeatures:
        """Normalised (B, 3, 1024, 1024) frames -> their features (no no_mem_embed: the
        memory path decides what is added to them); the encoder's precision as the image
        path's (:meth:`SAM2Image.encoder_levels`)."""
        s0, s1, lowest = self.encoder_levels(images, autocast_dtype)
        decoder = self.sam_mask_decoder
        height, width = lowest.shape[-2:]
        pos = grid_sine_encoding(lowest.shape[1], height, width, lowest.device)
        return FrameFeatures(lowest, pos, (decoder.conv_s0(s0), decoder.conv_s1(s1)))

    # -- memory conditioning ----------------------------------------------------------------

    def condition_without_memory(self, frame: FrameFeatures) -> torch.Tensor:
        """Features of a frame with no memory: the image path's, no_mem_embed added."""
        return frame.vision_feats + self.no_mem_embed.reshape(1, -1, 1, 1)

    def condition_on_memory(
        self,
        frame: FrameFeatures,
        batch: int,
        memories: list[SpatialMemory],
        memory_pos: torch.Tensor,
        pointers: ObjectPointers | None,
        autocast_dtype: torch.dtype | None = None,
        static_bank: tuple[int, int] | None = None,
    ) -> torch.Tensor:
        """(batch, C, 64, 64) float32 features of a tracked frame, attended to the memory
        bank.

        ``memory_pos`` (1, mem_dim, 64, 64) is the memory encoder's (constant) position
        encoding. Memory tokens come in the given order, then the object-pointer tokens;
        ``batch`` objects' (the memories' and pointers' batch).
        ``autocast_dtype``: the attention runs in that dtype (furious mode: it is most of a
        tracked frame's work) on weights kept in it (:meth:`memory_attention_in`), its
        inputs converted once (the stored bf16 memories not at all); the result is float32
        either way. ``static_bank`` (memory slots, pointer slots): the bank padded to at
        least that many of each, its padding masked out of the attention (the same
        answer): a compiled attention then sees one shape on every frame
        (:mod:`sam2serve.engine.video.compiled`).
        """
        device = frame.vision_feats.device
        dtype = torch.float32 if autocast_dtype is None else autocast_dtype
        features = torch.stack([memory.features for memory in memories], dim=1)
        slots = [memory.tpos_index for memory in memories]
        per_object = _per_object(slots, batch)
        tpos_index = upload(slots if per_object is None else per_object, device)
        tokens, token_pos = self.memory_tokens(features, tpos_index, memory_pos, dtype)
        num_ptr_tokens = 0
        key_mask = None
        if static_bank is not None:
            grid = memory_pos.shape[-2] * memory_pos.shape[-1]
            tokens, token_pos, key_mask = pad_tokens(tokens, token_pos, static_bank[0], grid)
        if pointers is not None and pointers.distances:
            per_object = _per_object(pointers.distances, batch)
            distances = upload(pointers.distances if per_object is None else per_object, device)
            ptr_tokens, ptr_pos = self.pointer_tokens(
                pointers.pointers.permute(1, 0, 2), distances / pointers.max_distance
            )
            ptr_tokens, ptr_pos = ptr_tokens.to(dtype), ptr_pos.to(dtype)
            if static_bank is not None:
                split = self.config.d_model // self.mem_dim
                ptr_tokens, ptr_pos, ptr_mask = pad_tokens(
                    ptr_tokens, ptr_pos, static_bank[1], split
                )
                assert key_mask is not None  # the memory tokens' mask, made with the static bank
                key_mask = torch.cat([key_mask, ptr_mask], dim=1)
            tokens = torch.cat([tokens, ptr_tokens], dim=1)
            token_pos = torch.cat([token_pos, ptr_pos], dim=1)
            num_ptr_tokens = ptr_tokens.shape[1]
        out = self.attend_memory(
            frame.vision_feats.to(dtype),
            frame.vision_pos.to(dtype),
            tokens,
            token_pos,
            num_ptr_tokens,
            self.memory_attention_in(dtype),
            key_mask,
        )
        if autocast_dtype == torch.float16:
            raise_on_overflow([out], "memory attention")
        return out.float()

    def memory_attention_in(self, dtype: torch.dtype) -> MemoryAttention:
        """The memory attention with its weights in ``dtype``: the module itself in its
        own dtype, else a copy made once and kept (not a parameter: checkpoints and
        ``.to()`` never see it; made again if the model moved). Running the reduced
        precision on reduced weights, not under autocast, is what keeps a tracked frame
        free of casts: autocast caches no weight cast under inference mode, so it would
        convert every weight on every frame, and its fp32 residual stream would convert
        every layer's input and the whole memory bank (up to 4 times) again."""
        attention = self.memory_attention
        weight = attention.norm.weight
        if dtype == weight.dtype:
            return attention
        key = (dtype, weight.device)
        cache: dict[tuple[torch.dtype, torch.device], MemoryAttention]
        cache = self.__dict__.setdefault("_reduced_attention", {})
        if key not in cache:
            cache.clear()
            with torch.inference_mode(False), torch.no_grad():
                cache[key] = copy.deepcopy(attention).to(dtype)
        return cache[key]

    def memory_tokens(
        self,
        features: torch.Tensor,
        tpos_index: torch.Tensor,
        memory_pos: torch.Tensor,
        dtype: torch.dtype = torch.float32,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Spatial memories (B, N, mem_dim, H, W) of N frames, any float dtype, and their
        slots in the temporal embedding, (N,) shared or (B, N) per object -> tokens and
        their positions, both (B, N * H * W, mem_dim) in ``dtype``, frame by frame: each position
        is the memories' spatial encoding ``memory_pos`` (1, mem_dim, H, W) plus its frame's
        maskmem_tpos_enc.
        """
        b, n, c = features.shape[:3]
        tokens = features.to(dtype).flatten(3).transpose(2, 3).reshape(b, -1, c)
        spatial_pos = memory_pos.flatten(2).transpose(1, 2)  # (1, HW, mem_dim)
        if tpos_index.dim() == 2:  # per object: the same sums, one bank per row
            tpos = self.maskmem_tpos_enc[tpos_index].reshape(b, n, 1, c)
            return tokens, (spatial_pos + tpos).reshape(b, -1, c).to(dtype)
        tpos = self.maskmem_tpos_enc[tpos_index].reshape(-1, 1, c)  # (N, 1, mem_dim)
        pos = (spatial_pos + tpos).reshape(1, -1, c).to(dtype).expand(b, -1, -1)
        return tokens, pos

    def pointer_tokens(
        self, pointers: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Object pointers (B, N, C) of N frames and their temporal positions, (N,) shared
        or (B, N) per object (signed frame distance / the largest distance) ->
        (B, N * C / mem_dim, mem_dim) tokens and positions: each pointer is split into
        C / mem_dim tokens sharing its encoding."""
        b, n, hidden = pointers.shape
        pos = temporal_sine_encoding(positions, hidden)
        pos = self.obj_ptr_tpos_proj(pos)  # (N, mem_dim) or (B, N, mem_dim)
        split = hidden // self.mem_dim
        tokens = pointers.reshape(b, n * split, self.mem_dim)
        if positions.dim() == 2:
            pos = pos.unsqueeze(2).expand(-1, -1, split, -1).reshape(b, -1, self.mem_dim)
            return tokens, pos
        pos = pos.unsqueeze(1).expand(-1, split, -1).reshape(1, -1, self.mem_dim)
        return tokens, pos.expand(b, -1, -1)

    def attend_memory(
        self,
        vision_feats: torch.Tensor,
        vision_pos: torch.Tensor,
        memory: torch.Tensor,
        memory_pos: torch.Tensor,
        num_ptr_tokens: int,
        attention: nn.Module | None = None,
        key_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """A frame's features (1, C, H, W) with their sine encoding (1, C, H, W) attended to
        B objects' memory tokens and positions (B, M, mem_dim), whose last ``num_ptr_tokens``
        are object pointers (no rotary position) -> (B, C, H, W); ``attention``: the memory
        attention to run (default: the model's own)."""
        batch = memory.shape[0]
        _, c, h, w = vision_feats.shape
        curr = vision_feats.flatten(2).transpose(1, 2).expand(batch, -1, -1)
        curr_pos = vision_pos.flatten(2).transpose(1, 2).expand(batch, -1, -1)
        attention = self.memory_attention if attention is None else attention
        out: torch.Tensor = attention(curr, curr_pos, memory, memory_pos, num_ptr_tokens, key_mask)
        return out.transpose(1, 2).reshape(batch, c, h, w)

    # -- SAM heads ----------------------------------------------------------------------------

    def use_multimask(self, is_init_cond_frame: bool, num_points: int) -> bool:
        return self.video_config.use_multimask(is_init_cond_frame, num_points)

    def forward_heads(
        self,
        pix_feat: torch.Tensor,
        high_res_feats: tuple[torch.Tensor, torch.Tensor],
        point_coords: torch.Tensor | None,
        point_labels: torch.Tensor | None,
        mask_input: torch.Tensor | None,
        multimask_output: bool,
    ) -> HeadsOutput:
        """SAM heads on B objects' (possibly memory-conditioned) features (B, C, 64, 64).

        Points in the 1024 frame (box corners as labels 2/3); without points, one padding
        point (:func:`~sam2serve.modeling.prompt_encoder.points_or_padding`). mask_input
        (B, 1, 256, 256) logits or None.
        """
        encoder = self.sam_prompt_encoder
        point_coords, point_labels = points_or_padding(
            point_coords, point_labels, pix_feat.shape[0], pix_feat.device
        )
        sparse = encoder.embed_points(point_coords, point_labels)
        if mask_input is None:
            dense = encoder.no_mask_dense()
        else:
            dense = encoder.embed_masks(resize_mask(mask_input, encoder.mask_input_size))
        decoder = self.sam_mask_decoder
        logits, iou, tokens, object_score = decode_with_tokens(
            decoder, pix_feat, encoder.dense_positional_encoding(), sparse, dense, high_res_feats
        )
        low_res, token = self.choose_output(logits, iou, tokens, multimask_output)
        low_res, obj_ptr = self.gate_output(low_res, token, object_score)
        return HeadsOutput(low_res, obj_ptr, object_score)

    def choose_output(
        self, logits: torch.Tensor, iou: torch.Tensor, tokens: torch.Tensor, multimask_output: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The decoder's four masks (B, 4, 256, 256), their IoU (B, 4) and mask tokens
        (B, 4, C) -> the frame's mask (B, 1, 256, 256) and the token its pointer comes from
        (B, C): the best of the three candidates with ``multimask_output``, else dynamic
        multimask's choice with the single-mask token."""
        if multimask_output:
            best = iou[:, 1:].argmax(dim=-1, keepdim=True)  # (B, 1)
            low_res = logits[:, 1:].gather(1, best[:, :, None, None].expand_as(logits[:, :1]))
            token = tokens[:, 1:].gather(1, best[:, :, None].expand_as(tokens[:, :1]))[:, 0]
            return low_res, token
        # Dynamic multimask picks the mask; the pointer always comes from the single-mask
        # token (what tracking saw in training).
        low_res, _ = self.sam_mask_decoder.select_single_mask(logits, iou)
        return low_res, tokens[:, 0]

    def gate_output(
        self, low_res: torch.Tensor, token: torch.Tensor, object_score: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Where the object score says absent: mask logits NO_OBJ_SCORE and the learned
        no-object pointer; elsewhere the mask and the projected token."""
        appearing = object_score > 0
        low_res = torch.where(appearing[:, None, None], low_res, NO_OBJ_SCORE).float()
        obj_ptr = self._gate_pointer(self.obj_ptr_proj(token), appearing.float())
        return low_res, obj_ptr

    def upscale(self, low_res: torch.Tensor) -> torch.Tensor:
        size = (self.image_size, self.image_size)
        return F.interpolate(low_res, size=size, mode="bilinear", align_corners=False)

    def _gate_pointer(self, obj_ptr: torch.Tensor, appearing: torch.Tensor) -> torch.Tensor:
        """An absent object's pointer is the learned no_obj_ptr (fixed_no_obj_ptr)."""
        return appearing * obj_ptr + (1 - appearing) * self.no_obj_ptr

    def mask_as_output(
        self,
        frame: FrameFeatures,
        batch: int,
        masks: torch.Tensor,
    ) -> HeadsOutput:
        """A mask prompt (B, 1, 1024, 1024) in {0, 1} taken as the output itself.

        Its object pointer still comes from the SAM heads, run on the raw frame features
        with the mask (downsampled 4x by mask_downsample) as the mask prompt.
        """
        masks = masks.float()
        high_res = masks * MASK_SCALE + MASK_BIAS
        low_res = F.interpolate(
            high_res,
            size=(high_res.shape[-2] // 4, high_res.shape[-1] // 4),
            mode="bilinear",
            align_corners=False,
            antialias=True,
        )
        pix_feat = frame.vision_feats.expand(batch, -1, -1, -1)
        heads = self.forward_heads(
            pix_feat, frame.high_res_feats, None, None, self.mask_downsample(masks), False
        )
        appearing = (masks.flatten(1) > 0.0).any(dim=1, keepdim=True).float()
        object_score = MASK_SCALE * appearing + MASK_BIAS
        obj_ptr = self._gate_pointer(heads.obj_ptr, appearing)
        return HeadsOutput(low_res, obj_ptr, object_score)

    # -- memory encoding ----------------------------------------------------------------------

    def encode_memory(
        self,
        frame: FrameFeatures,
        low_res_masks: torch.Tensor,
        object_score_logits: torch.Tensor,
        from_points: bool,
    ) -> torch.Tensor:
        """B objects' masks (B, 1, 256, 256 logits) on a frame -> memories (B, mem_dim,
        64, 64), from the masks upscaled to 1024 x 1024 (Meta encodes its high-res masks,
        which are these upscaled). Masks straight from clicks are binarized; others go
        through a sigmoid."""
        high_res_masks = self.upscale(low_res_masks)
        if from_points and self.video_config.binarize_mask_from_pts_for_mem_enc:
            mask = (high_res_masks > 0).float()
        else:
            mask = torch.sigmoid(high_res_masks)
        return self.encode_mask(frame.vision_feats, mask, object_score_logits)

    def encode_mask(
        self, vision_feats: torch.Tensor, mask: torch.Tensor, object_score_logits: torch.Tensor
    ) -> torch.Tensor:
        """B masks in [0, 1] (B, 1, 1024, 1024) on a frame of features (1, C, 64, 64) ->
        memories (B, mem_dim, 64, 64) float32, the no-object embedding added where absent.
        The memory encoder runs in its weights' dtype (furious casts them to bf16 where bf16
        is native: ``sam2serve.runtime.video``), its two inputs converted once."""
        video = self.video_config
        mask = mask * video.sigmoid_scale_for_mem_enc + video.sigmoid_bias_for_mem_enc
        dtype = self.memory_encoder.out_proj.weight.dtype
        pix_feat = vision_feats.to(dtype).expand(mask.shape[0], -1, -1, -1)
        features: torch.Tensor = self.memory_encoder(pix_feat, mask.to(dtype))
        # float32 either way: the embedding below is a float32 parameter.
        absent = 1 - (object_score_logits > 0).float()
        embed = self.no_obj_embed_spatial[..., None, None].expand(*features.shape)
        return features + absent[..., None, None] * embed

    def memory_position(self, device: torch.device) -> torch.Tensor:
        """(1, mem_dim, 64, 64): the memories' position encoding (the same for all)."""
        size = self.config.embedding_size
        return self.memory_encoder.position_encoding(size, size, device)


def decode_with_tokens(
    decoder: MaskDecoder,
    image_embed: torch.Tensor,
    image_pe: torch.Tensor,
    sparse: torch.Tensor,
    dense: torch.Tensor,
    high_res_feats: tuple[torch.Tensor, torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """MaskDecoder.predict_all_masks that also returns the mask tokens' outputs (B, 4, C),
    which tracking turns into object pointers; the image path never needs them, so the
    decoder (and its exact fast twin) stays as it is and this runs its layers in order."""
    b = sparse.shape[0]
    output_tokens = torch.cat(
        [decoder.obj_score_token.weight, decoder.iou_token.weight, decoder.mask_tokens.weight]
    )
    tokens = torch.cat([output_tokens.unsqueeze(0).expand(b, -1, -1), sparse], dim=1)
    src = image_embed + dense
    hs, keys = decoder.transformer(src, image_pe, tokens)
    mask_tokens_out = hs[:, 2 : 2 + decoder.num_mask_tokens]
    _, c, h, w = src.shape
    src = keys.transpose(1, 2).reshape(b, c, h, w)
    dc1, ln1, act1, dc2, act2 = decoder.output_upscaling
    feat_s0, feat_s1 = high_res_feats
    upscaled = act1(ln1(dc1(src) + feat_s1))
    upscaled = act2(dc2(upscaled) + feat_s0)
    hyper_in = torch.stack(
        [mlp(mask_tokens_out[:, i]) for i, mlp in enumerate(decoder.output_hypernetworks_mlps)],
        dim=1,
    )
    _, cu, hu, wu = upscaled.shape
    logits = (hyper_in @ upscaled.reshape(b, cu, hu * wu)).reshape(b, -1, hu, wu)
    iou = decoder.iou_prediction_head(hs[:, 1])
    object_score = decoder.pred_obj_score_head(hs[:, 0])
    return logits, iou, mask_tokens_out, object_score
