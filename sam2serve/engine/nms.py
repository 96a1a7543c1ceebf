"""Box non-maximum suppression in torch, with torchvision's semantics.

torchvision is not a dependency of sam2serve (its wheels are tied to exact torch builds),
so the two box operations AMG needs live here:

- `nms` keeps boxes greedily in order of decreasing score and drops every later box whose
  IoU with a kept box is strictly greater than the threshold (as torchvision's kernel does);
- `batched_nms` does the same independently per category.

The IoU matrix is computed once on the boxes' device; the greedy pass then runs on the
host over the thresholded matrix after a single transfer, instead of a host sync per box.
That is O(N^2) memory, fine for the few thousand boxes AMG produces per crop.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["batched_nms", "box_area", "box_iou", "nms"]


def _upcast(t: torch.Tensor) -> torch.Tensor:
    """Widen dtypes whose products could overflow (int8/int16/uint8, float16/bfloat16)."""
    if t.is_floating_point():
        return t if t.dtype in (torch.float32, torch.float64) else t.float()
    return t if t.dtype in (torch.int32, torch.int64) else t.long()


def box_area(boxes: torch.Tensor) -> torch.Tensor:
    """Areas of XYXY boxes of shape (N, 4); integer boxes give integer areas."""
    boxes = _upcast(boxes)
    return (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])


def box_iou(boxes1: torch.Tensor, boxes2: torch.Tensor) -> torch.Tensor:
    """Pairwise IoU (N, M) of XYXY boxes (N, 4) and (M, 4), as a floating tensor."""
    boxes1 = _upcast(boxes1)
    boxes2 = _upcast(boxes2)
    area1 = box_area(boxes1)
    area2 = box_area(boxes2)
    top_left = torch.maximum(boxes1[:, None, :2], boxes2[None, :, :2])
    bottom_right = torch.minimum(boxes1[:, None, 2:], boxes2[None, :, 2:])
    wh = (bottom_right - top_left).clamp(min=0)
    inter = wh[..., 0] * wh[..., 1]
    union = area1[:, None] + area2[None, :] - inter
    # Integer boxes divide as float, like torchvision (true division).
    return inter / union


def _check_inputs(boxes: torch.Tensor, scores: torch.Tensor) -> None:
    if boxes.ndim != 2 or boxes.shape[-1] != 4:
        raise ValueError(f"boxes must have shape (N, 4), got {tuple(boxes.shape)}")
    if scores.shape != boxes.shape[:1]:
        raise ValueError(
            f"scores must have shape ({boxes.shape[0]},) to match boxes, got {tuple(scores.shape)}"
        )


def _greedy_keep(suppresses: np.ndarray) -> list[int]:
    """Greedy pass over boxes already sorted by decreasing score.

    `suppresses[i, j]` says box i would suppress box j. A box survives if no earlier
    surviving box suppresses it. Rows of removed boxes are never read.
    """
    removed = np.zeros(suppresses.shape[0], dtype=bool)
    keep: list[int] = []
    for i in range(suppresses.shape[0]):
        if removed[i]:
            continue
        keep.append(i)
        removed |= suppresses[i]
    return keep


def _nms_with_groups(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    idxs: torch.Tensor | None,
    iou_threshold: float,
) -> torch.Tensor:
    _check_inputs(boxes, scores)
    if boxes.shape[0] == 0:
        return torch.empty((0,), dtype=torch.int64, device=boxes.device)
    # A stable sort makes ties deterministic: equal scores keep their input order.
    order = torch.sort(scores, descending=True, stable=True).indices
    sorted_boxes = boxes[order]
    suppresses = box_iou(sorted_boxes, sorted_boxes) > iou_threshold
    if idxs is not None:
        # Only boxes of the same category compete. torchvision gets this by offsetting
        # each category's coordinates far apart; masking the IoU matrix is equivalent
        # and exact (large offsets cost float precision in the IoU).
        sorted_idxs = idxs[order]
        suppresses &= sorted_idxs[:, None] == sorted_idxs[None, :]
    keep_sorted = _greedy_keep(suppresses.cpu().numpy())  # the one host transfer
    keep_positions = torch.as_tensor(keep_sorted, dtype=torch.int64, device=boxes.device)
    return order[keep_positions]


def nms(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """Indices (int64) of the XYXY boxes kept by greedy NMS, by decreasing score.

    A box is dropped when its IoU with a higher-scoring kept box is > `iou_threshold`.
    """
    return _nms_with_groups(boxes, scores, None, iou_threshold)


def batched_nms(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    idxs: torch.Tensor,
    iou_threshold: float,
) -> torch.Tensor:
    """NMS run independently per category `idxs`; kept indices sorted by decreasing score."""
    if idxs.shape != boxes.shape[:1]:
        raise ValueError(
            f"idxs must have shape ({boxes.shape[0]},) to match boxes, got {tuple(idxs.shape)}"
        )
    return _nms_with_groups(boxes, scores, idxs, iou_threshold)
