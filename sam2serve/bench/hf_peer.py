"""Modes ``hf`` and ``hf-processor``: Hugging Face transformers' SAM 2 (``Sam2Model``) on the
same weights, as benchmark rows for SPS and MPS, the alternative a user would pick.

The weights are the run's official-shaped checkpoint, converted to transformers' layout by
:func:`hf_state_dict` and loaded strictly (every parameter of ``Sam2Model`` filled, nothing
left over but Meta's video-path tensors). transformers keeps its conversion script
(``convert_sam2_to_hf.py``) in its source repository only; the wheels on the package index
(4.57 and 5.x alike) do not ship it, so the renames are written here, as rules, and the
strict load checks them.

- ``hf`` feeds ``Sam2Model`` the pixels our preprocessing makes (1024 x 1024, normalised),
  so its masks can be compared with the baseline's: the accuracy row. Its masks are
  upscaled as ``Sam2Processor.post_process_masks`` does (bilinear to the image size, > 0),
  in code here, since that processor cannot be built without torchvision.
- ``hf-processor`` runs transformers' own ``Sam2Processor`` (image and point handling and
  the mask upscaling), as its users call it: the speed row. Its image processor needs
  torchvision, which sam2serve does not install; without it the row is skipped.

Both take every prompt of an image in one forward (``point_batch_size`` = prompts, three
masks each, the best by predicted IoU kept) after one ``get_image_embeddings``; the masks
go to RLE with our encoder, as the reference row does with Meta's.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from sam2serve.config import ModelConfig, get_config
from sam2serve.engine.rle import area_from_rle, masks_to_rle, rle_to_coco
from sam2serve.engine.tasks import StageTimer, decode

__all__ = [
    "HF",
    "HF_PEERS",
    "HF_PROCESSOR",
    "HF_TASKS",
    "ROWS_NOTE",
    "HFRunner",
    "Unavailable",
    "hf_config",
    "hf_state_dict",
    "load_hf_model",
    "unavailable",
]

HF = "hf"
HF_PROCESSOR = "hf-processor"
HF_PEERS = (HF, HF_PROCESSOR)
HF_TASKS = ("sps", "mps")
ROWS_NOTE = (
    "hf / hf-processor: Hugging Face transformers' Sam2Model on the same weights (converted "
    "to its layout and loaded strictly), every prompt of an image in one forward; hf is fed "
    "our preprocessed pixels (its masks compare with the baseline's), hf-processor runs "
    "transformers' own Sam2Processor (preprocessing, points, mask upscaling); SPS and MPS "
    "only"
)
# Meta's image-path tensors; the rest of a SAM 2 checkpoint is the video path.
IMAGE_PREFIXES = ("image_encoder.", "sam_prompt_encoder.", "sam_mask_decoder.", "no_mem_embed")

if TYPE_CHECKING:
    from transformers import Sam2Model


@dataclass(frozen=True)
class Unavailable:
    row: str  # what the skipped row says
    message: str  # the report's note: why, and how to install it


def unavailable(mode: str) -> Unavailable | None:
    """Why ``mode`` cannot run here, or None (checked without importing transformers)."""
    if importlib.util.find_spec("transformers") is None:
        return Unavailable(
            "transformers not installed",
            f"mode {mode!r} needs Hugging Face transformers with SAM 2 (>= 4.56), which is "
            "not installed here; install it with: pip install 'sam2serve[bench]' (or "
            "pip install transformers, keeping this torch)",
        )
    if importlib.util.find_spec("transformers.models.sam2") is None:
        return Unavailable(
            "this transformers has no Sam2Model",
            f"mode {mode!r} needs transformers >= 4.56 (Sam2Model); upgrade it with: "
            "pip install -U transformers",
        )
    if mode == HF_PROCESSOR and importlib.util.find_spec("torchvision") is None:
        return Unavailable(
            "Sam2Processor needs torchvision",
            "mode 'hf-processor' runs transformers' Sam2ImageProcessor, which needs "
            "torchvision; sam2serve does not install it (row hf runs the same model on "
            "our preprocessing)",
        )
    return None


# --------------------------------------------------------------------------- weights


def hf_config(size: str) -> Any:
    """transformers' ``Sam2Config`` for one of our model sizes (image path numbers from
    :mod:`sam2serve.config`, the heads at SAM 2's defaults)."""
    from transformers import Sam2Config, Sam2HieraDetConfig, Sam2VisionConfig

    config: ModelConfig = get_config(size)
    trunk = config.trunk
    stages = len(trunk.stages)
    backbone = Sam2HieraDetConfig(
        hidden_size=trunk.embed_dim,
        num_attention_heads=trunk.num_heads,
        blocks_per_stage=list(trunk.stages),
        embed_dim_per_stage=[int(trunk.embed_dim * trunk.dim_mul**i) for i in range(stages)],
        num_attention_heads_per_stage=[
            int(trunk.num_heads * trunk.head_mul**i) for i in range(stages)
        ],
        window_size_per_stage=list(trunk.window_spec),
        global_attention_blocks=list(trunk.global_att_blocks),
        window_positional_embedding_background_size=list(trunk.window_pos_embed_bkg_spatial_size),
        num_query_pool_stages=trunk.q_pool,
        query_stride=list(trunk.q_stride),
        image_size=[config.image_size, config.image_size],
    )
    vision = Sam2VisionConfig(
        backbone_config=backbone,
        backbone_channel_list=list(trunk.channel_list),
        fpn_top_down_levels=list(config.fpn_top_down_levels),
    )
    return Sam2Config(vision_config=vision)


# Meta name -> transformers name, applied in order to each image-path key. Three-layer MLPs
# (IoU head, hypernetworks, object-score head) become proj_in / layers.0 / proj_out, the
# two-layer ones (trunk blocks, decoder transformer) proj_in / proj_out.
_RENAMES: tuple[tuple[str, str], ...] = (
    (r"^image_encoder\.trunk\.", "vision_encoder.backbone."),
    (r"^image_encoder\.neck\.convs\.(\d+)\.conv\.", r"vision_encoder.neck.convs.\1."),
    (r"^sam_prompt_encoder\.", "prompt_encoder."),
    (r"^sam_mask_decoder\.", "mask_decoder."),
    (r"^no_mem_embed$", "no_memory_embedding"),
    (r"\.norm(\d)\.", r".layer_norm\1."),
    (r"\.norm_final_attn\.", ".layer_norm_final_attn."),
    (r"\.out_proj\.", ".o_proj."),
    (r"\.patch_embed\.proj\.", ".patch_embed.projection."),
    (r"(blocks\.\d+|transformer\.layers\.\d+)\.mlp\.layers\.0\.", r"\1.mlp.proj_in."),
    (r"(blocks\.\d+|transformer\.layers\.\d+)\.mlp\.layers\.1\.", r"\1.mlp.proj_out."),
    (r"(_head|_mlps\.\d+)\.layers\.0\.", r"\1.proj_in."),
    (r"(_head|_mlps\.\d+)\.layers\.1\.", r"\1.layers.0."),
    (r"(_head|_mlps\.\d+)\.layers\.2\.", r"\1.proj_out."),
    (r"\.output_upscaling\.0\.", ".upscale_conv1."),
    (r"\.output_upscaling\.1\.", ".upscale_layer_norm."),
    (r"\.output_upscaling\.3\.", ".upscale_conv2."),
    (r"\.mask_downscaling\.0\.", ".mask_embed.conv1."),
    (r"\.mask_downscaling\.1\.", ".mask_embed.layer_norm1."),
    (r"\.mask_downscaling\.3\.", ".mask_embed.conv2."),
    (r"\.mask_downscaling\.4\.", ".mask_embed.layer_norm2."),
    (r"\.mask_downscaling\.6\.", ".mask_embed.conv3."),
    (r"\.pe_layer\.positional_encoding_gaussian_matrix$", ".shared_embedding.positional_embedding"),
)
_POINT_EMBEDDING = re.compile(r"^prompt_encoder\.point_embeddings\.(\d+)\.weight$")


def hf_state_dict(meta: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The image path of a Meta-format SAM 2 state dict in ``Sam2Model``'s names."""
    state: dict[str, torch.Tensor] = {}
    point_embeddings: dict[int, torch.Tensor] = {}
    for key, value in meta.items():
        if not key.startswith(IMAGE_PREFIXES):
            continue
        for pattern, replacement in _RENAMES:
            key = re.sub(pattern, replacement, key)
        match = _POINT_EMBEDDING.match(key)
        if match:  # four (1, C) embeddings -> one (4, C) table
            point_embeddings[int(match.group(1))] = value
            continue
        state[key] = value
    if point_embeddings:
        state["prompt_encoder.point_embed.weight"] = torch.cat(
            [point_embeddings[i] for i in sorted(point_embeddings)]
        )
    # Sam2Model keeps the prompt encoder's random Fourier matrix a second time, for the
    # image-wide positional encoding.
    shared = state.get("prompt_encoder.shared_embedding.positional_embedding")
    if shared is not None:
        state["shared_image_embedding.positional_embedding"] = shared
    return state


def load_hf_model(size: str, checkpoint: Path, device: str = "cpu") -> Sam2Model:
    """``Sam2Model`` with the checkpoint's weights; a RuntimeError names any parameter left
    unfilled or any converted key it does not have."""
    from transformers import Sam2Model

    meta = torch.load(checkpoint, map_location="cpu", weights_only=True)
    meta = meta.get("model", meta)
    model = Sam2Model(hf_config(size))
    missing, unexpected = model.load_state_dict(hf_state_dict(meta), strict=False)
    if missing or unexpected:
        raise RuntimeError(
            f"converting {checkpoint.name} to Sam2Model left {len(missing)} parameter(s) "
            f"unfilled ({', '.join(missing[:4])}) and {len(unexpected)} key(s) unknown "
            f"({', '.join(unexpected[:4])})"
        )
    model.to(device)  # type: ignore[arg-type]  # transformers' @wraps on PreTrainedModel.to hides its self
    model.eval()
    return model


# --------------------------------------------------------------------------- the runner


class HFRunner:
    """transformers' SAM 2 for one point task; ``runner(image_bytes, points, timer)``."""

    def __init__(
        self, task: str, size: str, checkpoint: Path, device: str, use_processor: bool
    ) -> None:
        if task not in HF_TASKS:
            raise ValueError(f"the transformers peer runs {', '.join(HF_TASKS)}, not {task!r}")
        self.device = torch.device(device)
        self.model = load_hf_model(size, checkpoint, device)
        self.image_size = get_config(size).image_size
        self.processor = None
        if use_processor:
            from transformers import Sam2ImageProcessor, Sam2Processor

            self.processor = Sam2Processor(image_processor=Sam2ImageProcessor())

    @torch.inference_mode()
    def __call__(
        self, image: bytes, points: Sequence[Sequence[float]] | None, timer: StageTimer
    ) -> list[dict[str, Any]]:
        pixels = decode(image, timer)
        height, width = pixels.shape[:2]
        points = [list(map(float, p)) for p in points or []]
        with timer.stage("preprocess"):
            if self.processor is not None:
                inputs = self.processor(
                    images=pixels,
                    input_points=[[[p] for p in points]] if points else None,
                    input_labels=[[[1] for _ in points]] if points else None,
                    return_tensors="pt",
                ).to(self.device)
                pixel_values = inputs["pixel_values"]
            else:
                from sam2serve.engine.image import preprocess

                pixel_values = preprocess([pixels], self.image_size, self.device)
        with timer.stage("encode"):
            embeddings = self.model.get_image_embeddings(pixel_values)
        if not points:
            return []
        with timer.stage("decode_masks"):
            if self.processor is not None:
                coords, labels = inputs["input_points"], inputs["input_labels"]
            else:  # image pixels -> the 1024 input frame, as the processor does
                scale = torch.tensor([self.image_size / width, self.image_size / height])
                coords = (torch.tensor(points) * scale)[None, :, None, :].to(self.device)
                labels = torch.ones(coords.shape[:3], dtype=torch.int64, device=self.device)
            out = self.model(
                image_embeddings=embeddings,
                input_points=coords,
                input_labels=labels,
                multimask_output=True,
            )
        with timer.stage("postprocess"):
            scores, low_res = out.iou_scores[0], out.pred_masks[0]  # (N, 3), (N, 3, h, w)
            best = scores.argmax(dim=1)
            low_res = low_res[torch.arange(len(best), device=best.device), best][:, None]
            if self.processor is not None:
                masks = self.processor.post_process_masks([low_res], [[height, width]])[0]
            else:
                upscaled = torch.nn.functional.interpolate(
                    low_res, (height, width), mode="bilinear", align_corners=False
                )
                masks = upscaled > 0
            masks = masks[:, 0]
        with timer.stage("rle"):
            rles = masks_to_rle(masks)
            return [{"segmentation": rle_to_coco(rle), "area": area_from_rle(rle)} for rle in rles]
