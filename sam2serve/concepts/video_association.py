"""Matching SAM 3's detections with its tracks on a frame, and the hot-start bookkeeping
that ends tracks: Meta's rules (``Sam3VideoBase._associate_det_trk``,
``_process_hotstart``, ``_suppress_overlapping_based_on_recent_occlusion``), as plain
functions over explicit values.

Thresholds are those of Meta's ``build_sam3_video_model`` (:class:`VideoThresholds`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

HIGH_CONF = 0.8  # a detection this sure, with IoU >= HIGH_IOU, may recondition its track
HIGH_IOU = 0.8
NEVER_OCCLUDED = -1
ALWAYS_OCCLUDED = 100000  # an object removed by hot start: suppressed wherever it overlaps
NO_OBJ_LOGIT = -10.0


# Meta keeps detections above 0.5 and makes new objects from 0.7: a surface that moves the
# detection threshold keeps the new-object threshold this far above it.
NEW_OBJECT_MARGIN = 0.2


@dataclass(frozen=True)
class VideoThresholds:
    """Meta's video predictor settings (``build_sam3_video_model`` defaults)."""

    score: float = 0.5  # a detection is kept above this probability
    det_nms_iou: float = 0.1  # mask NMS among kept detections
    assoc_iou: float = 0.1  # a detection overlapping a track this much is not new
    trk_assoc_iou: float = 0.5  # a track is matched by a detection overlapping it this much
    new_det: float = 0.7  # a new object needs this probability
    hotstart_delay: int = 15  # outputs are held back this many frames
    hotstart_unmatch: int = 8  # a young track unmatched this often is removed
    hotstart_dup: int = 8  # a young track sharing a detection this often is removed
    init_keep_alive: int = 30
    max_keep_alive: int = 30
    min_keep_alive: int = -1
    occlusion_iou: float = 0.7  # overlapping tracks: the more recently occluded is hidden
    fill_hole_area: int = 16
    recondition_every: int = 16
    max_objects: int = 10000

    def __post_init__(self) -> None:
        if self.hotstart_delay > 0 and not (
            self.hotstart_unmatch <= self.hotstart_delay
            and self.hotstart_dup <= self.hotstart_delay
        ):
            raise ValueError("hot-start thresholds must not exceed the hot-start delay")

    @classmethod
    def from_detection(cls, score: float, max_objects: int) -> VideoThresholds:
        """Meta's settings with ``score`` as the detection threshold, the new-object one
        :data:`NEW_OBJECT_MARGIN` above it (Meta's 0.5 / 0.7), and ``max_objects`` tracked at
        once: what every surface's one threshold means."""
        return cls(
            score=score, new_det=min(1.0, score + NEW_OBJECT_MARGIN), max_objects=max_objects
        )


def mask_iou(a: Tensor, b: Tensor) -> Tensor:
    """(N, H, W) x (M, H, W) bool -> (N, M) IoU (an empty union counts as 1 pixel)."""
    # Meta broadcasts (N, 1, HW) & (1, M, HW): 26 GB for SAM 3's 200 queries at 288 x 288.
    # Counting the intersections with a matrix product is exact (integers below 2**24 in
    # float32) and holds two (N, HW) matrices only.
    flat_a = a.reshape(a.shape[0], -1).float()
    flat_b = b.reshape(b.shape[0], -1).float()
    inter = flat_a @ flat_b.T
    union = flat_a.sum(dim=1)[:, None] + flat_b.sum(dim=1)[None, :] - inter
    return inter / union.clamp(min=1)


def nms_keep(probs: Tensor, masks: Tensor, prob_thresh: float, iou_thresh: float) -> Tensor:
    """(N,) bool: detections above ``prob_thresh`` surviving greedy mask NMS (highest
    probability first; one suppresses another whose IoU with it exceeds ``iou_thresh``)."""
    valid = probs > prob_thresh
    if not bool(valid.any()):
        return valid
    ious = mask_iou(masks[valid] > 0, masks[valid] > 0).numpy()
    scores = probs[valid].float().numpy()
    order = scores.argsort()[::-1]
    kept: list[int] = []
    while order.size > 0:
        i = int(order[0])
        kept.append(i)
        order = order[1:][ious[i, order[1:]] <= iou_thresh]
    valid_index = torch.where(valid, valid.cumsum(0) - 1, -1)
    return torch.isin(valid_index, torch.tensor(kept, dtype=torch.int64))


@dataclass(frozen=True)
class Association:
    new_dets: np.ndarray  # indices of detections that become new objects
    unmatched: np.ndarray  # ids of non-empty tracks no detection matched
    empty: np.ndarray  # ids of tracks with an empty mask
    det_to_tracks: dict[int, np.ndarray]  # detection -> ids of the tracks it overlaps
    recondition: dict[int, int]  # track id -> the sure detection that may recondition it


def associate(
    det_masks: Tensor,
    det_scores: np.ndarray,
    trk_masks: Tensor,
    trk_ids: np.ndarray,
    th: VideoThresholds,
) -> Association:
    """Meta's rule on mask logits (N, H, W) and (M, H', W') compared at the smaller size."""
    none = np.array([], np.int64)
    if trk_masks.shape[0] == 0:
        return Association(np.arange(det_masks.shape[0]), none, none, {}, {})
    if det_masks.shape[0] == 0:
        nonempty = (trk_masks > 0).any(dim=(1, 2)).numpy()
        return Association(none, trk_ids[nonempty], trk_ids[~nonempty], {}, {})
    if det_masks.shape[-2:] != trk_masks.shape[-2:]:
        if np.prod(det_masks.shape[-2:]) < np.prod(trk_masks.shape[-2:]):
            trk_masks = _resize(trk_masks, det_masks.shape[-2:])
        else:
            det_masks = _resize(det_masks, trk_masks.shape[-2:])
    ious = mask_iou(det_masks > 0, trk_masks > 0).numpy()
    matched = (ious >= th.trk_assoc_iou).any(axis=0)
    nonempty = (trk_masks > 0).any(dim=(1, 2)).numpy()
    unmatched = trk_ids[nonempty & ~matched]
    empty = trk_ids[~nonempty]
    is_new = (det_scores >= th.new_det) & ~np.any(ious >= th.assoc_iou, axis=1)
    best = np.argmax(ious, axis=1)
    sure = set(np.nonzero((det_scores >= HIGH_CONF) & ~is_new & (ious.max(axis=1) >= HIGH_IOU))[0])
    det_to_tracks: dict[int, np.ndarray] = {}
    recondition: dict[int, int] = {}
    for d in range(det_masks.shape[0]):
        det_to_tracks[d] = trk_ids[ious[d] >= th.assoc_iou]
        if d in sure:
            recondition[int(trk_ids[best[d]])] = d
    return Association(np.nonzero(is_new)[0], unmatched, empty, det_to_tracks, recondition)


def _resize(masks: Tensor, size: tuple[int, ...]) -> Tensor:
    return F.interpolate(
        masks.unsqueeze(1), size=tuple(size), mode="bilinear", align_corners=False
    ).squeeze(1)


@dataclass
class HotStart:
    """What hot start remembers of every object (Meta's ``rank0_metadata``)."""

    first_frame: dict[int, int] = field(default_factory=dict)
    unmatched_frames: dict[int, list[int]] = field(default_factory=dict)
    keep_alive: dict[int, int] = field(default_factory=dict)
    overlap_frames: dict[tuple[int, int], list[int]] = field(default_factory=dict)
    removed: set[int] = field(default_factory=set)

    def update(
        self,
        frame: int,
        reverse: bool,
        assoc: Association,
        new_ids: np.ndarray,
        th: VideoThresholds,
    ) -> set[int]:
        """Record ``frame``'s matches; the ids removed on it (young tracks unmatched or
        duplicated too often)."""
        removed_now: set[int] = set()
        horizon = frame + th.hotstart_delay if reverse else frame - th.hotstart_delay
        for obj in new_ids.tolist():
            self.first_frame.setdefault(obj, frame)
            self.keep_alive[obj] = th.init_keep_alive
        matched: set[int] = set()
        for tracks in assoc.det_to_tracks.values():
            matched.update(tracks.tolist())
        for obj in matched:
            self.keep_alive[obj] = min(th.max_keep_alive, self.keep_alive.get(obj, 0) + 1)
        for obj in assoc.unmatched.tolist():
            self.unmatched_frames.setdefault(obj, []).append(frame)
            self.keep_alive[obj] = max(th.min_keep_alive, self.keep_alive.get(obj, 0) - 1)

        def young(obj: int) -> bool:
            first = self.first_frame[obj]
            return first < horizon if reverse else first > horizon

        for obj, frames in self.unmatched_frames.items():
            if obj in self.removed or obj in removed_now:
                continue
            if len(frames) >= th.hotstart_unmatch and young(obj):
                removed_now.add(obj)
        for tracks in assoc.det_to_tracks.values():
            if len(tracks) < 2:
                continue
            ids = tracks.tolist()
            pick = max if reverse else min
            first = pick(ids, key=lambda o: self.first_frame[o])
            for obj in ids:
                if obj != first:
                    self.overlap_frames.setdefault((first, obj), []).append(frame)
        for (_, obj), frames in self.overlap_frames.items():
            if obj in self.removed or obj in removed_now:
                continue
            if young(obj) and len(frames) >= th.hotstart_dup:
                removed_now.add(obj)
        self.removed.update(removed_now)
        return removed_now


def occlusion_suppressed(
    binary: Tensor, last_occluded: Tensor, reverse: bool, iou_thresh: float
) -> Tensor:
    """(N,) bool: of each pair of tracks whose masks (N, H, W) overlap with IoU >=
    ``iou_thresh``, the one occluded more recently (``last_occluded`` frame, -1 never),
    provided the other was occluded at some point."""
    n = binary.shape[0]
    if n <= 1:
        return torch.zeros(n, dtype=torch.bool)
    pairs = torch.triu(mask_iou(binary, binary) >= iou_thresh, diagonal=1)
    li, lj = last_occluded.unsqueeze(1), last_occluded.unsqueeze(0)
    later = torch.gt if not reverse else torch.lt
    suppress_i = pairs & later(li, lj) & (lj > NEVER_OCCLUDED)
    suppress_j = pairs & later(lj, li) & (li > NEVER_OCCLUDED)
    return suppress_i.any(dim=1) | suppress_j.any(dim=0)


__all__ = [
    "NEW_OBJECT_MARGIN",
    "Association",
    "HotStart",
    "VideoThresholds",
    "associate",
    "mask_iou",
    "nms_keep",
    "occlusion_suppressed",
]
