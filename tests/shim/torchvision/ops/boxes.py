"""torchvision.ops.boxes stand-in for Meta's code in the fidelity tests.

Deliberately independent of sam2serve.engine.nms so that the oracle does not share our
code: torchvision's own algorithm (coordinate-offset trick for categories, then greedy
NMS in decreasing score order), written as plainly as possible.
"""

import torch


def box_area(boxes: torch.Tensor) -> torch.Tensor:
    return (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])


def box_iou(boxes1: torch.Tensor, boxes2: torch.Tensor) -> torch.Tensor:
    lt = torch.max(boxes1[:, None, :2], boxes2[None, :, :2])
    rb = torch.min(boxes1[:, None, 2:], boxes2[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(dim=2)
    return inter / (box_area(boxes1)[:, None] + box_area(boxes2)[None, :] - inter)


def nms(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    order = torch.argsort(scores, descending=True).tolist()
    iou = box_iou(boxes, boxes).tolist()
    keep: list[int] = []
    for i in order:
        # torchvision suppresses on IoU > threshold, so a NaN IoU (0/0) never suppresses.
        if not any(iou[i][k] > iou_threshold for k in keep):
            keep.append(i)
    return torch.tensor(keep, dtype=torch.int64)


def batched_nms(
    boxes: torch.Tensor, scores: torch.Tensor, idxs: torch.Tensor, iou_threshold: float
) -> torch.Tensor:
    if boxes.numel() == 0:
        return torch.empty((0,), dtype=torch.int64)
    offsets = idxs.to(boxes) * (boxes.max() + 1)
    return nms(boxes + offsets[:, None], scores, iou_threshold)


__all__ = ["batched_nms", "box_area", "box_iou", "nms"]
