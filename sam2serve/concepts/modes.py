"""Concept-model modes, named as SAM 2's (:mod:`sam2serve.runtime.modes`): what changes is
the vision backbone (the ViT: most of an image's FLOPs), the rest stays fp32.

- ``baseline``: the model as loaded, fp32 everywhere.
- ``int8``: the backbone's Linear layers (attention projections, MLP) quantised to int8
  after training by dynamic quantisation (``torch.ao.quantization.quantize_dynamic``:
  weights int8 per tensor, activations quantised per call from their observed range, no
  calibration set), run by torch's x86 int8 kernels (VNNI where the CPU has it). CPU only.
- ``furious``: the backbone's weights and activations in bf16 (its input cast to bf16, its
  output back to fp32, so the neck, text encoder and detector stay fp32). Unlike SAM 2's
  furious, which falls back to fp32 on CPUs without native bf16, this one is always bf16 so
  it can be built and checked anywhere; the bench does not time it where bf16 is emulated.

:func:`apply_mode` returns a new :class:`~sam2serve.concepts.runtime.Concepts` whose model
shares every tensor with the input's except the backbone's (a copy of ~half the model),
so the input keeps answering as before and the two can be compared on identical weights.
:func:`agreement` is that comparison.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from sam2serve.concepts.engine import Instance
from sam2serve.concepts.runtime import Concepts

__all__ = ["CONCEPT_MODES", "Agreement", "agreement", "apply_mode", "mask_iou"]

BASELINE, INT8, FURIOUS = "baseline", "int8", "furious"
CONCEPT_MODES = {
    BASELINE: "fp32 everywhere (the model as loaded)",
    INT8: "the ViT backbone's Linear layers dynamically quantised to int8 (CPU)",
    FURIOUS: "the ViT backbone in bf16 (input cast to bf16, output back to fp32)",
}
BACKBONE = "vision_encoder.backbone"


def _backbone_copy(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with its own copy of the backbone; every other tensor shared."""
    prefix = BACKBONE + "."
    shared = {
        id(tensor): tensor
        for name, tensor in (*model.named_parameters(), *model.named_buffers())
        if not name.startswith(prefix)
    }
    return copy.deepcopy(model, shared)


def _to_float32(module, args, output):
    return type(output)(
        **{
            key: value.float() if torch.is_tensor(value) and value.is_floating_point() else value
            for key, value in output.items()
        }
    )


def _cast_input(dtype: torch.dtype):
    def hook(module, args, kwargs):
        args = tuple(a.to(dtype) if torch.is_tensor(a) else a for a in args)
        kwargs = {k: v.to(dtype) if torch.is_tensor(v) else v for k, v in kwargs.items()}
        return args, kwargs

    return hook


def apply_mode(concepts: Concepts, mode: str) -> Concepts:
    """``concepts`` in ``mode`` (a ValueError names an unknown mode, or int8 off the CPU)."""
    if mode not in CONCEPT_MODES:
        raise ValueError(
            f"unknown concepts mode {mode!r}; expected one of {', '.join(CONCEPT_MODES)}"
        )
    if mode == BASELINE:
        return concepts
    if mode == INT8 and concepts.device.type != "cpu":
        raise ValueError(
            f"concepts mode int8 runs on the CPU only; the model is on {concepts.device}"
        )
    model = _backbone_copy(concepts.model)
    backbone = model.get_submodule(BACKBONE)
    if mode == INT8:
        from torch.ao.quantization import quantize_dynamic

        quantize_dynamic(backbone, {torch.nn.Linear}, dtype=torch.qint8, inplace=True)
    else:
        backbone.to(torch.bfloat16)
        backbone.register_forward_pre_hook(_cast_input(torch.bfloat16), with_kwargs=True)
        backbone.register_forward_hook(_to_float32)
    return replace(concepts, model=model)


def mask_iou(a: np.ndarray, b: np.ndarray) -> float:
    """IoU of two bool masks; two empty masks agree (1.0)."""
    union = np.logical_or(a, b).sum()
    return 1.0 if union == 0 else float(np.logical_and(a, b).sum() / union)


@dataclass(frozen=True)
class Agreement:
    miou: float  # mean IoU of the compared instances' masks
    max_score_diff: float  # largest |score - reference score| among them
    compared: int  # instances compared


def agreement(reference: Sequence[Instance], other: Sequence[Instance], top_k: int) -> Agreement:
    """``other`` against ``reference``, instances matched by query index: both lists must
    hold every query in query order (score threshold 0). The ``top_k`` queries with the
    highest reference scores are compared: mIoU of their masks, largest score difference."""
    if len(reference) != len(other):
        raise ValueError(
            f"instances are matched by query index, so both runs must keep every query "
            f"(score threshold 0); got {len(reference)} and {len(other)}"
        )
    if top_k < 1:
        raise ValueError(f"top_k must be at least 1; got {top_k}")
    order = sorted(range(len(reference)), key=lambda i: -reference[i].score)[:top_k]
    if not order:
        return Agreement(1.0, 0.0, 0)
    ious = [mask_iou(reference[i].mask, other[i].mask) for i in order]
    diffs = [abs(reference[i].score - other[i].score) for i in order]
    return Agreement(float(np.mean(ious)), float(max(diffs)), len(order))
