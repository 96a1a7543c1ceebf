"""torchvision.ops stand-in for the fidelity tests (see boxes.py)."""

from torchvision.ops.boxes import batched_nms, box_area, box_iou, nms

__all__ = ["batched_nms", "box_area", "box_iou", "nms"]
