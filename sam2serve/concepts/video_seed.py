"""Concept seeds for video tracking: SAM 3 on one frame picks the objects SAM 2.1 tracks.

This is *not* Meta's SAM 3 video model (which runs the detector on every frame beside its
own tracker and matches the two). Here SAM 3's detector runs once, on the frame the user
names; every instance it finds above the threshold becomes one object of a SAM 2.1
tracking session, its mask the object's prompt on that frame and its phrase the object's
name; the existing propagation then tracks them all. What SAM 3 would find on later
frames (new instances entering the scene) is not looked for.

Duplicates are dropped before they become objects: with several phrases ("cat",
"animal") or overlapping queries SAM 3 may find one thing twice, and tracking it twice
costs memory and shows two masks for one object. Greedily, highest score first, an
instance whose mask IoU with an already kept one is above ``dedupe_iou`` is dropped (the
mask analogue of AMG's box NMS, across phrases). Empty masks are dropped too: a tracker
prompted with nothing tracks nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from sam2serve.concepts.engine import DEFAULT_SCORE_THRESH, ExemplarBox, Instance

if TYPE_CHECKING:
    from sam2serve.concepts.runtime import Concepts

DEFAULT_DEDUPE_IOU = 0.7  # as the brief of issue 29 and AMG's box_nms_thresh default


@dataclass(frozen=True)
class Seed:
    """One object to track: the phrase that found it, its SAM 3 score and its mask on the
    seeded frame (bool (H, W), the frame's size)."""

    phrase: str
    score: float
    mask: np.ndarray
    box: tuple[float, float, float, float]  # xyxy, frame pixels (SAM 3's box)


def _extent(mask: np.ndarray) -> tuple[int, int, int, int] | None:
    """The mask's tight box as row and column slices' bounds (y0, y1, x0, x1), or None
    when it is empty."""
    rows = np.flatnonzero(mask.any(axis=1))
    if rows.size == 0:
        return None
    cols = np.flatnonzero(mask.any(axis=0))
    return int(rows[0]), int(rows[-1]) + 1, int(cols[0]), int(cols[-1]) + 1


def dedupe_by_mask_iou(
    masks: Sequence[np.ndarray],
    scores: Sequence[float],
    iou_thresh: float = DEFAULT_DEDUPE_IOU,
    limit: int | None = None,
) -> list[int]:
    """Indices of the masks (bool (H, W), one size) kept, highest score first (ties: input
    order): greedily, a mask is dropped when it is empty or its IoU with a kept mask is
    > ``iou_thresh``; at most ``limit`` are kept (the rest are not examined). Exact, and
    cheap where objects are apart: intersections are counted only inside the overlap of
    the two masks' tight boxes, and no mask is copied."""
    if len(masks) != len(scores):
        raise ValueError(f"{len(masks)} masks but {len(scores)} scores")
    if not 0.0 <= iou_thresh <= 1.0:
        raise ValueError(f"dedupe IoU must be in [0, 1]; got {iou_thresh}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0; got {limit}")
    order = sorted(range(len(scores)), key=lambda i: -float(scores[i]))  # stable
    kept: list[int] = []
    held: list[tuple[np.ndarray, tuple[int, int, int, int], int]] = []  # mask, extent, area
    for index in order:
        if limit is not None and len(kept) >= limit:
            break
        mask = np.asarray(masks[index], dtype=bool)
        extent = _extent(mask)
        if extent is None:
            continue
        area = int(np.count_nonzero(mask))
        if not any(_iou_above(mask, extent, area, other, iou_thresh) for other in held):
            kept.append(index)
            held.append((mask, extent, area))
    return kept


def _iou_above(
    mask: np.ndarray,
    extent: tuple[int, int, int, int],
    area: int,
    other: tuple[np.ndarray, tuple[int, int, int, int], int],
    iou_thresh: float,
) -> bool:
    other_mask, (oy0, oy1, ox0, ox1), other_area = other
    y0, y1, x0, x1 = (
        max(extent[0], oy0),
        min(extent[1], oy1),
        max(extent[2], ox0),
        min(extent[3], ox1),
    )
    if y0 >= y1 or x0 >= x1:
        return False
    inter = int(np.count_nonzero(mask[y0:y1, x0:x1] & other_mask[y0:y1, x0:x1]))
    return inter / (area + other_area - inter) > iou_thresh


def seeds_of(
    found: dict[str, list[Instance]],
    max_instances: int,
    dedupe_iou: float = DEFAULT_DEDUPE_IOU,
) -> list[Seed]:
    """The detector's instances (phrase -> instances) as at most ``max_instances`` seeds,
    duplicates across every phrase removed, highest score first."""
    candidates = [(phrase, inst) for phrase, insts in found.items() for inst in insts]
    keep = dedupe_by_mask_iou(
        [inst.mask for _, inst in candidates],
        [inst.score for _, inst in candidates],
        dedupe_iou,
        max_instances,
    )
    return [
        Seed(phrase, float(inst.score), inst.mask, inst.box)
        for phrase, inst in (candidates[i] for i in keep)
    ]


def concept_seeds(
    concepts: Concepts,
    frame: np.ndarray,
    phrases: Sequence[str],
    boxes: Sequence[ExemplarBox] = (),
    score_thresh: float = DEFAULT_SCORE_THRESH,
    max_instances: int = 20,
    dedupe_iou: float = DEFAULT_DEDUPE_IOU,
) -> list[Seed]:
    """The objects SAM 3 finds on one video frame (uint8 (H, W, 3)) for ``phrases`` and/or
    exemplar ``boxes`` (frame pixels): the instances above ``score_thresh`` (each phrase's
    ``max_instances`` best), duplicates dropped, highest score first, at most
    ``max_instances``. ``concepts`` is a loaded
    :class:`~sam2serve.concepts.runtime.Concepts`."""
    if max_instances < 1:
        raise ValueError(f"max_instances must be >= 1; got {max_instances}")
    (encoding,) = concepts.encode([frame])
    # Per phrase at most max_instances (the top scores, before any mask is upsampled): a
    # bound on memory; duplicates are then dropped across phrases.
    found = concepts.detect(encoding, phrases, boxes, score_thresh, max_instances=max_instances)
    return seeds_of(found, max_instances, dedupe_iou)


__all__ = [
    "DEFAULT_DEDUPE_IOU",
    "Seed",
    "concept_seeds",
    "dedupe_by_mask_iou",
    "seeds_of",
]
