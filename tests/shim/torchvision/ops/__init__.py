"""torchvision.ops stand-in (see boxes.py and roi_align.py)."""

import torch

from torchvision.ops.boxes import batched_nms, box_area, box_iou, nms
from torchvision.ops.roi_align import RoIAlign, roi_align

__all__ = ["RoIAlign", "batched_nms", "box_area", "box_iou", "masks_to_boxes", "nms", "roi_align"]


def masks_to_boxes(masks: torch.Tensor) -> torch.Tensor:
    """(N, H, W) masks -> (N, 4) xyxy of the nonzero pixels (torchvision's rule)."""
    boxes = torch.zeros((masks.shape[0], 4), device=masks.device, dtype=torch.float)
    for index, mask in enumerate(masks):
        y, x = torch.where(mask != 0)
        if len(x):
            boxes[index] = torch.stack([x.min(), y.min(), x.max(), y.max()]).float()
    return boxes
