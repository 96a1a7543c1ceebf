"""ONNX graphs of the video path: what ``sam2serve export --format onnx --video`` adds.

Tracking calls the model in four places, and each is one graph:

- ``frame_encoder.onnx``, once per frame: ``image`` (1, 3, 1024, 1024), preprocessed as
  the video path does (:func:`sam2serve.engine.video.frames.preprocess_frame`) ->
  ``vision_feats`` (1, 256, 64, 64, what memory attention and the memory encoder read),
  ``image_embed`` (the same plus ``no_mem_embed``: a prompted frame's features, as in the
  image export), ``high_res_feats_0`` (1, 32, 256, 256), ``high_res_feats_1``
  (1, 64, 128, 128).
- ``memory_attention.onnx``, per tracked frame for B objects with the same memory bank:
  ``vision_feats``; ``memory_features`` (B, N, 64, 64, 64): N memories, each frame's,
  oldest prompted first; ``memory_tpos_index`` (N,) int64: each memory's slot in the
  temporal embedding (``num_maskmem - 1`` for a prompted frame, ``t - 1`` for the frame t
  before the current one); ``obj_ptrs`` (B, P, 256): P object pointers;
  ``obj_ptr_tpos`` (P,) float32: each pointer's signed frame distance divided by the
  largest (``min(num_frames, max_obj_ptrs_in_encoder) - 1``) -> ``conditioned_embed``
  (B, 256, 64, 64). N and P are dynamic; the rotary encoding is real arithmetic (ONNX has
  no complex type; :func:`sam2serve.modeling.rope.rotate_real`, bit-identical to the
  complex form), the sine encodings and ``maskmem_tpos_enc`` are constants of the graph.
- ``video_decoder.onnx``, the SAM heads with their memory inputs: ``image_embed``
  (B, 256, 64, 64: a prompted frame's, or ``conditioned_embed``), the high-res features,
  ``point_coords`` (B, N, 2) in the 1024 frame and ``point_labels`` (B, N) (a tracked frame
  passes one point (0, 0) labelled -1), ``mask_input`` (1 or B, 1, 256, 256) with
  ``has_mask_input`` (1 or B), ``multimask_output`` (bool: three candidates for 0 or 1
  click), ``orig_im_size`` int64 (H, W) -> ``masks`` (B, 1, H, W) logits at the video's
  size, ``low_res_masks`` (B, 1, 256, 256), ``obj_ptr`` (B, 256), ``object_score_logits``
  (B, 1); an absent object's logits are -1024 and its pointer the no-object pointer.
- ``memory_encoder.onnx``, after each frame: ``vision_feats``, ``low_res_masks``,
  ``object_score_logits`` and ``mask_from_points`` (bool: True for a prompted frame's
  mask, which is binarized) -> ``memory_features`` (B, 64, 64, 64), float32 holding
  bfloat16 values (the precision the memory bank keeps, as Meta's predictor does).

Which memories and pointers a frame reads is the loop's business (the rules, and the
constants they need, are in the manifest's ``video.tracking``); docs/video.md has a plain
onnxruntime + numpy loop. Mask prompts (``add_mask``) have no graph.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from sam2serve.engine.image import IMAGENET_MEAN, IMAGENET_STD
from sam2serve.engine.video.predictor import PREV_MASK_CLAMP
from sam2serve.modeling.memory_attention import MemoryAttentionLayer
from sam2serve.modeling.sam2_video import NO_OBJ_SCORE, SAM2Video, decode_with_tokens
from sam2serve.modeling.sine_encoding import grid_sine_encoding
from sam2serve.runtime.onnx_graph import dense_embedding, export_graph

FRAME_ENCODER_ONNX = "frame_encoder.onnx"
MEMORY_ATTENTION_ONNX = "memory_attention.onnx"
VIDEO_DECODER_ONNX = "video_decoder.onnx"
MEMORY_ENCODER_ONNX = "memory_encoder.onnx"
VIDEO_GRAPHS = (FRAME_ENCODER_ONNX, MEMORY_ATTENTION_ONNX, VIDEO_DECODER_ONNX, MEMORY_ENCODER_ONNX)
Shape = list[int | str]  # a dynamic axis is a name


class OnnxFrameEncoder(nn.Module):
    """A frame's features: raw (for the memory path), with ``no_mem_embed`` (for the heads
    on a frame without memory), and the decoder's high-res projections."""

    def __init__(self, model: SAM2Video) -> None:
        super().__init__()
        self.model = model

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, ...]:
        frame = self.model.encode_frames(image)
        embed = self.model.condition_without_memory(frame)
        return frame.vision_feats, embed, *frame.high_res_feats


class OnnxMemoryAttention(nn.Module):
    """SAM2Video's memory conditioning over a bank given as tensors (N memories, P
    pointers: both dynamic axes); the position encodings are constants of the graph."""

    vision_pos: torch.Tensor  # buffers (registered in __init__)
    memory_pos: torch.Tensor

    def __init__(self, model: SAM2Video) -> None:
        super().__init__()
        self.model = model
        side = model.config.embedding_size
        device = model.device
        vision_pos = grid_sine_encoding(model.config.d_model, side, side, device)
        self.register_buffer("vision_pos", vision_pos, persistent=False)
        self.register_buffer("memory_pos", model.memory_position(device), persistent=False)
        # The rotary encoding's real and imaginary parts, the very tensors every layer reads:
        # as buffers in the state dict (which the tracer maps to initializers by identity),
        # the graph holds them once instead of a copy per use.
        attention = cast(MemoryAttentionLayer, model.memory_attention.layers[0]).self_attn
        _, cos, sin = attention.frequencies(side * side, device)
        self.register_buffer("rope_cos", cos)
        self.register_buffer("rope_sin", sin)

    def forward(
        self,
        vision_feats: torch.Tensor,
        memory_features: torch.Tensor,
        memory_tpos_index: torch.Tensor,
        obj_ptrs: torch.Tensor,
        obj_ptr_tpos: torch.Tensor,
    ) -> torch.Tensor:
        model = self.model
        tokens, pos = model.memory_tokens(memory_features, memory_tpos_index, self.memory_pos)
        ptr_tokens, ptr_pos = model.pointer_tokens(obj_ptrs, obj_ptr_tpos)
        # Traced, the pointer-token count is a size of the graph, not a constant.
        num_ptr_tokens = ptr_tokens.shape[1]
        return model.attend_memory(
            vision_feats,
            self.vision_pos,
            torch.cat([tokens, ptr_tokens], dim=1),
            torch.cat([pos, ptr_pos], dim=1),
            num_ptr_tokens,
        )


class OnnxVideoDecoder(nn.Module):
    """SAM2Video.forward_heads with every choice an input: the mask prompt by
    ``has_mask_input`` (0 or 1, so the blend is exactly one embedding), multimask by
    ``multimask_output`` (both selections computed, one kept); plus the masks at the
    video's size."""

    def __init__(self, model: SAM2Video) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        image_embed: torch.Tensor,
        high_res_feats_0: torch.Tensor,
        high_res_feats_1: torch.Tensor,
        point_coords: torch.Tensor,
        point_labels: torch.Tensor,
        mask_input: torch.Tensor,
        has_mask_input: torch.Tensor,
        multimask_output: torch.Tensor,
        orig_im_size: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        model = self.model
        encoder = model.sam_prompt_encoder
        sparse = encoder.embed_points(point_coords, point_labels)
        dense = dense_embedding(encoder, mask_input, has_mask_input)
        logits, iou, tokens, object_score = decode_with_tokens(
            model.sam_mask_decoder,
            image_embed,
            encoder.dense_positional_encoding(),
            sparse,
            dense,
            (high_res_feats_0, high_res_feats_1),
        )
        multi_mask, multi_token = model.choose_output(logits, iou, tokens, True)
        single_mask, single_token = model.choose_output(logits, iou, tokens, False)
        low_res = torch.where(multimask_output, multi_mask, single_mask)
        token = torch.where(multimask_output, multi_token, single_token)
        low_res, obj_ptr = model.gate_output(low_res, token, object_score)
        size = (orig_im_size[0], orig_im_size[1])
        # Tensors, not ints: traced for ONNX, the output size is a dynamic input's values.
        masks = F.interpolate(low_res, size=size, mode="bilinear", align_corners=False)  # type: ignore[arg-type]  # ONNX-traced size
        return masks, low_res, obj_ptr, object_score


class OnnxMemoryEncoder(nn.Module):
    """SAM2Video.encode_memory from the low-res logits (upsampled here as the predictor
    does), rounded to the memory bank's dtype."""

    def __init__(self, model: SAM2Video) -> None:
        super().__init__()
        self.model = model
        self.memory_dtype = getattr(torch, model.video_config.memory_dtype_name)

    def forward(
        self,
        vision_feats: torch.Tensor,
        low_res_masks: torch.Tensor,
        object_score_logits: torch.Tensor,
        mask_from_points: torch.Tensor,
    ) -> torch.Tensor:
        model = self.model
        high_res = model.upscale(low_res_masks)
        mask = torch.sigmoid(high_res)
        if model.video_config.binarize_mask_from_pts_for_mem_enc:
            mask = torch.where(mask_from_points, (high_res > 0).float(), mask)
        memory = model.encode_mask(vision_feats, mask, object_score_logits)
        return memory.to(self.memory_dtype).float()


# Example sizes of the dynamic axes for tracing: all distinct, so no two are confused.
EXAMPLE_SIZES = {
    "num_objects": 2,
    "num_memories": 3,
    "num_pointers": 2,
    "num_points": 3,
    "num_mask_inputs": 2,
    "height": 96,
    "width": 128,
}


def signatures(model: SAM2Video) -> dict[str, dict[str, dict[str, Shape]]]:
    """Each graph's inputs and outputs, in order, with their shapes; a dynamic axis is a
    name (these are the graphs' dynamic axes and the manifest's ``video.graphs``)."""
    side, hidden, mem_dim = model.image_size, model.config.d_model, model.mem_dim
    embed, low = model.config.embedding_size, side // 4
    objects = "num_objects"
    feats: Shape = [1, hidden, embed, embed]
    high_res: dict[str, Shape] = {"high_res_feats_0": [1, hidden // 8, low, low]}
    high_res["high_res_feats_1"] = [1, hidden // 4, low // 2, low // 2]
    low_res: Shape = [objects, 1, low, low]
    scores: Shape = [objects, 1]
    return {
        FRAME_ENCODER_ONNX: {
            "inputs": {"image": [1, 3, side, side]},
            "outputs": {"vision_feats": feats, "image_embed": feats, **high_res},
        },
        MEMORY_ATTENTION_ONNX: {
            "inputs": {
                "vision_feats": feats,
                "memory_features": [objects, "num_memories", mem_dim, embed, embed],
                "memory_tpos_index": ["num_memories"],
                "obj_ptrs": [objects, "num_pointers", hidden],
                "obj_ptr_tpos": ["num_pointers"],
            },
            "outputs": {"conditioned_embed": [objects, hidden, embed, embed]},
        },
        VIDEO_DECODER_ONNX: {
            "inputs": {
                "image_embed": [objects, hidden, embed, embed],
                **high_res,
                "point_coords": [objects, "num_points", 2],
                "point_labels": [objects, "num_points"],
                "mask_input": ["num_mask_inputs", 1, low, low],
                "has_mask_input": ["num_mask_inputs"],
                "multimask_output": [],
                "orig_im_size": [2],
            },
            "outputs": {
                "masks": [objects, 1, "height", "width"],
                "low_res_masks": low_res,
                "obj_ptr": [objects, hidden],
                "object_score_logits": scores,
            },
        },
        MEMORY_ENCODER_ONNX: {
            "inputs": {
                "vision_feats": feats,
                "low_res_masks": low_res,
                "object_score_logits": scores,
                "mask_from_points": [],
            },
            "outputs": {"memory_features": [objects, mem_dim, embed, embed]},
        },
    }


def _dynamic_axes(signature: dict[str, dict[str, Shape]]) -> dict[str, dict[int, str]]:
    return {
        name: {i: size for i, size in enumerate(shape) if isinstance(size, str)}
        for part in ("inputs", "outputs")
        for name, shape in signature[part].items()
        if any(isinstance(size, str) for size in shape)
    }


def _example(name: str, shape: Shape, model: SAM2Video) -> torch.Tensor:
    """An input for tracing: the values matter only where the graph indexes or branches
    on them (temporal slots, labels, flags, the output size)."""
    sizes = [EXAMPLE_SIZES[s] if isinstance(s, str) else s for s in shape]
    if name == "memory_tpos_index":
        return torch.arange(sizes[0]) % model.num_maskmem
    if name == "point_labels":
        return torch.tensor([1.0, 0.0, 2.0, 3.0, -1.0]).repeat(sizes[0], 1)[:, : sizes[1]]
    if name in ("multimask_output", "mask_from_points"):
        return torch.tensor(True)
    if name == "has_mask_input":
        return torch.ones(sizes)
    if name == "orig_im_size":
        return torch.tensor([EXAMPLE_SIZES["height"], EXAMPLE_SIZES["width"]])
    if name == "point_coords":
        return torch.rand(sizes) * model.image_size
    return torch.randn(sizes)


_MODULES: dict[str, Callable[[SAM2Video], nn.Module]] = {
    FRAME_ENCODER_ONNX: OnnxFrameEncoder,
    MEMORY_ATTENTION_ONNX: OnnxMemoryAttention,
    VIDEO_DECODER_ONNX: OnnxVideoDecoder,
    MEMORY_ENCODER_ONNX: OnnxMemoryEncoder,
}


def export_video_graphs(
    model: SAM2Video, out: Path, progress: Callable[[str], None] = lambda step: None
) -> dict[str, Any]:
    """Write the four video graphs of ``model`` into ``out``; returns the manifest's
    ``video`` section: each graph's inputs and outputs (:func:`signatures`) and the
    tracking constants."""
    model = model.eval()
    graphs = signatures(model)
    for name, make in _MODULES.items():
        progress(f"{name}: torch.onnx.export")
        inputs, outputs = graphs[name]["inputs"], graphs[name]["outputs"]
        examples = tuple(_example(n, shape, model) for n, shape in inputs.items())
        axes = _dynamic_axes(graphs[name])
        export_graph(make(model), examples, out / name, tuple(inputs), tuple(outputs), axes)
    return {"graphs": graphs, "tracking": tracking_constants(model)}


def tracking_constants(model: SAM2Video) -> dict[str, Any]:
    """What a tracking loop needs besides the graphs (docs/video.md, "ONNX")."""
    video = model.video_config
    return {
        "image_size": model.image_size,
        "preprocess": "PIL Image.resize((image_size, image_size)) of the uint8 RGB frame "
        "(PIL's default filter), / 255 in float64, then float32 (x - mean) / std",
        "mean": list(IMAGENET_MEAN),
        "std": list(IMAGENET_STD),
        "num_maskmem": video.num_maskmem,
        "prompted_memory_tpos_index": video.num_maskmem - 1,
        "memory_temporal_stride": video.memory_temporal_stride_for_eval,
        "max_cond_frames_in_attn": video.max_cond_frames_in_attn,
        "max_obj_ptrs_in_encoder": video.max_obj_ptrs_in_encoder,
        "only_obj_ptrs_in_the_past": video.only_obj_ptrs_in_the_past_for_eval,
        "signed_obj_ptr_tpos": video.use_signed_tpos_enc_to_obj_ptrs,
        "multimask_points": [video.multimask_min_pt_num, video.multimask_max_pt_num],
        "memory_dtype": video.memory_dtype_name,
        "no_object_logit": NO_OBJ_SCORE,
        "mask_input_clamp": PREV_MASK_CLAMP,
    }
