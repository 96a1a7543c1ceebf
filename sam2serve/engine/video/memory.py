"""Which of an object's past outputs its memory bank holds on a frame (Meta's
SAM2Base._prepare_memory_conditioned_features, the selection half).

The bank is: every prompted ("conditioning") frame's memory, then the memories of the
``num_maskmem - 1`` frames just before the current one in the tracking direction (oldest
first), then object pointers: the prompted frames' that are not in the future, and the
pointers of up to ``max_obj_ptrs_in_encoder - 1`` preceding frames (nearest first). The
order matters only in the last bits (softmax sums), and is kept as Meta's.

The selection is a list of frame indices; objects with the same selection on a frame are
run as one batch (typically all objects prompted on the same frames).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sam2serve.config import VideoConfig
from sam2serve.engine.video.state import FrameOutput, ObjectTrack
from sam2serve.modeling.sam2_video import ObjectPointers, SpatialMemory


@dataclass(frozen=True)
class MemorySelection:
    """One object's bank on one frame, as frame indices."""

    spatial: tuple[tuple[int, int, bool], ...]  # (tpos_index, frame_idx, from cond outputs)
    pointers: tuple[tuple[int, int, bool], ...]  # (signed distance, frame_idx, cond)
    max_distance: int


def _closest_cond_frames(
    frame_idx: int, cond: dict[int, FrameOutput], max_frames: int
) -> tuple[list[int], list[int]]:
    """(selected, unselected) prompted frames: all of them unless limited (SAM 2.1: -1)."""
    if max_frames == -1 or len(cond) <= max_frames:
        return list(cond), []
    selected: list[int] = []
    before = max((t for t in cond if t < frame_idx), default=None)
    after = min((t for t in cond if t >= frame_idx), default=None)
    selected += [t for t in (before, after) if t is not None]
    rest = sorted((t for t in cond if t not in selected), key=lambda t: abs(t - frame_idx))
    selected += rest[: max_frames - len(selected)]
    return selected, [t for t in cond if t not in selected]


def select_memories(
    track: ObjectTrack, frame_idx: int, reverse: bool, num_frames: int, cfg: VideoConfig
) -> MemorySelection:
    selected, unselected = _closest_cond_frames(
        frame_idx, track.cond_outputs, cfg.max_cond_frames_in_attn
    )
    unselected_set = set(unselected)

    def lookup(t: int) -> tuple[int, bool] | None:
        if t in track.non_cond_outputs:
            return t, False
        if t in unselected_set:
            return t, True
        return None

    spatial = [(cfg.num_maskmem - 1, t, True) for t in selected]
    stride = cfg.memory_temporal_stride_for_eval
    for t_pos in range(1, cfg.num_maskmem):
        t_rel = cfg.num_maskmem - t_pos  # frames before the current one
        if t_rel == 1:
            prev = frame_idx + 1 if reverse else frame_idx - 1
        elif not reverse:
            prev = ((frame_idx - 2) // stride) * stride - (t_rel - 2) * stride
        else:
            prev = -(-(frame_idx + 2) // stride) * stride + (t_rel - 2) * stride
        found = lookup(prev)
        if found is not None:
            spatial.append((t_rel - 1, *found))

    max_ptrs = min(num_frames, cfg.max_obj_ptrs_in_encoder)
    sign = -1 if reverse else 1
    if cfg.only_obj_ptrs_in_the_past_for_eval:
        ptr_cond = [t for t in selected if (t >= frame_idx if reverse else t <= frame_idx)]
    else:
        ptr_cond = selected
    pointers = []
    for t in ptr_cond:
        distance = (frame_idx - t) * sign
        pointers.append(
            (distance if cfg.use_signed_tpos_enc_to_obj_ptrs else abs(distance), t, True)
        )
    for t_diff in range(1, max_ptrs):
        t = frame_idx + t_diff if reverse else frame_idx - t_diff
        if t < 0 or t >= num_frames:
            break
        found = lookup(t)
        if found is not None:
            pointers.append((t_diff, *found))
    return MemorySelection(tuple(spatial), tuple(pointers), max_ptrs - 1)


def gather_memories(
    tracks: list[ObjectTrack], selection: MemorySelection, device: torch.device
) -> tuple[list[SpatialMemory], ObjectPointers | None]:
    """The selected outputs of B objects sharing ``selection``, batched for the model."""

    def output(track: ObjectTrack, t: int, cond: bool) -> FrameOutput:
        return (track.cond_outputs if cond else track.non_cond_outputs)[t]

    memories = []
    for tpos_index, t, cond in selection.spatial:
        features = []
        for track in tracks:
            stored = output(track, t, cond).maskmem_features
            assert stored is not None, "memories are encoded before they are selected"
            features.append(stored.to(device))
        memories.append(SpatialMemory(torch.cat(features), tpos_index))
    if not selection.pointers:
        return memories, None
    ptrs = torch.stack(
        [
            torch.cat([output(track, t, cond).obj_ptr.to(device) for track in tracks])
            for _, t, cond in selection.pointers
        ]
    )
    distances = [distance for distance, _, _ in selection.pointers]
    return memories, ObjectPointers(ptrs, distances, selection.max_distance)
