"""Meta's SAM 3 checkpoint (``sam3.pt``, keys as Meta's ``Sam3Image``) -> the keys of
transformers' ``Sam3Model``, checked strictly.

The rename table is this project's, written from the two modules' parameter trees: fused
attention projections (``qkv`` / ``in_proj_*``) are split into q, k, v; CLIP's text projection
is stored transposed; Meta's ViT position table carries a class-token row that
transformers drops. Loading fails, naming the keys, when anything is missing or left over.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

import torch
from torch import Tensor

DETECTOR = "detector."  # Meta's combined image+video file prefixes the image model so
# The tracker's tensors: the heads and the video tracker (``tracker.``, or ``inst_interactive_
# predictor.model.`` in Meta's image model with interactivity) and the tracker's neck
# (Meta's dual neck's ``sam2_convs``): :mod:`sam2serve.concepts.tracker_heads` loads them.
TRACKER_KEYS = re.compile(
    r"^(tracker\.|inst_interactive_predictor\.model\.|backbone\.vision_backbone\.sam2_convs\.)"
)

# (pattern, replacement) applied in order to each key, after dropping DETECTOR
# a replacement is re.sub's: a template, or a function of the match
RENAMES: tuple[tuple[str, str | Callable[[re.Match[str]], str]], ...] = (
    # vision: ViT trunk
    (
        r"^backbone\.vision_backbone\.trunk\.pos_embed$",
        "vision_encoder.backbone.embeddings.position_embeddings",
    ),
    (
        r"^backbone\.vision_backbone\.trunk\.patch_embed\.proj\.",
        "vision_encoder.backbone.embeddings.patch_embeddings.projection.",
    ),
    (r"^backbone\.vision_backbone\.trunk\.ln_pre\.", "vision_encoder.backbone.layer_norm."),
    (
        r"^backbone\.vision_backbone\.trunk\.blocks\.(\d+)\.norm(\d)\.",
        r"vision_encoder.backbone.layers.\1.layer_norm\2.",
    ),
    (
        r"^backbone\.vision_backbone\.trunk\.blocks\.(\d+)\.attn\.qkv\.",
        r"vision_encoder.backbone.layers.\1.attention.qkv.",
    ),
    (
        r"^backbone\.vision_backbone\.trunk\.blocks\.(\d+)\.attn\.proj\.",
        r"vision_encoder.backbone.layers.\1.attention.o_proj.",
    ),
    (
        r"^backbone\.vision_backbone\.trunk\.blocks\.(\d+)\.mlp\.",
        r"vision_encoder.backbone.layers.\1.mlp.",
    ),
    # vision: FPN neck
    (
        r"^backbone\.vision_backbone\.convs\.(\d+)\.dconv_2x2(_0)?\.",
        r"vision_encoder.neck.fpn_layers.\1.scale_layers.0.",
    ),
    (
        r"^backbone\.vision_backbone\.convs\.(\d+)\.dconv_2x2_1\.",
        r"vision_encoder.neck.fpn_layers.\1.scale_layers.2.",
    ),
    (
        r"^backbone\.vision_backbone\.convs\.(\d+)\.conv_1x1\.",
        r"vision_encoder.neck.fpn_layers.\1.proj1.",
    ),
    (
        r"^backbone\.vision_backbone\.convs\.(\d+)\.conv_3x3\.",
        r"vision_encoder.neck.fpn_layers.\1.proj2.",
    ),
    # text: CLIP
    (
        r"^backbone\.language_backbone\.encoder\.token_embedding\.",
        "text_encoder.text_model.embeddings.token_embedding.",
    ),
    (
        r"^backbone\.language_backbone\.encoder\.positional_embedding$",
        "text_encoder.text_model.embeddings.position_embedding.weight",
    ),
    (
        r"^backbone\.language_backbone\.encoder\.ln_final\.",
        "text_encoder.text_model.final_layer_norm.",
    ),
    (
        r"^backbone\.language_backbone\.encoder\.text_projection$",
        "text_encoder.text_projection.weight",
    ),
    (
        r"^backbone\.language_backbone\.encoder\.transformer\.resblocks\.(\d+)\.attn\.out_proj\.",
        r"text_encoder.text_model.encoder.layers.\1.self_attn.out_proj.",
    ),
    (
        r"^backbone\.language_backbone\.encoder\.transformer\.resblocks\.(\d+)\.attn\.in_proj_",
        r"text_encoder.text_model.encoder.layers.\1.self_attn.in_proj_",
    ),
    (
        r"^backbone\.language_backbone\.encoder\.transformer\.resblocks\.(\d+)\.ln_(\d)\.",
        r"text_encoder.text_model.encoder.layers.\1.layer_norm\2.",
    ),
    (
        r"^backbone\.language_backbone\.encoder\.transformer\.resblocks\.(\d+)\.mlp\.c_fc\.",
        r"text_encoder.text_model.encoder.layers.\1.mlp.fc1.",
    ),
    (
        r"^backbone\.language_backbone\.encoder\.transformer\.resblocks\.(\d+)\.mlp\.c_proj\.",
        r"text_encoder.text_model.encoder.layers.\1.mlp.fc2.",
    ),
    (r"^backbone\.language_backbone\.resizer\.", "text_projection."),
    # geometry (exemplar) encoder
    (
        r"^geometry_encoder\.encode\.(\d+)\.cross_attn_image\.out_proj\.",
        r"geometry_encoder.layers.\1.cross_attn.o_proj.",
    ),
    (
        r"^geometry_encoder\.encode\.(\d+)\.cross_attn_image\.",
        r"geometry_encoder.layers.\1.cross_attn.",
    ),
    (
        r"^geometry_encoder\.encode\.(\d+)\.self_attn\.out_proj\.",
        r"geometry_encoder.layers.\1.self_attn.o_proj.",
    ),
    (r"^geometry_encoder\.encode\.(\d+)\.linear(\d)\.", r"geometry_encoder.layers.\1.mlp.fc\2."),
    (r"^geometry_encoder\.encode\.(\d+)\.norm(\d)\.", r"geometry_encoder.layers.\1.layer_norm\2."),
    (r"^geometry_encoder\.encode\.(\d+)\.", r"geometry_encoder.layers.\1."),
    (r"^geometry_encoder\.img_pre_norm\.", "geometry_encoder.vision_layer_norm."),
    (r"^geometry_encoder\.norm\.", "geometry_encoder.prompt_layer_norm."),
    (r"^geometry_encoder\.encode_norm\.", "geometry_encoder.output_layer_norm."),
    # DETR encoder
    (
        r"^transformer\.encoder\.layers\.(\d+)\.cross_attn_image\.out_proj\.",
        r"detr_encoder.layers.\1.cross_attn.o_proj.",
    ),
    (
        r"^transformer\.encoder\.layers\.(\d+)\.cross_attn_image\.",
        r"detr_encoder.layers.\1.cross_attn.",
    ),
    (
        r"^transformer\.encoder\.layers\.(\d+)\.self_attn\.out_proj\.",
        r"detr_encoder.layers.\1.self_attn.o_proj.",
    ),
    (r"^transformer\.encoder\.layers\.(\d+)\.linear(\d)\.", r"detr_encoder.layers.\1.mlp.fc\2."),
    (r"^transformer\.encoder\.layers\.(\d+)\.norm(\d)\.", r"detr_encoder.layers.\1.layer_norm\2."),
    (r"^transformer\.encoder\.layers\.(\d+)\.", r"detr_encoder.layers.\1."),
    # DETR decoder
    (
        r"^transformer\.decoder\.presence_token_head\.layers\.(\d)\.",
        lambda m: f"detr_decoder.presence_head.layer{int(m[1]) + 1}.",
    ),
    (r"^transformer\.decoder\.presence_token_out_norm\.", "detr_decoder.presence_layer_norm."),
    (r"^transformer\.decoder\.norm\.", "detr_decoder.output_layer_norm."),
    (
        r"^transformer\.decoder\.bbox_embed\.layers\.(\d)\.",
        lambda m: f"detr_decoder.box_head.layer{int(m[1]) + 1}.",
    ),
    (
        r"^transformer\.decoder\.ref_point_head\.layers\.(\d)\.",
        lambda m: f"detr_decoder.ref_point_head.layer{int(m[1]) + 1}.",
    ),
    (
        r"^transformer\.decoder\.boxRPB_embed_(\w)\.layers\.(\d)\.",
        lambda m: f"detr_decoder.box_rpb_embed_{m[1]}.layer{int(m[2]) + 1}.",
    ),
    (
        r"^transformer\.decoder\.layers\.(\d+)\.self_attn\.out_proj\.",
        r"detr_decoder.layers.\1.self_attn.o_proj.",
    ),
    (r"^transformer\.decoder\.layers\.(\d+)\.self_attn\.", r"detr_decoder.layers.\1.self_attn."),
    (
        r"^transformer\.decoder\.layers\.(\d+)\.ca_text\.out_proj\.",
        r"detr_decoder.layers.\1.text_cross_attn.o_proj.",
    ),
    (
        r"^transformer\.decoder\.layers\.(\d+)\.ca_text\.",
        r"detr_decoder.layers.\1.text_cross_attn.",
    ),
    (
        r"^transformer\.decoder\.layers\.(\d+)\.cross_attn\.out_proj\.",
        r"detr_decoder.layers.\1.vision_cross_attn.o_proj.",
    ),
    (
        r"^transformer\.decoder\.layers\.(\d+)\.cross_attn\.",
        r"detr_decoder.layers.\1.vision_cross_attn.",
    ),
    (r"^transformer\.decoder\.layers\.(\d+)\.linear(\d)\.", r"detr_decoder.layers.\1.mlp.fc\2."),
    (
        r"^transformer\.decoder\.layers\.(\d+)\.norm1\.",
        r"detr_decoder.layers.\1.vision_cross_attn_layer_norm.",
    ),
    (
        r"^transformer\.decoder\.layers\.(\d+)\.catext_norm\.",
        r"detr_decoder.layers.\1.text_cross_attn_layer_norm.",
    ),
    (
        r"^transformer\.decoder\.layers\.(\d+)\.norm2\.",
        r"detr_decoder.layers.\1.self_attn_layer_norm.",
    ),
    (r"^transformer\.decoder\.layers\.(\d+)\.norm3\.", r"detr_decoder.layers.\1.mlp_layer_norm."),
    (r"^transformer\.decoder\.", "detr_decoder."),
    # scoring
    (
        r"^dot_prod_scoring\.prompt_mlp\.layers\.(\d)\.",
        lambda m: f"dot_product_scoring.text_mlp.layer{int(m[1]) + 1}.",
    ),
    (r"^dot_prod_scoring\.prompt_mlp\.out_norm\.", "dot_product_scoring.text_mlp_out_norm."),
    (r"^dot_prod_scoring\.prompt_proj\.", "dot_product_scoring.text_proj."),
    (r"^dot_prod_scoring\.hs_proj\.", "dot_product_scoring.query_proj."),
    # segmentation head
    (r"^segmentation_head\.pixel_decoder\.", "mask_decoder.pixel_decoder."),
    (r"^segmentation_head\.mask_predictor\.mask_embed\.", "mask_decoder.mask_embedder."),
    (r"^segmentation_head\.instance_seg_head\.", "mask_decoder.instance_projection."),
    (r"^segmentation_head\.semantic_seg_head\.", "mask_decoder.semantic_projection."),
    (
        r"^segmentation_head\.cross_attend_prompt\.out_proj\.",
        "mask_decoder.prompt_cross_attn.o_proj.",
    ),
    (r"^segmentation_head\.cross_attend_prompt\.", "mask_decoder.prompt_cross_attn."),
    (r"^segmentation_head\.cross_attn_norm\.", "mask_decoder.prompt_cross_attn_norm."),
)
_COMPILED = tuple((re.compile(p), r) for p, r in RENAMES)
# Meta's tensors with no counterpart: RoPE tables (transformers recomputes them) and the
# point-exemplar projections (point exemplars are not part of the concept path offered)
DERIVED = re.compile(r"(\.attn\.freqs_cis$)|(^geometry_encoder\.points_)")


class CheckpointMismatch(ValueError):
    """The checkpoint's tensors do not match the model's parameters one to one."""


def rename(key: str) -> str:
    for pattern, replacement in _COMPILED:
        if pattern.search(key):
            return pattern.sub(replacement, key, count=1)
    return key


def _split3(tensor: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    first, second, third = torch.chunk(tensor, 3, dim=0)
    return first, second, third


def meta_to_transformers(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Meta ``Sam3Image`` keys (optionally ``detector.``-prefixed; the tracker's keys,
    :data:`TRACKER_KEYS`, dropped) -> ``Sam3Model`` keys and layouts."""
    out: dict[str, Tensor] = {}
    for key, tensor in state.items():
        key = key.removeprefix(DETECTOR)
        if TRACKER_KEYS.match(key) or DERIVED.search(key):
            continue
        new = rename(key)
        if new.endswith((".attention.qkv.weight", ".attention.qkv.bias")):
            stem, leaf = new.rsplit(".qkv.", 1)
            for name, part in zip(("q", "k", "v"), _split3(tensor), strict=True):
                out[f"{stem}.{name}_proj.{leaf}"] = part
        elif new.endswith((".in_proj_weight", ".in_proj_bias")):
            stem, leaf = new.rsplit(".in_proj_", 1)
            for name, part in zip(("q", "k", "v"), _split3(tensor), strict=True):
                out[f"{stem}.{name}_proj.{leaf}"] = part
        elif new == "vision_encoder.backbone.embeddings.position_embeddings":
            out[new] = tensor[:, 1:, :]  # Meta's table has a class-token row first
        elif new == "text_encoder.text_projection.weight":
            out[new] = tensor.t().contiguous()
        else:
            out[new] = tensor
    return out


def check_state(expected: Mapping[str, Tensor], state: Mapping[str, Tensor]) -> None:
    """``state`` (in the model's keys) must hold every tensor of ``expected`` (a model's
    state dict, possibly on the meta device) with its shape, and nothing else; else a
    CheckpointMismatch naming what does not match."""
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    shapes = sorted(
        f"{k} {tuple(state[k].shape)} != {tuple(v.shape)}"
        for k, v in expected.items()
        if k in state and tuple(state[k].shape) != tuple(v.shape)
    )
    parts = [
        f"{label} ({len(names)}): {', '.join(names[:5])}"
        for label, names in (("missing", missing), ("unexpected", unexpected), ("shape", shapes))
        if names
    ]
    if parts:
        raise CheckpointMismatch("not a SAM 3 checkpoint: " + "; ".join(parts))


def load_strict(model: torch.nn.Module, state: dict[str, Tensor]) -> None:
    """Load ``state`` (already in the model's keys) or raise naming what does not match."""
    check_state(model.state_dict(), state)
    model.load_state_dict(state, strict=True)
