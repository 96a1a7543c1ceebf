"""Clicks on SAM 3 video objects, as Meta's ``sam3`` 0.1.4 takes them after propagation.

``Sam3VideoInferenceWithInstanceInteractivity.add_prompt(frame, points, point_labels,
obj_id)`` runs ``add_tracker_new_points`` (:func:`add_points` here):

- the object's tracker group (a new one-object group for an unknown id) gets SAM 2 clicks
  on the frame: no memory (``use_prev_mem_frame=False``: the features plus
  ``no_mem_embed``), the object's previous mask on that frame (clamped to +-32) as the mask
  prompt, multimask output for one point; the answer upsampled to the video's size and
  hole-filled there;
- the frame becomes a conditioning frame of the group (Meta's preflight: the other
  objects' outputs on it, masks made non-overlapping, memory encoded from binarized
  masks); conditioning frames the detector added for the object within 16 frames of the
  click stop being conditioning frames (``clear_detector_added_cond_frame_in_tracker``);
- the object's score becomes 1.0 (and its tracker score on that frame), and an object
  hot start removed comes back.

The next ``propagate_in_video`` is decided by Meta's action history (:func:`next_pass`):
after clicks it is a *partial* pass (:func:`repropagate`) - only the clicked objects'
groups are tracked, with the memory encoder on their own masks, and their answers replace
the clicked objects' masks in the cached answers of the full pass; the other objects keep
theirs. A pass after that only fetches. :func:`propagate` runs a session's passes, the
first (the predictor's full pass) and the later ones alike.

Clicks read what bounded memory drops (every conditioning frame, the records of every
tracked frame, each processed frame's masks before post-processing), so only a state
started with ``interactive=True`` takes them; it keeps all of that, as Meta does.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from sam2serve.concepts.video_fill import fill_holes
from sam2serve.concepts.video_predictor import (
    FrameResult,
    Group,
    Record,
    Sam3VideoPredictor,
    VideoState,
    _non_overlapping,
    _Pending,
    unpack_masks,
)
from sam2serve.concepts.video_prompts import Direction, passes
from sam2serve.concepts.video_tracker import TrackerFrame
from sam2serve.modeling.sam2_video import NO_OBJ_SCORE

REFINE_WINDOW = 16  # Meta's refinement_detector_cond_frame_removal_window
PREV_MASK_CLAMP = 32.0  # the previous mask logits fed with new clicks
MAX_POINTS = 16  # Meta's max_point_num_in_prompt_enc (it keeps the first and last 8)
FULL, PARTIAL, FETCH = "propagation_full", "propagation_partial", "propagation_fetch"

Action = tuple[str, int | None, tuple[int, ...] | None]


def check_click(
    state: VideoState,
    frame_idx: int,
    obj_id: int,
    points_xy: Sequence[tuple[float, float]],
    labels: Sequence[int],
) -> None:
    """ValueError naming what is wrong with a click: the frame, the object id, a point
    outside the video, labels not 1 / 0 or not one per point."""
    last = state.num_frames - 1
    if not 0 <= frame_idx <= last:
        raise ValueError(f"click frame {frame_idx} is outside the clip's 0..{last}")
    if isinstance(obj_id, bool) or not isinstance(obj_id, int | np.integer) or obj_id < 0:
        raise ValueError(f"object id must be an integer >= 0; got {obj_id!r}")
    if not points_xy:
        raise ValueError("a click needs at least one point")
    if len(points_xy) > MAX_POINTS:
        raise ValueError(f"at most {MAX_POINTS} points per click; got {len(points_xy)}")
    if len(labels) != len(points_xy):
        raise ValueError(f"one label per point: {len(points_xy)} points, {len(labels)} labels")
    for point in points_xy:
        if len(point) != 2 or not all(math.isfinite(float(v)) for v in point):
            raise ValueError(f"a point is two finite numbers x, y; got {point!r}")
        x, y = float(point[0]), float(point[1])
        if not (0 <= x <= state.width and 0 <= y <= state.height):
            raise ValueError(
                f"point ({x:g}, {y:g}) is outside the {state.width}x{state.height} video"
            )
    for label in labels:
        if label not in (0, 1) or isinstance(label, bool):
            raise ValueError(f"a point's label is 1 (object) or 0 (background); got {label!r}")
    if not state.interactive:
        raise ValueError("this state takes no clicks: start it with interactive=True")
    if frame_idx not in state.cached:
        raise ValueError(f"frame {frame_idx} has no answers yet: propagate over it first")


def next_pass(actions: Sequence[Action], num_frames: int) -> tuple[str, tuple[int, ...] | None]:
    """What Meta's next ``propagate_in_video`` runs, from its action history
    (``parse_action_history_for_propagation``): the kind and the clicked objects."""
    if not actions:
        return FULL, None
    kind, frame, objs = actions[-1]
    if kind.startswith("propagation"):
        if kind == FETCH:
            return FETCH, None
        twice = len(actions) > 1 and actions[-2][0] in (FULL, PARTIAL)
        if twice or frame in (0, num_frames - 1):
            return FETCH, None
        return kind, objs
    clicked: set[int] = set()
    for kind, _, objs in reversed(actions):
        if kind.startswith("propagation"):
            break
        if kind in ("add", "refine") and objs:
            clicked.update(objs)
    return (PARTIAL, tuple(sorted(clicked))) if clicked else (FETCH, None)


@torch.inference_mode()
def add_points(
    predictor: Sam3VideoPredictor,
    state: VideoState,
    frame_idx: int,
    frame: np.ndarray,
    obj_id: int,
    points_xy: Sequence[tuple[float, float]],
    labels: Sequence[int],
) -> FrameResult:
    """Clicks on one object on frame ``frame_idx`` (uint8 HWC ``frame``), points in the
    video's pixels: Meta's ``add_tracker_new_points``. The frame's answers, the clicked
    object's mask replaced (ValueError: :func:`check_click`, or no room for a new object)."""
    check_click(state, frame_idx, obj_id, points_xy, labels)
    obj_id, labels = int(obj_id), [int(label) for label in labels]
    tracker = predictor.tracker
    tick = time.perf_counter()
    _, tracker_frame = predictor.encode(frame)
    tick = state.clock("detector", tick)
    try:
        group, row = state.group_of(obj_id)
        kind = "refine"
    except KeyError:
        tracked = len(state.obj_ids)
        if tracked >= predictor.th.max_objects:
            raise ValueError(
                f"SAM 3 tracks {tracked} objects, its limit: object {obj_id} cannot be added"
            ) from None
        group, row, kind = Group([obj_id]), 0, "add"
        state.groups.append(group)
        state.max_obj_id = max(state.max_obj_id, obj_id)
    state.actions.append((kind, frame_idx, (obj_id,)))
    state.scores[obj_id] = 1.0
    state.tracker_scores.setdefault(frame_idx, {})[obj_id] = 1.0
    state.hot.removed.discard(obj_id)

    # the clicks replace the object's inputs on this frame (Meta's clear_old_points)
    group.clicks.setdefault(frame_idx, set()).add(obj_id)
    masked = group.inputs.get(frame_idx)
    if masked is not None:
        masked.discard(obj_id)
    previous = _own_output(group, frame_idx)
    prev_mask = None
    if previous is not None:
        prev_mask = previous.pred_masks[row : row + 1].clamp(-PREV_MASK_CLAMP, PREV_MASK_CLAMP)
    size = float(tracker.image_size)
    coords = (
        torch.tensor(
            [[float(x) / state.width, float(y) / state.height] for x, y in points_xy],
            dtype=torch.float32,
        )[None]
        * size
    )
    point_labels = torch.tensor(list(labels), dtype=torch.int32)[None]
    features = tracker_frame.feats + tracker.no_mem_embed.reshape(1, -1, 1, 1)
    out = tracker.heads(
        features, tracker_frame, prev_mask, len(points_xy) == 1, (coords, point_labels)
    )
    clicked = Record(out.low_res, out.obj_ptr, out.object_score, out.iou)

    video = F.interpolate(
        out.low_res, size=(state.height, state.width), mode="bilinear", align_corners=False
    )
    mask = fill_holes(video, predictor.th.fill_hole_area)[0, 0] > 0
    _condition_on_click(predictor, group, frame_idx, tracker_frame, obj_id, clicked)
    _drop_detector_frames(group, obj_id, frame_idx)
    state.clock("tracker", tick)

    cached = state.cached[frame_idx]
    cached[obj_id] = np.packbits(mask.numpy().ravel())
    item = _Pending(
        frame_idx,
        unpack_masks(state, cached),
        dict(state.scores),
        dict(state.tracker_scores[frame_idx]),
    )
    return predictor.finish(state, item, hide_removed=False)


def _own_output(group: Group, frame_idx: int) -> Record | None:
    """The group's output on a frame as Meta's per-object copies give it: the
    conditioning record, else the tracked one unless those copies were dropped."""
    record = group.cond.get(frame_idx)
    if record is None and frame_idx not in group.cleared:
        record = group.non_cond.get(frame_idx)
    return record


def _condition_on_click(
    predictor: Sam3VideoPredictor,
    group: Group,
    frame_idx: int,
    frame: TrackerFrame,
    obj_id: int,
    clicked: Record,
) -> None:
    """Meta's preflight after clicks: the frame becomes a conditioning frame of the group,
    the clicked object's new output beside the others' (an object with none on the frame:
    an empty mask, the no-object pointer), masks non-overlapping, memory encoded from
    binarized masks."""
    tracker = predictor.tracker
    count, size = len(group.obj_ids), tracker.low_res_size
    pred = torch.full((count, 1, size, size), NO_OBJ_SCORE)
    ptr = torch.full((count, 256), NO_OBJ_SCORE)
    score = torch.full((count, 1), 10.0)
    iou = torch.zeros((count, 1))
    existing = _own_output(group, frame_idx)
    for row, obj in enumerate(group.obj_ids):
        source, at = (clicked, 0) if obj == obj_id else (existing, row)
        if source is None:
            ptr[row] = tracker.no_obj_ptr[0]  # Meta's pointer of an empty mask
            continue
        pred[row] = source.pred_masks[at]
        ptr[row], score[row], iou[row] = source.obj_ptr[at], source.object_score[at], source.iou[at]
    high_res = F.interpolate(
        pred, size=(tracker.image_size,) * 2, mode="bilinear", align_corners=False
    )
    memory = tracker.encode_memory(frame, _non_overlapping(high_res), score, binarize=True)
    group.cond[frame_idx] = Record(pred, ptr, score, iou, memory.to(torch.bfloat16))
    group.non_cond.pop(frame_idx, None)
    group.clear_around(frame_idx)


def _drop_detector_frames(group: Group, obj_id: int, frame_idx: int) -> None:
    """Meta's ``clear_detector_added_cond_frame_in_tracker``: the object's mask-only
    conditioning frames within the window of the click lose every input and become
    tracked frames."""
    near = [
        t
        for t, ids in group.inputs.items()
        if obj_id in ids
        and obj_id not in group.clicks.get(t, set())
        and abs(t - frame_idx) <= REFINE_WINDOW
    ]
    for t in near:
        group.inputs.pop(t, None)
        group.clicks.pop(t, None)
        record = group.cond.pop(t, None)
        if record is not None:
            group.non_cond[t] = record
        group.cleared.discard(t)


def propagate(
    predictor: Sam3VideoPredictor,
    state: VideoState,
    frame_at: Callable[[int], np.ndarray],
    start: int,
    direction: Direction = "forward",
) -> Iterator[FrameResult]:
    """A session's ``propagate_in_video``, the first or a later one: the first is
    :meth:`Sam3VideoPredictor.propagate_clip`'s full pass, later ones :func:`repropagate`'s
    (after clicks only the clicked objects run)."""
    if state.actions:
        return repropagate(predictor, state, frame_at, start, direction)
    return predictor.propagate_clip(state, frame_at, start, direction)


def repropagate(
    predictor: Sam3VideoPredictor,
    state: VideoState,
    frame_at: Callable[[int], np.ndarray],
    start: int,
    direction: Direction,
) -> Iterator[FrameResult]:
    """Meta's ``propagate_in_video`` passes on a state that has propagated before: each
    pass partial (after clicks: only the clicked objects' groups run) or a fetch of the
    cached answers, as the action history decides; ValueError (before any frame) where
    Meta would run the detector again or has no answers to merge into."""
    plan = passes(state.num_frames, start, direction)
    actions = list(state.actions)
    kinds: list[tuple[str, tuple[int, ...] | None]] = []
    for step in plan:
        kind, objs = next_pass(actions, state.num_frames)
        actions.append((kind, start, objs))
        kinds.append((kind, objs))
        if kind == FULL:
            raise ValueError(
                "Meta's predictor would run the detector over the clip again here: start a "
                "new state for that"
            )
        if kind == PARTIAL:
            missing = [t for t in step.frames if t not in state.cached]
            if missing:
                raise ValueError(
                    f"frame {missing[0]} has no answers of an earlier pass to merge the "
                    "clicked objects into: propagate over it before clicking"
                )
    for step, (kind, objs) in zip(plan, kinds, strict=True):
        state.actions.append((kind, start, objs))
        if kind == FETCH:
            for frame_idx in step.frames:
                yield predictor.cached_result(state, frame_idx)
            continue
        assert objs is not None
        yield from _partial(predictor, state, frame_at, step.frames, step.reverse, set(objs))


@torch.inference_mode()
def _partial(
    predictor: Sam3VideoPredictor,
    state: VideoState,
    frame_at: Callable[[int], np.ndarray],
    frames: range,
    reverse: bool,
    clicked: set[int],
) -> Iterator[FrameResult]:
    """Meta's partial pass: the clicked objects' groups tracked frame by frame with the
    memory encoder on their own masks; the clicked objects' hole-filled masks (and raw
    tracker score logits, as Meta) replace theirs in the cached answers; no hot start."""
    tracker = predictor.tracker
    groups = [group for group in state.groups if clicked & set(group.obj_ids)]
    side = (tracker.image_size,) * 2
    for frame_idx in frames:
        tick = time.perf_counter()
        _, frame = predictor.encode(frame_at(frame_idx))
        tick = state.clock("detector", tick)
        objs: list[int] = []
        lows: list[Tensor] = []
        logits: list[Tensor] = []
        for group in groups:
            record = group.cond.get(frame_idx)
            if record is None:
                record = predictor.track(state, group, frame_idx, frame, reverse)
                high_res = F.interpolate(
                    record.pred_masks, size=side, mode="bilinear", align_corners=False
                )
                memory = tracker.encode_memory(frame, high_res, record.object_score, False)
                record.maskmem = memory.to(torch.bfloat16)
                group.non_cond[frame_idx] = record
            group.visited(frame_idx)
            objs.extend(group.obj_ids)
            lows.append(record.pred_masks[:, 0])
            logits.append(record.object_score[:, 0])
        filled = fill_holes(torch.cat(lows)[:, None], predictor.th.fill_hole_area)
        tick = state.clock("tracker", tick)
        frame_scores = state.tracker_scores.setdefault(frame_idx, {})
        cached = state.cached[frame_idx]
        for obj, low, logit in zip(objs, filled, torch.cat(logits), strict=True):
            if obj not in clicked:
                continue
            frame_scores[obj] = float(logit)
            video = F.interpolate(
                low[None].float(),
                size=(state.height, state.width),
                mode="bilinear",
                align_corners=False,
            )
            cached[obj] = np.packbits((video[0, 0] > 0).numpy().ravel())
        item = _Pending(
            frame_idx, unpack_masks(state, cached), dict(state.scores), dict(frame_scores)
        )
        result = predictor.finish(state, item, hide_removed=False)
        state.clock("association", tick)
        yield result


__all__ = [
    "MAX_POINTS",
    "REFINE_WINDOW",
    "add_points",
    "check_click",
    "next_pass",
    "propagate",
    "repropagate",
]
