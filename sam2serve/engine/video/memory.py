"""Which of an object's past outputs its memory bank holds on a frame (Meta's
SAM2Base._prepare_memory_conditioned_features, the selection half).

The bank is: every prompted ("conditioning") frame's memory, then the memories of the
``num_maskmem - 1`` frames just before the current one in the tracking direction (oldest
first), then object pointers: the prompted frames' that are not in the future, and the
pointers of up to ``max_obj_ptrs_in_encoder - 1`` preceding frames (nearest first). The
order matters only in the last bits (softmax sums), and is kept as Meta's.

The selection is a list of frame indices. All objects of a frame run as one batch where
the model takes banks that differ per object (SAM2Video): objects whose banks have the
same shape (:func:`bank_shape`) share one memory-attention call, each reading its own
frames, and every object goes through the heads and the memory encoder together;
otherwise objects with the same selection are batched (the ONNX Runtime tracker).
"""

from __future__ import annotations

from collections.abc import Sequence
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


def bank_shape(selection: MemorySelection) -> tuple[int, int]:
    """(memory slots, pointer slots): objects whose banks have the same shape run as one
    batch, each reading its own frames (:func:`gather_memories`)."""
    return len(selection.spatial), len(selection.pointers)


def gather_memories(
    tracks: list[ObjectTrack],
    selection: MemorySelection | Sequence[MemorySelection],
    device: torch.device,
) -> tuple[list[SpatialMemory], ObjectPointers | None]:
    """The selected outputs of B objects, batched for the model: one ``selection`` for all
    of them, or one per object, all of one :func:`bank_shape` (slot i of each object's
    bank becomes row b of slot i; where the objects' slots differ in temporal position or
    pointer distance, the slot carries one per object)."""
    selections = (
        [selection] * len(tracks) if isinstance(selection, MemorySelection) else list(selection)
    )
    if len(selections) != len(tracks):
        raise ValueError(f"{len(selections)} memory selections for {len(tracks)} objects")
    if len({bank_shape(s) for s in selections}) != 1:
        raise ValueError("objects batched together need memory banks of one shape")
    if len({s.max_distance for s in selections}) != 1:
        raise ValueError("objects batched together need one pointer horizon")

    def output(track: ObjectTrack, t: int, cond: bool) -> FrameOutput:
        return (track.cond_outputs if cond else track.non_cond_outputs)[t]

    def shared(values: list[int]) -> int | tuple[int, ...]:
        return values[0] if len(set(values)) == 1 else tuple(values)

    memories = []
    for slot in range(len(selections[0].spatial)):
        features, tpos = [], []
        for track, chosen in zip(tracks, selections, strict=True):
            tpos_index, t, cond = chosen.spatial[slot]
            stored = output(track, t, cond).maskmem_features
            assert stored is not None, "memories are encoded before they are selected"
            features.append(stored.to(device, non_blocking=True))
            tpos.append(tpos_index)
        memories.append(SpatialMemory(torch.cat(features), shared(tpos)))
    if not selections[0].pointers:
        return memories, None
    ptrs, distances = [], []
    for slot in range(len(selections[0].pointers)):
        row = [chosen.pointers[slot] for chosen in selections]
        ptrs.append(
            torch.cat(
                [
                    output(track, t, cond).obj_ptr.to(device, non_blocking=True)
                    for track, (_, t, cond) in zip(tracks, row, strict=True)
                ]
            )
        )
        distances.append(shared([distance for distance, _, _ in row]))
    return memories, ObjectPointers(torch.stack(ptrs), distances, selections[0].max_distance)
