"""torchvision.ops.boxes stand-in for Meta's code (the fidelity tests' oracle and the
benchmark's ``reference`` row).

Deliberately independent of sam2serve.engine.nms, so that the oracle does not share our
code: torchvision's own algorithm, written plainly. Greedy NMS in decreasing score order;
a box is dropped when its IoU with a kept box of the same category is strictly greater
than the threshold. The IoU is computed in the boxes' dtype and compared with the
threshold as a double, as the kernel's C++ ``float > double`` does (float32 IoU 1/3 is
0.33333334, above the double 1/3); a NaN IoU (two empty boxes) never suppresses.
Categories are kept apart with torchvision's coordinate-offset trick.
"""

import numpy as np
import torch


def box_area(boxes: torch.Tensor) -> torch.Tensor:
    return (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])


def box_iou(boxes1: torch.Tensor, boxes2: torch.Tensor) -> torch.Tensor:
    lt = torch.max(boxes1[:, None, :2], boxes2[None, :, :2])
    rb = torch.min(boxes1[:, None, 2:], boxes2[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(dim=2)
    return inter / (box_area(boxes1)[:, None] + box_area(boxes2)[None, :] - inter)


def nms(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    if boxes.shape[0] == 0:
        return torch.empty((0,), dtype=torch.int64, device=boxes.device)
    order = torch.sort(scores, descending=True, stable=True).indices
    ordered = boxes[order]
    # One comparison matrix, then the greedy pass over its rows on the host.
    suppresses = (box_iou(ordered, ordered).double() > float(iou_threshold)).cpu().numpy()
    removed = np.zeros(len(order), dtype=bool)
    keep = []
    for i in range(len(order)):
        if not removed[i]:
            keep.append(i)
            removed |= suppresses[i]
    return order[torch.as_tensor(keep, dtype=torch.int64, device=boxes.device)]


def batched_nms(
    boxes: torch.Tensor, scores: torch.Tensor, idxs: torch.Tensor, iou_threshold: float
) -> torch.Tensor:
    if boxes.numel() == 0:
        return torch.empty((0,), dtype=torch.int64, device=boxes.device)
    offsets = idxs.to(boxes) * (boxes.max() + 1)
    return nms(boxes + offsets[:, None], scores, iou_threshold)


__all__ = ["batched_nms", "box_area", "box_iou", "nms"]
