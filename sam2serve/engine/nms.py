"""Box non-maximum suppression in torch, with torchvision's semantics.

torchvision is not a dependency of sam2serve (its wheels are tied to exact torch builds),
so the two box operations AMG needs live here:

- `nms` keeps boxes greedily in order of decreasing score and drops every later box whose
  IoU with a kept box is strictly greater than the threshold (as torchvision's kernel does);
- `batched_nms` does the same independently per category.

The IoU matrix is computed once on the boxes' device. The greedy pass then runs where it
is cheapest: on the CPU a Python loop over the thresholded matrix (one row OR per kept
box); on a GPU, on the device, as a fixed-point iteration (below) with a few host syncs
instead of one per box or a copy of the matrix. Both are exact. O(N^2) memory, fine for
the few thousand boxes AMG produces per crop.

The device pass. Sorted by score, box j survives greedy NMS iff no *surviving* earlier
box suppresses it: ``keep_j = not any(keep_i and S_ij for i < j)``. That recurrence has
exactly one solution (keep_0 is fixed, and each keep_j follows from the earlier ones), and
iterating ``keep <- F(keep)`` from all-true fixes at least one more leading entry per step,
so it reaches that solution in at most N steps, and in practice in a handful (the length
of the longest chain of suppressions). Each step is one (N,) x (N, N) product; we check
for the fixed point every few steps (the only syncs) and fall back to the host loop in the
rare case it has not converged after many.
"""

from __future__ import annotations

import numpy as np
import torch

from sam2serve.engine.image import to_device

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


def _above(iou: torch.Tensor, threshold: float) -> torch.Tensor:
    """``iou > threshold`` with the threshold as a double, as torchvision's kernel compares
    (``float > double``). torch would round the threshold to the IoU's dtype first: for a
    threshold whose float32 rounding lies above it (0.3, 1/3), an IoU equal to that
    rounding would then not count as above. In the IoU's own dtype, ``x > threshold`` is
    ``x >= t`` when the rounding ``t`` is above the threshold and ``x > t`` otherwise."""
    if iou.dtype == torch.float64:
        return iou > threshold
    rounded = torch.tensor(threshold, dtype=iou.dtype).item()
    return iou >= rounded if rounded > threshold else iou > rounded


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


# Device pass: steps between fixed-point checks, and checks before the host fallback.
_STEPS_PER_CHECK = 4
_MAX_CHECKS = 64


def _greedy_keep_on_device(suppresses: torch.Tensor) -> torch.Tensor:
    """The greedy survivors (bool (N,)) of boxes sorted by score, computed on the device
    by the fixed-point iteration of the module docstring."""
    n = suppresses.shape[0]
    # Only earlier boxes suppress later ones: the strict upper triangle.
    earlier = torch.triu(suppresses, diagonal=1).to(torch.float32)
    keep = torch.ones(n, dtype=torch.bool, device=suppresses.device)
    for _ in range(_MAX_CHECKS):
        previous = keep
        for _ in range(_STEPS_PER_CHECK):
            # Counts of surviving earlier suppressors are exact in float32 (< 2**24).
            keep = (keep.to(torch.float32) @ earlier) == 0
        if torch.equal(keep, previous):
            return keep
    positions = _greedy_keep(suppresses.cpu().numpy())  # a very long suppression chain
    kept = np.zeros(n, dtype=bool)
    kept[positions] = True
    return to_device(kept, suppresses.device)


def _nms_with_groups(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    idxs: torch.Tensor | None,
    iou_threshold: float,
    on_device: bool | None = None,
) -> torch.Tensor:
    """``on_device``: run the greedy pass on the boxes' device (default: on GPUs only)."""
    _check_inputs(boxes, scores)
    if boxes.shape[0] == 0:
        return torch.empty((0,), dtype=torch.int64, device=boxes.device)
    # A stable sort makes ties deterministic: equal scores keep their input order.
    order = torch.sort(scores, descending=True, stable=True).indices
    sorted_boxes = boxes[order]
    suppresses = _above(box_iou(sorted_boxes, sorted_boxes), iou_threshold)
    if idxs is not None:
        # Only boxes of the same category compete. torchvision gets this by offsetting
        # each category's coordinates far apart; masking the IoU matrix is equivalent
        # and exact (large offsets cost float precision in the IoU).
        sorted_idxs = idxs[order]
        suppresses &= sorted_idxs[:, None] == sorted_idxs[None, :]
    if on_device is None:
        on_device = boxes.device.type != "cpu"
    if on_device:
        return order[_greedy_keep_on_device(suppresses).nonzero()[:, 0]]
    keep_sorted = _greedy_keep(suppresses.cpu().numpy())  # the one host transfer
    return order[to_device(np.asarray(keep_sorted, dtype=np.int64), boxes.device)]


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
