"""``torchvision.ops`` stand-in: the box operations of Meta's mask generator."""

from torchvision.ops.boxes import batched_nms, box_area, box_iou, nms

__all__ = ["batched_nms", "box_area", "box_iou", "nms"]
