"""``torchvision.ops.boxes`` stand-in for Meta's mask generator.

torchvision's semantics, exactly: greedy NMS in decreasing score order; a box is dropped
when its IoU with a kept box of the same category is strictly greater than the threshold.
The IoU is computed in the boxes' dtype (as torchvision's kernel does, with
:func:`sam2serve.engine.nms.box_iou`) and compared with the threshold as a double, as the
kernel's C++ comparison ``float > double`` does: with float32 IoUs and a threshold such as
0.3, whose float32 rounding is above it, the two comparisons differ on exact ties. A NaN
IoU (two empty boxes) never suppresses. Categories are kept apart by masking the IoU
matrix, which equals torchvision's coordinate-offset trick for the integer boxes AMG has.
"""

import numpy as np
import torch

from sam2serve.engine.nms import box_area, box_iou

__all__ = ["batched_nms", "box_area", "box_iou", "nms"]


def batched_nms(
    boxes: torch.Tensor, scores: torch.Tensor, idxs: torch.Tensor, iou_threshold: float
) -> torch.Tensor:
    if boxes.shape[0] == 0:
        return torch.empty((0,), dtype=torch.int64, device=boxes.device)
    order = torch.sort(scores, descending=True, stable=True).indices
    ordered = boxes[order]
    suppresses = box_iou(ordered, ordered).double() > float(iou_threshold)
    categories = idxs[order]
    suppresses &= categories[:, None] == categories[None, :]
    suppresses_np = suppresses.cpu().numpy()
    removed = np.zeros(len(order), dtype=bool)
    keep = []
    for i in range(len(order)):
        if removed[i]:
            continue
        keep.append(i)
        removed |= suppresses_np[i]
    return order[torch.as_tensor(keep, dtype=torch.int64, device=boxes.device)]


def nms(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    categories = torch.zeros(boxes.shape[0], dtype=torch.int64, device=boxes.device)
    return batched_nms(boxes, scores, categories, iou_threshold)
