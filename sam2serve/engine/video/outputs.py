"""A frame's masks as records: per object its mask as RLE, its area and its COCO bbox.

What every surface that hands tracking results on writes (``sam2serve track``'s per-frame
JSON, the streamed frames of the video sessions API), so they agree to the pixel.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from sam2serve.engine.coco import coco_bbox
from sam2serve.engine.rle import Rle, area_from_rle, masks_to_rle
from sam2serve.engine.video.predictor import FrameMasks


@dataclass(frozen=True)
class ObjectMask:
    """One object's mask on one frame."""

    obj_id: int
    rle: Rle  # the engine's RLE (engine.rle); engine.formats turns it into a wire format
    area: int
    bbox: list[float]  # [x, y, width, height], COCO's


def object_masks(frame: FrameMasks) -> list[ObjectMask]:
    """The objects of ``frame`` in obj_id order, their masks run-length encoded in one
    batch (one host sync)."""
    return masks_of(frame.obj_ids, frame.masks)


def masks_of(obj_ids: Sequence[int], masks: torch.Tensor) -> list[ObjectMask]:
    """Objects ``obj_ids`` with their (N, H, W) bool ``masks``, in obj_id order, run-length
    encoded in one batch (one host sync)."""
    rles = masks_to_rle(masks)
    records = [
        ObjectMask(int(obj_id), rle, area_from_rle(rle), coco_bbox(rle))
        for obj_id, rle in zip(obj_ids, rles, strict=True)
    ]
    return sorted(records, key=lambda record: record.obj_id)


__all__ = ["ObjectMask", "masks_of", "object_masks"]
