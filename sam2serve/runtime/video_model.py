"""The video model that goes with an image model: the same size and the same weights.

A server that tracks video beside its image endpoints loads SAM 2's video model from
where its image model's weights came from (``weights_info``): the official checkpoint
file, or the same seeded random weights. An image model loaded from ``sam2serve export``
artifacts records that origin in its manifest, so its video model is loaded from the
checkpoint file the artifacts were exported from (which must then be on this machine).
"""

from __future__ import annotations

from pathlib import Path

import torch

from sam2serve.checkpoint import CheckpointError, WeightsInfo, load_video_model
from sam2serve.modeling.sam2_video import SAM2Video


def video_model_like(
    size: str, weights: WeightsInfo, device: str | torch.device = "cpu"
) -> SAM2Video:
    """SAM 2's video model of ``size`` with the weights ``weights`` describes."""
    if weights.is_random:
        return load_video_model(size, random_weights=True, seed=weights.seed or 0, device=device)
    if weights.path is None or not Path(weights.path).is_file():
        raise CheckpointError(
            f"the video model needs the checkpoint file the image model's weights came from "
            f"({weights.path!r}), and it is not on this machine: serve from that checkpoint "
            "(--checkpoint) to track video"
        )
    return load_video_model(size, weights.path, device=device)


__all__ = ["video_model_like"]
