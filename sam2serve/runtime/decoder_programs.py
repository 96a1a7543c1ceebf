"""The fast mask decoder as ahead-of-time compiled programs (torch.export + AOTInductor).

``sam2serve export`` writes three ``.pt2`` packages of :class:`FastMaskDecoder`, traced
from the same code the eager modes run, so their answers are the eager ones up to float
reassociation:

- ``decoder_side.pt2``, once per image: (image_embed, high-res features) -> the image
  side as one flat list of tensors (:data:`SIDE_LAYOUT`: the stacked projections of the
  keys, the LayerNorm statistics, the upscaling's high-res features; the positional
  encoding's projections, a model constant, are the eager decoder's, added at load);
- ``decoder_prompts.pt2``, once per chunk of prompts: (sparse prompt embeddings
  (B, N, C), image side) -> IoU predictions (B, 4), hypernetwork outputs (B, 4, c) and
  the final keys (scale, coef, vecs): the transformer, everything before the pixels;
- ``decoder_masks.pt2``, once per chunk of kept prompts: (scale, coef, vecs, hypernetwork
  outputs (B, M, c), image side) -> low-res logits (B, M, 256, 256): the upscaling.

Prompts (B), points per prompt (N), masks (M) and the low rank (R) are dynamic. The IoU
filter between the last two programs stays eager: how many prompts survive is data.

Why: the transformer's symbolic keys are many short passes over (B, R, 4096) tensors;
Inductor fuses them. Compilation happens once, at export; loading compiles nothing.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from sam2serve.modeling.fast_mask_decoder import FastMaskDecoder, FinalKeys, ImageSide
from sam2serve.modeling.mask_decoder import MaskDecoder
from sam2serve.modeling.prompt_encoder import PromptEncoder
from sam2serve.runtime.aoti import AOTIProgram, compile_target

SIDE_PT2 = "decoder_side.pt2"
PROMPTS_PT2 = "decoder_prompts.pt2"
MASKS_PT2 = "decoder_masks.pt2"
PROGRAM_FILES = (SIDE_PT2, PROMPTS_PT2, MASKS_PT2)
ALL_MASKS = [0, 1, 2, 3]
# Bounds of the dynamic dimensions (torch.export needs them finite to reason about shapes).
MAX_PROMPTS = 1024
MAX_POINTS = 64
# The image side as the programs pass it: ImageSide's tensors in this order; the side
# program makes all but "pe" (the model constant, added by the loader).
SIDE_LAYOUT = ("proj", "up", "pe", "stats", "s1", "s0")
PER_IMAGE = tuple(name for name in SIDE_LAYOUT if name != "pe")
# What the programs' tensors mean (the side's blocks and statistics, the final keys' rows),
# recorded in the manifest: programs of another interface run eagerly instead. 2: keys
# with a linear map of K (each LayerNorm adds one row), one statistic per LayerNorm.
INTERFACE = 2


def side_leaves(side: ImageSide) -> list[torch.Tensor]:
    return [side.tensors[name] for name in SIDE_LAYOUT]


def side_from_leaves(
    fast: FastMaskDecoder, leaves: list[torch.Tensor], size: tuple[int, int]
) -> ImageSide:
    """The :class:`ImageSide` of the embedding ``size`` (h, w) that ``leaves`` flatten."""
    return ImageSide(dict(zip(SIDE_LAYOUT, leaves, strict=True)), size, fast.plan)


class _SideProgram(torch.nn.Module):
    """Per image: the image side without the positional constant. The positional encoding
    and the no-mask embedding are the prompt encoder's constants, computed inside."""

    def __init__(self, fast: FastMaskDecoder, prompt_encoder: PromptEncoder):
        super().__init__()
        self.fast, self.prompt_encoder = fast, prompt_encoder

    def forward(
        self, image_embed: torch.Tensor, high_res_s0: torch.Tensor, high_res_s1: torch.Tensor
    ) -> list[torch.Tensor]:
        side = _side(self.fast, self.prompt_encoder, image_embed, (high_res_s0, high_res_s1))
        return [side.tensors[name].contiguous() for name in PER_IMAGE]


class _PromptsProgram(torch.nn.Module):
    """Per chunk of prompts: (sparse embeddings, image side) -> iou, hyper, scale, coef,
    vecs."""

    def __init__(self, fast: FastMaskDecoder, size: tuple[int, int]) -> None:
        super().__init__()
        self.fast, self.size = fast, size

    def forward(self, sparse: torch.Tensor, leaves: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        side = side_from_leaves(self.fast, leaves, self.size)
        iou, hyper, keys = self.fast.decode_prompts(side, sparse, ALL_MASKS)
        return iou, hyper, keys.scale, keys.coef, keys.vecs


class _MasksProgram(torch.nn.Module):
    """Per chunk of kept prompts: (scale, coef, vecs, hyper, image side) -> low-res logits."""

    def __init__(self, fast: FastMaskDecoder, size: tuple[int, int]) -> None:
        super().__init__()
        self.fast, self.size = fast, size

    def forward(
        self,
        scale: torch.Tensor,
        coef: torch.Tensor,
        vecs: torch.Tensor,
        hyper: torch.Tensor,
        leaves: list[torch.Tensor],
    ) -> torch.Tensor:
        side = side_from_leaves(self.fast, leaves, self.size)
        return self.fast.upscale(side, FinalKeys(scale, coef, vecs), hyper)


def _side(
    fast: FastMaskDecoder,
    prompt_encoder: PromptEncoder,
    image_embed: torch.Tensor,
    high_res_feats: tuple[torch.Tensor, torch.Tensor],
) -> ImageSide:
    return fast.prepare(
        image_embed,
        prompt_encoder.dense_positional_encoding(),
        prompt_encoder.no_mask_dense(),
        high_res_feats,
    )


def _inductor_configs() -> dict[str, object]:
    """Inductor settings for the programs. Triton's coalescing analysis (its tiling
    heuristic) asserts on the masks program's dynamic shapes in torch 2.11 (seen on an
    H100: ``tiling_utils.get_pw_red_splits``); without it the kernels keep the default
    tiling. CPU code generation does not run it."""
    triton = torch._inductor.config.triton
    if hasattr(triton, "coalesce_tiling_analysis"):
        return {"triton.coalesce_tiling_analysis": False}
    return {}


def export_decoder_programs(
    fast: FastMaskDecoder,
    prompt_encoder: PromptEncoder,
    image_embed: torch.Tensor,
    high_res_feats: tuple[torch.Tensor, torch.Tensor],
    out: Path,
    progress: Callable[[str], None] = lambda step: None,
) -> dict[str, Any]:
    """Export and compile the three programs into ``out``, traced on one image's features;
    returns their manifest entry (file names, the side's layout, the decoder's dtype).

    Every example input is contiguous: a compiled program assumes its inputs' strides are
    the examples' (an expanded example made it misread contiguous tensors), and
    :class:`CompiledFastDecoder` passes contiguous tensors only."""
    image_embed = image_embed.float().contiguous()
    s0, s1 = (t.float().contiguous() for t in high_res_feats)
    high_res_feats = (s0, s1)
    with torch.inference_mode():
        side = _side(fast, prompt_encoder, image_embed, high_res_feats)
        leaves = [t.contiguous() for t in side_leaves(side)]
        channels = image_embed.shape[1]
        generator = torch.Generator().manual_seed(0)
        sparse = torch.randn(4, 2, channels, generator=generator).to(image_embed.device)
        _, hyper, scale, coef, vecs = _PromptsProgram(fast, side.size)(sparse, leaves)
        finals = [t.contiguous() for t in (scale, coef, vecs, hyper[:, 1:])]
    prompts = torch.export.Dim("prompts", max=MAX_PROMPTS)
    # A prompt is at least two points: a click and the padding point, or a box's corners.
    points = torch.export.Dim("points", min=2, max=MAX_POINTS)
    masks, rank = torch.export.Dim("masks", max=len(ALL_MASKS)), torch.export.Dim("rank")
    fixed = [None] * len(leaves)
    programs = (
        (SIDE_PT2, _SideProgram(fast, prompt_encoder), (image_embed, *high_res_feats), None),
        (
            PROMPTS_PT2,
            _PromptsProgram(fast, side.size),
            (sparse, leaves),
            ({0: prompts, 1: points}, fixed),
        ),
        (
            MASKS_PT2,
            _MasksProgram(fast, side.size),
            (*finals, leaves),
            (
                {0: prompts},
                {0: prompts, 1: rank},
                {0: prompts, 1: rank},
                {0: prompts, 1: masks},
                fixed,
            ),
        ),
    )
    for number, (name, module, args, dynamic) in enumerate(programs, 1):
        progress(f"mask decoder: torch.export + AOTInductor, program {number}/3 ({name})")
        with torch.no_grad(), warnings.catch_warnings():
            # torch's own deprecation notices from inside export and Inductor, printed
            # dozens of times per program; nothing the user can act on.
            warnings.filterwarnings("ignore", ".*LeafSpec.*", FutureWarning)
            warnings.filterwarnings("ignore", ".*TypedStorage.*", UserWarning)
            program = torch.export.export(
                module.eval(),
                args,
                dynamic_shapes=dynamic,
                prefer_deferred_runtime_asserts_over_guards=True,
            )
            torch._inductor.aoti_compile_and_package(
                program, package_path=str(out / name), inductor_configs=_inductor_configs()
            )
    return {
        "backend": "aoti",
        "files": list(PROGRAM_FILES),
        "layout": list(SIDE_LAYOUT),
        # What the programs were compiled for: this CPU's name, or this GPU and its
        # architecture (they run only on the same).
        "device": image_embed.device.type,
        "target": compile_target(image_embed.device),
        "dtype": str(fast.dtype).removeprefix("torch."),
        "interface": INTERFACE,
    }


class CompiledFastDecoder(FastMaskDecoder):
    """:class:`FastMaskDecoder` with its three stages run by the exported programs; the
    filter between them (``forward``) is the eager one."""

    source = "AOTInductor programs, not compiled"

    def __init__(
        self, decoder: MaskDecoder, directory: Path, entry: dict[str, Any], device: torch.device
    ) -> None:
        super().__init__(decoder, getattr(torch, entry["dtype"]))
        self.side_program = AOTIProgram(directory / SIDE_PT2, device)
        self.prompts_program = AOTIProgram(directory / PROMPTS_PT2, device)
        self.masks_program = AOTIProgram(directory / MASKS_PT2, device)

    def prepare(
        self,
        image_embed: torch.Tensor,
        image_pe: torch.Tensor,
        no_mask_dense: torch.Tensor,
        high_res_feats: tuple[torch.Tensor, torch.Tensor],
    ) -> ImageSide:
        # The positional encoding and no-mask embedding are constants inside the program;
        # the positional encoding's projections are the eager decoder's constant. The side
        # is the eager decoder's ImageSide (the programs read it as its flat leaves).
        inputs = (image_embed, *high_res_feats)
        per_image = dict(
            zip(PER_IMAGE, self.side_program([t.float().contiguous() for t in inputs]))
        )
        per_image["pe"] = self.pe_projections(image_pe, self.dtype)
        leaves = [per_image[name].contiguous() for name in SIDE_LAYOUT]
        return side_from_leaves(self, leaves, (image_embed.shape[-2], image_embed.shape[-1]))

    def decode_prompts(
        self, side: ImageSide, sparse_embeddings: torch.Tensor, mask_indices: list[int]
    ) -> tuple[torch.Tensor, torch.Tensor, FinalKeys]:
        prompts, points = sparse_embeddings.shape[:2]
        if prompts > MAX_PROMPTS or not 2 <= points <= MAX_POINTS:
            # Outside the range torch.export reasoned about (the compiled program does not
            # check it): the eager stage, on the same precomputed side.
            return super().decode_prompts(side, sparse_embeddings, mask_indices)
        iou, hyper, scale, coef, vecs = self.prompts_program(
            [sparse_embeddings.float().contiguous(), *side_leaves(side)]
        )
        if mask_indices != ALL_MASKS:  # not a list index: that would be a host sync
            hyper = torch.stack([hyper[:, m] for m in mask_indices], dim=1)
        return iou, hyper, FinalKeys(scale, coef, vecs)

    def decode_filtered(
        self,
        side: ImageSide,
        sparse_embeddings: torch.Tensor,
        mask_indices: list[int],
        keep: Callable[[torch.Tensor], torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, FinalKeys]:
        """The prompts program decodes every prompt's masks; the filter selects after it."""
        iou, hyper, keys = self.decode_prompts(side, sparse_embeddings, mask_indices)
        rows = keep(iou)
        return iou, rows, hyper[rows], keys.select(rows)

    def upscale(self, side: ImageSide, keys: FinalKeys, hyper: torch.Tensor) -> torch.Tensor:
        finals = (keys.scale, keys.coef, keys.vecs, hyper)
        logits: torch.Tensor = self.masks_program(
            [*(t.contiguous() for t in finals), *side_leaves(side)]
        )[0]
        return logits


def load_fast_decoder(
    decoder: MaskDecoder, directory: Path, entry: dict[str, Any], device: torch.device
) -> FastMaskDecoder:
    """The exported programs on ``device``, or, if they were compiled for another CPU or
    GPU (Inductor targets the exporting CPU's instruction set, or the exporting GPU's
    architecture) or for another version of the decoder's interfaces (:data:`INTERFACE`),
    the eager fast decoder with the same dtype."""
    here = compile_target(device)
    why = None
    if entry.get("target") != here:
        why = f"programs compiled for {entry.get('target')!r}, not {here!r}"
    elif entry.get("interface", 1) != INTERFACE:
        version = entry.get("interface", 1)
        why = f"programs of decoder interface {version}, not {INTERFACE}: export again"
    if why is not None:
        eager = FastMaskDecoder(decoder, getattr(torch, entry["dtype"]))
        eager.source = f"eager ({why})"
        return eager
    return CompiledFastDecoder(decoder, directory, entry, device)
