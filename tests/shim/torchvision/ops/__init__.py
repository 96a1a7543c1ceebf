"""torchvision.ops stand-in (see boxes.py)."""

from torchvision.ops.boxes import batched_nms, box_area, box_iou, nms

__all__ = ["batched_nms", "box_area", "box_iou", "nms"]
