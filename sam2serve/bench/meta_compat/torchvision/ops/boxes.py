"""``torchvision.ops.boxes`` stand-in, backed by :mod:`sam2serve.engine.nms`.

torchvision's semantics: greedy NMS in decreasing score order, a box is suppressed when
its IoU with a kept box is strictly greater than the threshold (so a NaN IoU, from two
empty boxes, never suppresses); ``batched_nms`` keeps categories apart.
"""

from sam2serve.engine.nms import batched_nms, box_area, box_iou, nms

__all__ = ["batched_nms", "box_area", "box_iou", "nms"]
