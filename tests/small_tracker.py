"""A small tracker for quick first-tier tests: SAM 2.1 tiny (its layers, its video
config) at a 256 x 256 input instead of 1024 (a 16 x 16 feature grid: memory attention
over 256 tokens per memory), seeded random weights, the object-score head biased so that
every object is present (the masks are real logits, not NO_OBJ_SCORE everywhere)."""

from __future__ import annotations

import dataclasses

import torch

from sam2serve.checkpoint import random_state_dict
from sam2serve.config import get_config
from sam2serve.modeling.sam2_video import SAM2Video

SMALL_IMAGE_SIZE = 256


def small_tiny_tracker(seed: int = 0) -> SAM2Video:
    cfg = dataclasses.replace(get_config("tiny"), image_size=SMALL_IMAGE_SIZE)
    model = SAM2Video(cfg)
    model.load_state_dict(random_state_dict(cfg, seed, video=True), strict=True)
    with torch.no_grad():
        model.sam_mask_decoder.pred_obj_score_head.layers[-1].bias.add_(20.0)
    return model.eval()
