"""SAM 3's tracker heads: the "sam2" neck on SAM 3's ViT and the SAM-style prompt encoder and
mask decoder of SAM 3's tracker, with their weights from Meta's ``sam3.pt``.

Meta's SAM 3 backbone carries a dual ViTDet neck (``sam3.model.necks.Sam3DualViTDetNeck``):
the detector's FPN and a second FPN of the same shape (``sam2_convs``) whose levels feed the
tracker. Meta computes four levels (scales 4, 2, 1, 0.5) and drops the last (``scalp=1``):
at 1008 px the tracker sees 256 x 288², 256 x 144² and 256 x 72² maps (stride 14, not
SAM 2.1's 16). The tracker's heads are SAM 2.1's (``sam3.sam.prompt_encoder``,
``sam3.sam.mask_decoder``, ``sam3.sam.transformer``: the same math as Meta's sam2, built by
Meta's ``build_tracker`` with SAM 2.1's settings: 3 multimask outputs, IoU head with
sigmoid, object-score head, high-res features, dynamic multimask via stability 0.05 / 0.98),
so they are this project's SAM 2.1 modules (:class:`~sam2serve.modeling.sam2.SAM2Image`
without its image encoder) sized for SAM 3's 1008 px input and 72² grid.

Checkpoint keys (Meta's combined image + video file): the neck is
``detector.backbone.vision_backbone.sam2_convs.*``; the heads are ``tracker.sam_prompt_encoder.*``,
``tracker.sam_mask_decoder.*`` and ``tracker.no_mem_embed``. The rest of ``tracker.*`` is the
video tracker's memory (:data:`VIDEO_TRACKER_PREFIXES`), which this module does not build:
:func:`split_tracker_state` hands those keys back for the video tracker to load.

The neck (:class:`TrackerNeck`) and the key mapping (:func:`tracker_key`, :func:`neck_key`)
are also the video tracker's (:mod:`sam2serve.concepts.video_tracker`,
:mod:`sam2serve.concepts.video_load`). One neck pass per image gives the three levels
(:meth:`TrackerHeads.neck_levels`); the
interactive path projects them once into an :class:`~sam2serve.engine.predictor.Embedding`
(:meth:`TrackerHeads.embedding`: ``no_mem_embed`` added to the 72² map, as Meta's
``predict_inst`` does for an image with no memory; ``conv_s0`` / ``conv_s1`` applied to the
high-resolution levels, as its ``Sam3Processor.set_image`` does), which SAM 2.1's
:class:`~sam2serve.engine.predictor.Predictor` decodes unchanged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from sam2serve.concepts.checkpoint import DETECTOR, CheckpointMismatch, rename
from sam2serve.concepts.model import Sam3Size
from sam2serve.config import HieraConfig, ModelConfig
from sam2serve.engine.predictor import Embedding
from sam2serve.modeling.sam2 import SAM2Image

TRACKER = "tracker."
# Meta's dual neck's second FPN, in the detector's keys (after DETECTOR is dropped)
SAM2_NECK = "backbone.vision_backbone.sam2_convs."
# The scales of Meta's dual neck; the last level is computed by Meta and dropped (scalp=1):
# its weights are loaded (strictly) and never run here.
NECK_SCALES = (4.0, 2.0, 1.0, 0.5)
USED_LEVELS = 3
PATCH = 14  # SAM 3's ViT patch size: the stride of the tracker's lowest-resolution map
D_MODEL = 256
# The tracker heads' own keys, under TRACKER
HEAD_PREFIXES = ("sam_prompt_encoder.", "sam_mask_decoder.", "no_mem_embed")
# The video tracker's keys under TRACKER (memory encoder, memory attention, object pointers),
# not built here; anything else under TRACKER is an unknown key.
VIDEO_TRACKER_PREFIXES = (
    "maskmem_backbone.",
    "transformer.",
    "maskmem_tpos_enc",
    "no_mem_pos_enc",
    "no_obj_ptr",
    "no_obj_embed_spatial",
    "mask_downsample.",
    "obj_ptr_proj.",
    "obj_ptr_tpos_proj.",
)

# The detector's neck's keys: the tracker's neck is renamed by the same rules
# (:data:`sam2serve.concepts.checkpoint.RENAMES`) as the detector's FPN.
_DETECTOR_NECK = "backbone.vision_backbone.convs."
_DETECTOR_NECK_MODULE = "vision_encoder.neck."
# Meta's tracker builds its two-way transformer's MLPs as ``MLPBlock`` (lin1, lin2); ours
# (and Meta's sam2) as an MLP with ``layers.0``, ``layers.1``: the same two Linear layers.
_MLP_BLOCK = re.compile(r"\.mlp\.lin([12])\.")


@dataclass(frozen=True)
class TrackerConfig(ModelConfig):
    """SAM 2.1's model configuration with SAM 3's input size and stride (the heads only:
    there is no Hiera trunk, ``trunk`` is a placeholder never built)."""

    @property
    def embedding_size(self) -> int:
        return self.image_size // PATCH


def tracker_config(size: Sam3Size) -> TrackerConfig:
    placeholder = HieraConfig(
        embed_dim=0,
        num_heads=0,
        stages=(),
        global_att_blocks=(),
        window_pos_embed_bkg_spatial_size=(0, 0),
    )
    return TrackerConfig(name="sam3-tracker", trunk=placeholder, image_size=size.image_size)


class TrackerNeck(nn.Module):
    """The tracker's FPN neck over SAM 3's ViT output (Meta's ``sam2_convs``: a copy of the
    detector's neck with its own weights; transformers' ``Sam3FPNLayer`` per scale, named as
    transformers' ``Sam3VisionNeck``). All four levels' weights load; the coarsest is never
    run (Meta drops it: ``scalp=1``)."""

    def __init__(self, vit_dim: int) -> None:
        super().__init__()
        from transformers.models.sam3.modeling_sam3 import (
            Sam3FPNLayer,
            Sam3SinePositionEmbedding,
        )

        self.fpn_layers = nn.ModuleList(Sam3FPNLayer(vit_dim, D_MODEL, s) for s in NECK_SCALES)
        self.position_encoding = Sam3SinePositionEmbedding(D_MODEL // 2, normalize=True)

    def forward(self, vit_spatial: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """ViT output (B, C, G, G) -> the three levels the tracker uses, (B, 256, 4G, 4G),
        (B, 256, 2G, 2G), (B, 256, G, G), in the neck's dtype."""
        s0, s1, lowest = (layer(vit_spatial) for layer in self.fpn_layers[:USED_LEVELS])
        return s0, s1, lowest

    def position(self, level: Tensor) -> Tensor:
        """The sine encoding (1, 256, H, W) of a level (B, 256, H, W), in its dtype (the
        video tracker's memory attention uses the lowest level's)."""
        pos: Tensor = self.position_encoding(level.shape, level.device, level.dtype)
        return pos


class TrackerHeads(nn.Module):
    """The sam2 neck (``neck``: Meta's ``sam2_convs``, transformers' FPN layer) and the
    tracker's SAM heads (``heads``: ``sam_prompt_encoder``, ``sam_mask_decoder``,
    ``no_mem_embed``) of one SAM 3 size."""

    def __init__(self, size: Sam3Size) -> None:
        super().__init__()
        self.size = size
        self.neck = TrackerNeck(size.vit_dim)
        self.heads = SAM2Image(tracker_config(size), with_image_encoder=False)

    @property
    def grid(self) -> int:
        return self.size.image_size // PATCH

    def neck_levels(self, vit_hidden: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The ViT's last hidden state (B, grid², C), as transformers' ``Sam3VisionModel``
        returns it (``last_hidden_state``), or (B, C, grid, grid) -> the three levels the
        tracker uses, (B, 256, 4g, 4g), (B, 256, 2g, 2g), (B, 256, g, g), in the neck's
        dtype (the ViT may compute in another)."""
        if vit_hidden.ndim == 3:
            b, _, c = vit_hidden.shape
            g = self.grid
            vit_hidden = vit_hidden.view(b, g, g, c).permute(0, 3, 1, 2)
        levels: tuple[Tensor, Tensor, Tensor] = self.neck(vit_hidden)
        return levels

    def embedding(
        self, levels: tuple[Tensor, Tensor, Tensor], sizes: tuple[tuple[int, int], ...]
    ) -> Embedding:
        """The interactive path's image side from :meth:`neck_levels`: Meta's ``predict_inst``
        features (``no_mem_embed`` added to the lowest level; ``conv_s0`` / ``conv_s1`` of
        the two high-resolution levels), for images of original ``sizes`` (h, w)."""
        s0, s1, lowest = levels
        decoder = self.heads.sam_mask_decoder
        image_embed = lowest + self.heads.no_mem_embed.reshape(1, -1, 1, 1)
        return Embedding(image_embed, (decoder.conv_s0(s0), decoder.conv_s1(s1)), sizes)


def build_tracker_heads(size: Sam3Size) -> TrackerHeads:
    """Untrained tracker heads of ``size`` in eval mode (weights: :func:`load_tracker_heads`)."""
    return TrackerHeads(size).eval()


def tracker_key(name: str) -> str:
    """A ``tracker.*`` key without the prefix -> ours (the tracker heads' under ``heads.``,
    the video tracker's as is): the two-way transformer's ``MLPBlock`` (``lin1``/``lin2``,
    ReLU) named as SAM 2's ``MLP`` (``layers.0``/``layers.1``, ReLU), the same math."""
    return _MLP_BLOCK.sub(lambda m: f".mlp.layers.{int(m[1]) - 1}.", name)


def neck_key(name: str) -> str:
    """A ``sam2_convs.*`` key without the prefix -> :class:`TrackerNeck`'s, by the detector
    neck's renames; a key they do not know is kept under ``unknown.`` (a strict load names it)."""
    renamed = rename(_DETECTOR_NECK + name)
    if not renamed.startswith(_DETECTOR_NECK_MODULE):
        return "unknown." + name
    return renamed.removeprefix(_DETECTOR_NECK_MODULE)


def neck_state(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Meta's checkpoint (keys optionally ``detector.``-prefixed) -> its tracker neck's
    tensors (``sam2_convs``) in :class:`TrackerNeck`'s keys."""
    return {
        neck_key(key.removeprefix(DETECTOR).removeprefix(SAM2_NECK)): tensor
        for key, tensor in state.items()
        if key.removeprefix(DETECTOR).startswith(SAM2_NECK)
    }


def split_tracker_state(state: dict[str, Tensor]) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Meta's checkpoint (``detector.`` / ``tracker.`` keys, or an image model's
    ``inst_interactive_predictor.model.`` keys) -> (the tracker heads' tensors in
    :class:`TrackerHeads`' keys, the video tracker's ``tracker.*`` tensors with the prefix
    dropped). Raises :class:`CheckpointMismatch` naming a ``tracker.*`` key that belongs to
    neither."""
    heads: dict[str, Tensor] = {}
    video: dict[str, Tensor] = {}
    unknown: list[str] = []
    for key, tensor in state.items():
        detector_key = key.removeprefix(DETECTOR)
        if detector_key.startswith(SAM2_NECK):
            heads["neck." + neck_key(detector_key.removeprefix(SAM2_NECK))] = tensor
            continue
        for prefix in (TRACKER, "inst_interactive_predictor.model."):
            if key.startswith(prefix):
                name = key.removeprefix(prefix)
                if name.startswith(HEAD_PREFIXES):
                    heads["heads." + tracker_key(name)] = tensor
                elif name.startswith(VIDEO_TRACKER_PREFIXES):
                    video[name] = tensor
                else:
                    unknown.append(key)
                break
    if unknown:
        raise CheckpointMismatch(
            f"not a SAM 3 checkpoint: {len(unknown)} unknown tracker key(s), e.g. {unknown[0]}"
        )
    return heads, video


def check_tracker_keys(heads_state: dict[str, Tensor], size: Sam3Size) -> None:
    """``heads_state`` (from :func:`split_tracker_state`) must give every tensor of
    ``size``'s tracker heads with its shape, and nothing else (checked on the meta device)."""
    with torch.device("meta"):
        expected = build_tracker_heads(size).state_dict()
    missing = sorted(set(expected) - set(heads_state))
    unexpected = sorted(set(heads_state) - set(expected))
    shapes = sorted(
        k for k in expected if k in heads_state and heads_state[k].shape != expected[k].shape
    )
    for label, names in (("missing", missing), ("unexpected", unexpected), ("shape", shapes)):
        if names:
            raise CheckpointMismatch(
                f"not a SAM 3 checkpoint: {len(names)} {label} tracker key(s), e.g. {names[0]}"
            )


def load_tracker_heads(heads: TrackerHeads, state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Load ``heads`` strictly from Meta's checkpoint ``state`` (:func:`split_tracker_state`);
    returns the video tracker's tensors (``tracker.*`` minus the prefix) for whoever builds
    the video tracker. Raises :class:`CheckpointMismatch` naming what does not match."""
    from sam2serve.concepts.checkpoint import load_strict

    heads_state, video = split_tracker_state(state)
    load_strict(heads, heads_state)
    return video
