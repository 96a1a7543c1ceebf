"""SAM 3's video predictor from the concept model a surface loaded: its tracker and
tracker neck from the same source (the ``tracker.*`` and ``sam2_convs`` tensors of
``sam3.pt``, strictly; or the same seed's random weights)."""

from __future__ import annotations

import torch

from sam2serve.concepts.runtime import Concepts, randomize_
from sam2serve.concepts.tracker_heads import TrackerNeck, neck_state
from sam2serve.concepts.video_association import VideoThresholds
from sam2serve.concepts.video_predictor import Sam3VideoPredictor
from sam2serve.concepts.video_tracker import Sam3Tracker, tracker_state

TRACKER_SEED_OFFSET = 1  # the tracker's random weights: the concept seed + 1 (its own draw)


def load_tracker(concepts: Concepts) -> tuple[TrackerNeck, Sam3Tracker]:
    """The tracker neck and tracker matching ``concepts``' weights, on its device, eval."""
    spec = concepts.spec
    neck = TrackerNeck(concepts.size.vit_dim)
    tracker = Sam3Tracker(concepts.size.image_size)
    if spec.random_weights:
        randomize_(neck, spec.seed + TRACKER_SEED_OFFSET)
        randomize_(tracker, spec.seed + TRACKER_SEED_OFFSET)
    else:
        from sam2serve.concepts.checkpoint import load_strict
        from sam2serve.concepts.weights import CHECKPOINT, require

        loaded = torch.load(
            require(spec.weights) / CHECKPOINT, map_location="cpu", weights_only=True, mmap=True
        )
        state = loaded.get("model", loaded)
        load_strict(neck, neck_state(state))
        load_strict(tracker, tracker_state(state))
    device = concepts.device
    return neck.to(device).eval(), tracker.to(device).eval()


def video_predictor(
    concepts: Concepts, thresholds: VideoThresholds | None = None, bounded: bool = True
) -> Sam3VideoPredictor:
    """SAM 3's video predictor over ``concepts``' detector (its precision as loaded), the
    tracker and its neck in float32 (a surface's mode converts them:
    :func:`sam2serve.runtime.concepts.video_predictor_in_mode`)."""
    neck, tracker = load_tracker(concepts)
    return Sam3VideoPredictor(concepts.model, concepts.tokenize, neck, tracker, thresholds, bounded)


__all__ = ["TRACKER_SEED_OFFSET", "load_tracker", "video_predictor"]
