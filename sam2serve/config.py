"""Model sizes of SAM2.1 (and SAM2.0, which shares the image-path architecture) as code.

The numbers are those of Meta's published Hydra configs (``sam2.1_hiera_{t,s,b+,l}.yaml``);
the image path (Hiera trunk, FPN neck, SAM heads) differs per size; the video memory path
(:class:`VideoConfig`) is the same for all four sizes in SAM 2.1.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

IMAGE_SIZE = 1024
# Stride of the lowest-resolution feature map the SAM heads see (64x64 at 1024 input).
BACKBONE_STRIDE = 16
PROMPT_EMBED_DIM = 256


@dataclass(frozen=True)
class WeightsInfo:
    """Where a model's weights came from; printed and written with every result (a model
    carries it as ``weights_info``, set by :mod:`sam2serve.checkpoint`'s loaders)."""

    source: str  # "checkpoint" or "random"
    path: str | None = None
    seed: int | None = None

    @property
    def is_random(self) -> bool:
        return self.source == "random"

    def describe(self) -> str:
        if self.is_random:
            return f"RANDOM WEIGHTS (seed {self.seed}) - not a trained model, masks are meaningless"
        return f"checkpoint {self.path}"

    def as_dict(self) -> dict[str, object]:
        return {"source": self.source, "path": self.path, "seed": self.seed}


@dataclass(frozen=True)
class HieraConfig:
    embed_dim: int
    num_heads: int
    stages: tuple[int, ...]
    global_att_blocks: tuple[int, ...]
    window_pos_embed_bkg_spatial_size: tuple[int, int]
    window_spec: tuple[int, ...] = (8, 4, 14, 7)
    q_pool: int = 3
    q_stride: tuple[int, int] = (2, 2)
    dim_mul: float = 2.0
    head_mul: float = 2.0

    @property
    def channel_list(self) -> tuple[int, ...]:
        """Channels of the four stage outputs, lowest resolution first (as the neck wants)."""
        dims = [int(self.embed_dim * self.dim_mul**i) for i in range(len(self.stages))]
        return tuple(reversed(dims))


@dataclass(frozen=True)
class VideoConfig:
    """The memory path of SAM 2.1 (identical in the four ``sam2.1_hiera_*.yaml``), plus the
    settings Meta's ``build_sam2_video_predictor`` adds on top of the yaml.

    Only the values SAM 2.1 uses are implemented; the fields record them so that the code
    that depends on them says so, and so a future variant changes one place.
    """

    # Memory bank: the prompted ("conditioning") frames plus the 6 frames before the current
    # one (num_maskmem - 1), each with a learned temporal embedding maskmem_tpos_enc[i].
    num_maskmem: int = 7
    mem_dim: int = 64  # memory encoder output channels (memory_encoder.out_proj)
    memory_attention_layers: int = 4
    memory_attention_ffn_dim: int = 2048
    rope_theta: float = 10000.0
    # -1: every conditioning frame is attended to (no selection of the closest ones).
    max_cond_frames_in_attn: int = -1
    # 1: the previous frames in the memory bank are consecutive (no temporal stride).
    memory_temporal_stride_for_eval: int = 1
    # Mask logits -> memory-encoder input: sigmoid(logits) * 20 - 10 (binarized first for
    # masks that came straight from clicks: binarize_mask_from_pts_for_mem_enc, set by
    # Meta's build_sam2_video_predictor).
    sigmoid_scale_for_mem_enc: float = 20.0
    sigmoid_bias_for_mem_enc: float = -10.0
    binarize_mask_from_pts_for_mem_enc: bool = True
    # A mask prompt becomes the output directly (logits 20 * mask - 10), not a SAM decode.
    use_mask_input_as_output_without_sam: bool = True
    # On a frame with no memory yet, no_mem_embed is added to the features (as on images)
    # rather than attended to as a single "no memory" token.
    directly_add_no_mem_embed: bool = True
    # A learned embedding added to the memory of frames where the object is judged absent.
    no_obj_embed_spatial: bool = True
    # The stride-4/8 features feed the mask decoder (as in the image path).
    use_high_res_features_in_sam: bool = True
    # Three candidate masks for 0 or 1 click, on the first frame and while tracking; the
    # object pointer then comes from the chosen candidate's token.
    multimask_output_in_sam: bool = True
    multimask_output_for_tracking: bool = True
    multimask_min_pt_num: int = 0
    multimask_max_pt_num: int = 1
    use_multimask_token_for_obj_ptr: bool = True
    # Object pointers: one 256-d token per frame from the SAM output token (a 3-layer MLP,
    # use_mlp_for_obj_ptr_proj), split into 4 tokens of mem_dim for the cross-attention,
    # with a signed sine temporal encoding projected to mem_dim (proj_tpos_enc_in_obj_ptrs),
    # taken only from the past of the tracking direction, at most max_obj_ptrs_in_encoder.
    use_obj_ptrs_in_encoder: bool = True
    max_obj_ptrs_in_encoder: int = 16
    add_tpos_enc_to_obj_ptrs: bool = True
    proj_tpos_enc_in_obj_ptrs: bool = True
    use_signed_tpos_enc_to_obj_ptrs: bool = True
    only_obj_ptrs_in_the_past_for_eval: bool = True
    use_mlp_for_obj_ptr_proj: bool = True
    # Object-score head; an absent object gets the learned no_obj_ptr instead of its
    # pointer (fixed_no_obj_ptr: a hard switch on score > 0, not soft_no_obj_ptr).
    pred_obj_scores: bool = True
    fixed_no_obj_ptr: bool = True
    soft_no_obj_ptr: bool = False
    # Predictor settings (SAM2VideoPredictor). Meta's build_sam2_video_predictor sets
    # fill_hole_area=8, which needs Meta's CUDA connected-components extension and is
    # skipped (with a warning) without it; we do not implement it: 0 is the behaviour of
    # Meta's predictor without the extension (every CPU install).
    fill_hole_area: int = 0
    non_overlap_masks: bool = False  # output masks may overlap (no per-pixel argmax)
    non_overlap_masks_for_mem_enc: bool = False
    clear_non_cond_mem_around_input: bool = False
    # A correction on an already tracked frame stays a non-conditioning frame.
    add_all_frames_to_correct_as_cond: bool = False
    # Meta stores memories in bfloat16 (halves the state); kept for bit-compatible results.
    memory_dtype_name: str = "bfloat16"
    # Meta's compile_image_encoder is False for SAM 2.1 (compilation is the runtime's job).
    compile_image_encoder: bool = False

    def use_multimask(self, is_init_cond_frame: bool, num_points: int) -> bool:
        """Three mask candidates for 0 or 1 click (SAM 2.1: on first and tracked frames
        alike)."""
        return (
            self.multimask_output_in_sam
            and (is_init_cond_frame or self.multimask_output_for_tracking)
            and self.multimask_min_pt_num <= num_points <= self.multimask_max_pt_num
        )


@dataclass(frozen=True)
class ModelConfig:
    name: str
    trunk: HieraConfig
    image_size: int = IMAGE_SIZE
    d_model: int = PROMPT_EMBED_DIM
    # Output levels 0 and 1 use only lateral features; 2 and 3 get the top-down path.
    fpn_top_down_levels: tuple[int, ...] = (2, 3)
    # Number of lowest-resolution levels the neck computes but the heads never use.
    scalp: int = 1
    checkpoint_names: tuple[str, ...] = field(default_factory=tuple)
    video: VideoConfig = field(default_factory=VideoConfig)

    @property
    def embedding_size(self) -> int:
        return self.image_size // BACKBONE_STRIDE


MODEL_CONFIGS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(
        name="tiny",
        trunk=HieraConfig(
            embed_dim=96,
            num_heads=1,
            stages=(1, 2, 7, 2),
            global_att_blocks=(5, 7, 9),
            window_pos_embed_bkg_spatial_size=(7, 7),
        ),
        checkpoint_names=("sam2.1_hiera_tiny.pt", "sam2_hiera_tiny.pt"),
    ),
    "small": ModelConfig(
        name="small",
        trunk=HieraConfig(
            embed_dim=96,
            num_heads=1,
            stages=(1, 2, 11, 2),
            global_att_blocks=(7, 10, 13),
            window_pos_embed_bkg_spatial_size=(7, 7),
        ),
        checkpoint_names=("sam2.1_hiera_small.pt", "sam2_hiera_small.pt"),
    ),
    "base_plus": ModelConfig(
        name="base_plus",
        trunk=HieraConfig(
            embed_dim=112,
            num_heads=2,
            stages=(2, 3, 16, 3),
            global_att_blocks=(12, 16, 20),
            window_pos_embed_bkg_spatial_size=(14, 14),
        ),
        checkpoint_names=("sam2.1_hiera_base_plus.pt", "sam2_hiera_base_plus.pt"),
    ),
    "large": ModelConfig(
        name="large",
        trunk=HieraConfig(
            embed_dim=144,
            num_heads=2,
            stages=(2, 6, 36, 4),
            global_att_blocks=(23, 33, 43),
            window_pos_embed_bkg_spatial_size=(7, 7),
            window_spec=(8, 4, 16, 8),
        ),
        checkpoint_names=("sam2.1_hiera_large.pt", "sam2_hiera_large.pt"),
    ),
}

MODEL_SIZES = tuple(MODEL_CONFIGS)

# Meta's Hugging Face ids (the names in Meta's README and model cards):
# facebook/sam2.1-hiera-{tiny,small,base-plus,large}, and SAM 2.0's facebook/sam2-hiera-*.
_HF_ID = re.compile(r"^(?:facebook/)?sam2(\.1)?-hiera-(tiny|small|base-plus|large)$")
HF_MODEL_IDS = tuple(f"facebook/sam2.1-hiera-{size.replace('_', '-')}" for size in MODEL_SIZES)
ACCEPTED_MODELS = ", ".join((*MODEL_SIZES, *HF_MODEL_IDS))


def parse_hf_id(name: str) -> tuple[str, bool] | None:
    """``(size, is_sam21)`` of a Hugging Face id (any case, ``facebook/`` optional), or
    None for any other name."""
    match = _HF_ID.match(name.strip().lower())
    if match is None:
        return None
    return match.group(2).replace("-", "_"), match.group(1) is not None


def model_size(name: str) -> str:
    """The model size a name stands for: a size (``tiny``) or a SAM 2.1 Hugging Face id
    (``facebook/sam2.1-hiera-tiny``). The one lookup behind every ``--model``; a
    ValueError names the accepted names (SAM 2.0's ids: what to do instead)."""
    if name in MODEL_CONFIGS:
        return name
    hf = parse_hf_id(name)
    if hf is None:
        raise ValueError(f"unknown model {name!r}; expected one of {ACCEPTED_MODELS}")
    size, is_sam21 = hf
    if not is_sam21:
        raise ValueError(
            f"model {name!r} names SAM 2.0 weights and sam2serve's models are SAM 2.1: use "
            f"model {size!r} with SAM 2.0's file sam2_hiera_{size}.pt as the checkpoint "
            f"('sam2serve download --model {name}' fetches it)"
        )
    return size


def get_config(size: str) -> ModelConfig:
    """The config of a model size (or of its Hugging Face id); a clear error names the
    accepted names."""
    return MODEL_CONFIGS[model_size(size)]
