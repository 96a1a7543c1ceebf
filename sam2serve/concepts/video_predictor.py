"""SAM 3's video predictor: a phrase on a clip -> every instance, tracked, new ones picked
up, lost ones ended; Meta's ``Sam3VideoInference`` semantics on our modules.

Per frame (``docs/concepts-video.md`` has the rules in prose):

1. the detector on the frame (SAM 3's, :mod:`sam2serve.concepts.engine`), mask NMS,
   probabilities above the threshold; the tracker's features from the same ViT output;
2. every track one step (:class:`~sam2serve.concepts.video_tracker.Sam3Tracker`, memory
   selected as Meta's ``use_memory_selection``), masks cleaned (:mod:`video_fill`);
3. detections matched with tracks (:mod:`video_association`), hot start removes young
   tracks that are unmatched or duplicated too often, sure detections recondition their
   tracks every 16th frame;
4. the most recently occluded of overlapping tracks hidden, every track's memory encoded;
5. new detections become new objects (one tracker *group* per frame they appear on, as
   Meta's one inference state per batch of new objects), removed ones leave;
6. outputs held back ``hotstart_delay`` frames, removed ids hidden, empty masks dropped,
   overlaps resolved by tracker score.

The prompt is a phrase, one exemplar box on the prompt frame, or both; propagation goes
forward, backward or both ways as Meta's passes (:mod:`video_prompts`,
:meth:`Sam3VideoPredictor.propagate_clip`; backward, memories come from later frames).

All state is in :class:`VideoState` (one per clip and prompt); the predictor holds only
models. ``bounded`` (default) drops what forward propagation can no longer read — past
records outside the memory selection's reach, all but the 4 latest conditioning frames —
so memory per clip stays bounded; the answers are the same. A state started
``interactive`` keeps everything instead (Meta's memory): clicks on its objects after a
pass read it (:mod:`video_clicks`: ``add_points``, ``propagate``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from sam2serve.concepts.engine import (
    ConceptEncoding,
    ExemplarBox,
    TextEncoding,
    Tokenize,
    encode_text,
    model_pixels,
    run_detector,
    split_encodings,
)
from sam2serve.concepts.phrases import VISUAL_PHRASE
from sam2serve.concepts.tracker_heads import TrackerNeck
from sam2serve.concepts.video_association import (
    ALWAYS_OCCLUDED,
    NEVER_OCCLUDED,
    NO_OBJ_LOGIT,
    HotStart,
    VideoThresholds,
    associate,
    nms_keep,
    occlusion_suppressed,
)
from sam2serve.concepts.video_fill import fill_holes
from sam2serve.concepts.video_prompts import Direction, check_video_prompt, passes
from sam2serve.concepts.video_tracker import (
    MAX_COND_FRAMES,
    MAX_OBJ_PTRS,
    MEMORY_SELECTION_THRESH,
    NUM_MASKMEM,
    Sam3Tracker,
    TrackerFrame,
)
from sam2serve.modeling.sam2_video import NO_OBJ_SCORE

if TYPE_CHECKING:
    from transformers import Sam3Model

REMOVED_SCORE = -1e4


Held = TypeVar("Held")


def hotstart_release(pending: list[Held], delay: int, last: bool) -> tuple[list[Held], list[Held]]:
    """Meta's hot-start buffer after a frame is processed: (answers let out now, answers
    still held). A frame's answer leaves once ``delay`` frames are held (0: at once);
    ``last`` (the pass's end) lets every one out."""
    if last or delay == 0:
        return pending, []
    if len(pending) >= delay:
        return pending[:1], pending[1:]
    return [], pending


@dataclass
class Record:
    """One group's output on one frame (Meta's compact frame output)."""

    pred_masks: Tensor  # (B, 1, L, L) logits
    obj_ptr: Tensor  # (B, 256)
    object_score: Tensor  # (B, 1)
    iou: Tensor  # (B, 1)
    maskmem: Tensor | None = None  # (B, 64, G, G) bfloat16, once encoded
    eff_iou: float | None = None  # memory-selection score (tracked frames)

    def rows(self, keep: list[int]) -> Record:
        record = Record(
            self.pred_masks[keep],
            self.obj_ptr[keep],
            self.object_score[keep],
            self.iou[keep],
            None if self.maskmem is None else self.maskmem[keep],
        )
        record.eff_iou = memory_score(record.object_score, record.iou)
        return record


@dataclass
class Group:
    """Objects added on one frame, tracked as one batch (Meta's tracker inference state)."""

    obj_ids: list[int]
    cond: dict[int, Record] = field(default_factory=dict)
    non_cond: dict[int, Record] = field(default_factory=dict)
    inputs: dict[int, set[int]] = field(default_factory=dict)  # frame -> ids with a mask
    clicks: dict[int, set[int]] = field(default_factory=dict)  # frame -> ids with points
    # tracked frames whose per-object copies Meta has dropped (its
    # _clear_non_cond_mem_around_input, single-object groups): a click reads those copies
    # (its previous mask, the other objects' outputs), tracking never does
    cleared: set[int] = field(default_factory=set)

    def visited(self, frame_idx: int) -> None:
        """Propagation wrote this frame's outputs (Meta's per-object copies too); on a
        conditioning frame of a one-object group, Meta drops the copies of the tracked
        frames around it."""
        if frame_idx in self.cond and len(self.obj_ids) <= 1:
            self.clear_around(frame_idx)
        self.cleared.discard(frame_idx)

    def clear_around(self, frame_idx: int) -> None:
        if len(self.obj_ids) <= 1:
            self.cleared.update(range(frame_idx - NUM_MASKMEM, frame_idx + NUM_MASKMEM + 1))


@dataclass
class FrameResult:
    """One frame's answer: objects (ascending ids) with their detection score, binary
    mask at the video's size and xyxy box (pixels)."""

    frame: int
    obj_ids: list[int]
    scores: list[float]
    masks: np.ndarray  # bool (K, H, W)
    boxes: list[tuple[float, float, float, float]]


@dataclass
class _Pending:
    """A processed frame's outputs before hot start lets them out."""

    frame: int
    masks: dict[int, Tensor]  # obj id -> bool (H, W)
    scores: dict[int, float]
    tracker_scores: dict[int, float]


@dataclass
class VideoState:
    """Everything a clip's propagation keeps between frames."""

    num_frames: int
    height: int
    width: int
    text: TextEncoding | None = None
    # the prompt (video_prompts.check_video_prompt): with no phrase, only the prompt frame
    # looks for instances (Meta's allow_new_detections); the exemplar box prompts the
    # detector there and, as Meta's detector prefetches the next frame with the same
    # prompt, on the next frame of the forward pass
    has_phrase: bool = True
    box: ExemplarBox | None = None
    prompt_frame: int | None = None
    # bounded memory also keeps what a backward pass after the forward one reads
    keep_start: bool = False
    # clicks (concepts/video_clicks.py) read what bounded memory drops: an interactive
    # state keeps every record (Meta's memory) and every processed frame's answers before
    # post-processing (Meta's cached_frame_outputs: frame -> object -> packed bool mask)
    interactive: bool = False
    cached: dict[int, dict[int, np.ndarray]] = field(default_factory=dict)
    # Meta's action history: (kind, frame, object ids) - "propagation_full",
    # "propagation_partial", "propagation_fetch", "add", "refine"
    actions: list[tuple[str, int | None, tuple[int, ...] | None]] = field(default_factory=list)
    groups: list[Group] = field(default_factory=list)
    hot: HotStart = field(default_factory=HotStart)
    max_obj_id: int = -1
    scores: dict[int, float] = field(default_factory=dict)
    last_occluded: dict[int, int] = field(default_factory=dict)
    # frame -> object -> score of the frame being processed (the prompt frame's two steps
    # share it); bounded state keeps only that frame's (the answers carry their own copy)
    tracker_scores: dict[int, dict[int, float]] = field(default_factory=dict)
    # wall seconds per stage over the frames processed: "detector" (ViT, tracker neck,
    # detector, NMS), "tracker" (track steps, memory encoding, new objects),
    # "association" (matching, hot start, occlusion, outputs)
    stage_seconds: dict[str, float] = field(
        default_factory=lambda: {"detector": 0.0, "tracker": 0.0, "association": 0.0}
    )

    def clock(self, stage: str, since: float) -> float:
        now = time.perf_counter()
        self.stage_seconds[stage] += now - since
        return now

    @property
    def obj_ids(self) -> np.ndarray:
        ids = [obj for group in self.groups for obj in group.obj_ids]
        return np.array(ids, dtype=np.int64)

    def group_of(self, obj: int) -> tuple[Group, int]:
        for group in self.groups:
            if obj in group.obj_ids:
                return group, group.obj_ids.index(obj)
        raise KeyError(obj)


def memory_score(object_score: Tensor, iou: Tensor) -> float:
    """Meta's ``cal_mem_score`` (its broadcast included: mean over objects of the scaled
    object score times mean of the IoUs)."""
    norm = torch.where(
        object_score > 0, object_score.sigmoid() * 2 - 1, torch.zeros_like(object_score)
    )
    return float((norm * iou.reshape(-1)).mean())


@dataclass(frozen=True)
class Detections:
    masks: Tensor  # (N, L, L) logits
    scores: np.ndarray  # (N,) probabilities
    boxes: Tensor  # (N, 4) xyxy, normalised


class Sam3VideoPredictor:
    """SAM 3's detector (transformers' ``Sam3Model``, with its tokenizer), tracker neck
    and tracker; stateless per clip."""

    def __init__(
        self,
        detector: Sam3Model,
        tokenize: Tokenize,
        neck: TrackerNeck,
        tracker: Sam3Tracker,
        thresholds: VideoThresholds | None = None,
        bounded: bool = True,
    ) -> None:
        self.detector = detector
        self.tokenize = tokenize
        self.neck = neck
        self.tracker = tracker
        self.th = thresholds or VideoThresholds()
        self.bounded = bounded

    # -- per-frame models ---------------------------------------------------------------------

    def encode(self, frame: np.ndarray) -> tuple[ConceptEncoding, TrackerFrame]:
        """One frame (uint8 HWC) -> the detector's encoding and the tracker's features, one
        ViT pass for both; the tracker neck in its weights' dtype (a mode's), the position
        encoding in float32."""
        pixels = model_pixels(self.detector, [frame])
        vision = self.detector.get_vision_features(pixel_values=pixels)
        (encoding,) = split_encodings(vision, [frame])
        hidden = vision.last_hidden_state.to(next(self.neck.parameters()).dtype)
        side = pixels.shape[-1] // 14
        spatial = hidden.view(1, side, side, -1).permute(0, 3, 1, 2)
        levels = self.neck(spatial)
        return encoding, self.tracker.frame(levels, self.neck.position(levels[2].float()))

    def detect(
        self, state: VideoState, encoding: ConceptEncoding, frame_idx: int, reverse: bool = False
    ) -> Detections:
        """Meta's video detections: joint score through its ``inverse_sigmoid`` (eps 1e-3),
        mask NMS, kept above the threshold. No detections where the prompt allows no new
        objects (no phrase, not the prompt frame: Meta's ``allow_new_detections``)."""
        assert state.text is not None, "start() encodes the phrase first"
        prompt = state.prompt_frame
        if not state.has_phrase and frame_idx != prompt:
            size = self.tracker.low_res_size
            return Detections(
                torch.zeros(0, size, size), np.zeros(0, np.float32), torch.zeros(0, 4)
            )
        # the box prompts its frame, and the next one on the forward pass (Meta's detector
        # computes frame t + 1 ahead with frame t's geometric prompt)
        boxed = prompt is not None and (
            frame_idx == prompt or (frame_idx == prompt + 1 and not reverse)
        )
        boxes = (state.box,) if boxed and state.box is not None else ()
        out = run_detector(self.detector, encoding, 1, boxes, state.text)
        assert out.pred_logits is not None and out.presence_logits is not None, "scored queries"
        joint = out.pred_logits.float().sigmoid() * out.presence_logits.float().sigmoid()
        joint = joint.clamp(0, 1)
        logits = torch.log(joint.clamp(min=1e-3) / (1 - joint).clamp(min=1e-3)).clamp(-10, 10)
        probs = logits.sigmoid()[0]
        masks = out.pred_masks[0].float()
        keep = nms_keep(probs, masks, self.th.score, self.th.det_nms_iou)
        probs = torch.where(keep, probs, torch.sigmoid(logits[0] - 1e4))
        pos = probs > self.th.score
        return Detections(masks[pos], probs[pos].numpy(), out.pred_boxes[0].float()[pos])

    # -- session ------------------------------------------------------------------------------

    def start(
        self,
        num_frames: int,
        height: int,
        width: int,
        phrase: str | None,
        boxes: Sequence[ExemplarBox] = (),
        interactive: bool = False,
    ) -> VideoState:
        """A clip's state for a prompt: a phrase, one exemplar box (pixels of the video) on
        the prompt frame, or both (:func:`~sam2serve.concepts.video_prompts.check_video_prompt`;
        ValueError names a bad one). ``interactive``: the state takes clicks after
        propagation (:func:`sam2serve.concepts.video_clicks.add_points`) and so keeps what they read, unbounded as Meta's."""
        text, box = check_video_prompt(phrase, boxes, width, height)
        state = VideoState(num_frames, height, width, has_phrase=text is not None, box=box)
        state.interactive = interactive
        state.text = encode_text(self.detector, self.tokenize, [text or VISUAL_PHRASE])
        return state

    @torch.inference_mode()
    def propagate_clip(
        self,
        state: VideoState,
        frame_at: Callable[[int], np.ndarray],
        start: int,
        direction: Direction = "forward",
    ) -> Iterator[FrameResult]:
        """Meta's session in any direction: the prompt on frame ``start``, then its
        ``propagate_in_video`` passes (:func:`~sam2serve.concepts.video_prompts.passes`),
        each pass's answers in the order it visits frames (backward: ``start - 1`` down to
        0; the prompt frame's own answer is only forward propagation's). ``frame_at(t)``
        gives frame ``t`` (uint8 HWC). Once per state: the passes after it (Meta's action
        history after clicks) are :func:`sam2serve.concepts.video_clicks.propagate`'s."""
        if state.actions:
            raise ValueError(
                "this state has propagated already: the passes after it (clicks, fetches) are "
                "sam2serve.concepts.video_clicks.propagate's"
            )
        plan = passes(state.num_frames, start, direction)
        if direction == "both" and not plan[1].fetch:
            state.keep_start = True
        for index, step in enumerate(plan):
            kind = "propagation_fetch" if step.fetch else "propagation_full"
            state.actions.append((kind, start, None))
            if step.fetch:
                # Meta's fetch: frames no pass has processed have no cached output
                for frame_idx in step.frames:
                    yield self.cached_result(state, frame_idx)
                continue
            frames = ((t, frame_at(t)) for t in step.frames)
            if index == 0 and step.reverse:  # backward only: add_prompt first
                tick = time.perf_counter()
                encoding, tracker_frame = self.encode(frame_at(start))
                state.clock("detector", tick)
                state.prompt_frame = start
                self.step(state, start, encoding, tracker_frame)
            yield from self._propagate(
                state, frames, step.reverse, prompt=index == 0 and not step.reverse
            )

    @torch.inference_mode()
    def run(
        self, state: VideoState, frames: Sequence[np.ndarray] | Iterator[np.ndarray], start: int = 0
    ) -> Iterator[FrameResult]:
        """Meta's session on a clip: the prompt on frame ``start`` (its answer is not
        yielded, as Meta's ``add_prompt`` answer is not part of propagation), then forward
        propagation from ``start`` to the end, every frame's answer in order. ``frames``
        yields frame ``start`` first. (:meth:`propagate_clip` also goes backward.)"""
        numbered = ((start + index, frame) for index, frame in enumerate(frames))
        state.actions.append(("propagation_full", start, None))
        return self._propagate(state, numbered, False, prompt=True)

    def cached_result(self, state: VideoState, frame_idx: int) -> FrameResult:
        """A frame's cached answers, post-processed as Meta's fetch (none: no objects)."""
        masks = unpack_masks(state, state.cached.get(frame_idx, {}))
        item = _Pending(
            frame_idx, masks, dict(state.scores), dict(state.tracker_scores.get(frame_idx, {}))
        )
        return self.finish(state, item, hide_removed=False)

    @torch.inference_mode()
    def _propagate(
        self,
        state: VideoState,
        frames: Iterable[tuple[int, np.ndarray]],
        reverse: bool,
        prompt: bool,
    ) -> Iterator[FrameResult]:
        """One ``propagate_in_video`` pass over (index, frame) pairs in visiting order;
        ``prompt``: the first frame is the prompt frame (``add_prompt`` runs on it first).
        Answers are held back ``hotstart_delay`` frames, all let out at the pass's end."""
        pending: list[_Pending] = []
        end = 0 if reverse else state.num_frames - 1
        for frame_idx, frame in frames:
            tick = time.perf_counter()
            encoding, tracker_frame = self.encode(frame)
            state.clock("detector", tick)
            if prompt:
                state.prompt_frame = frame_idx
                self.step(state, frame_idx, encoding, tracker_frame)  # add_prompt
                prompt = False
            pending.append(self.step(state, frame_idx, encoding, tracker_frame, reverse))
            ready, pending = hotstart_release(pending, self.th.hotstart_delay, frame_idx == end)
            for item in ready:
                tick = time.perf_counter()
                result = self._let_out(state, item)
                state.clock("association", tick)
                yield result
        for item in pending:  # a source shorter than announced
            yield self._let_out(state, item)

    def _let_out(self, state: VideoState, item: _Pending) -> FrameResult:
        """A frame leaves hot start: an interactive state caches its masks first, less the
        objects removed by now (Meta's ``_cache_frame_outputs``)."""
        if state.interactive:
            state.cached[item.frame] = {
                obj: np.packbits(mask.numpy().ravel())
                for obj, mask in item.masks.items()
                if obj not in state.hot.removed
            }
        return self.finish(state, item)

    def step(
        self,
        state: VideoState,
        frame_idx: int,
        encoding: ConceptEncoding,
        frame: TrackerFrame,
        reverse: bool = False,
    ) -> _Pending:
        """One frame of Meta's ``_det_track_one_frame``."""
        th = self.th
        tick = time.perf_counter()
        det = self.detect(state, encoding, frame_idx, reverse)
        tick = state.clock("detector", tick)
        trk_ids = state.obj_ids
        trk_masks, trk_scores = self.propagate(state, frame_idx, frame, reverse)
        tick = state.clock("tracker", tick)
        assoc = associate(det.masks, det.scores, trk_masks, trk_ids, th)
        new_dets = assoc.new_dets
        if len(trk_ids) + len(new_dets) > th.max_objects:
            keep = th.max_objects - len(trk_ids)
            order = np.argsort(det.scores[new_dets])[::-1]
            new_dets = new_dets[order[:keep]] if keep > 0 else new_dets[:0]
        new_ids = state.max_obj_id + 1 + np.arange(len(new_dets))
        removed_now = state.hot.update(frame_idx, reverse, assoc, new_ids, th)
        tick = state.clock("association", tick)
        if th.recondition_every > 0 and frame_idx % th.recondition_every == 0 and assoc.recondition:
            self.recondition(state, frame_idx, frame, det, assoc.recondition, trk_ids, trk_scores)
            tick = state.clock("tracker", tick)
        if trk_masks.shape[0] > 0:
            trk_masks = self.suppress_occluded(
                state, frame_idx, trk_masks, trk_ids, removed_now, reverse
            )
            tick = state.clock("association", tick)
            self.update_memories(state, frame_idx, frame, trk_masks)
            tick = state.clock("tracker", tick)
        else:
            state.last_occluded = {}
        frame_scores = state.tracker_scores.setdefault(frame_idx, {})
        if len(new_ids):
            for obj, d in zip(new_ids.tolist(), new_dets.tolist(), strict=True):
                state.scores[obj] = float(det.scores[d])
                frame_scores[obj] = float(det.scores[d])
            state.max_obj_id = max(state.max_obj_id, int(new_ids.max()))
        for obj in removed_now:
            state.scores[obj] = REMOVED_SCORE
            frame_scores[obj] = REMOVED_SCORE
            state.last_occluded.pop(obj, None)
        if len(new_dets):
            self.add_objects(state, frame_idx, frame, new_ids.tolist(), det.masks[new_dets])
        for obj in sorted(removed_now):
            self.remove_object(state, obj)
        tick = state.clock("tracker", tick)
        masks = self.outputs(state, trk_ids, trk_masks, det, new_dets, new_ids)
        if trk_scores.shape[0] > 0:
            probs = trk_scores.sigmoid().reshape(-1).tolist()
            frame_scores.update(dict(zip(trk_ids.tolist(), probs, strict=True)))
        pending = _Pending(frame_idx, masks, dict(state.scores), dict(frame_scores))
        if self.bounded and not state.interactive:
            self.trim(state, frame_idx, reverse)
        state.clock("association", tick)
        return pending

    # -- tracker ------------------------------------------------------------------------------

    def propagate(
        self, state: VideoState, frame_idx: int, frame: TrackerFrame, reverse: bool = False
    ) -> tuple[Tensor, Tensor]:
        """Every group one step on the frame (no memory encoding yet): hole-filled mask
        logits (M, L, L) and object-score logits (M,) of all tracked objects, in order."""
        masks, scores = [], []
        for group in state.groups:
            if frame_idx in group.cond:
                record = group.cond[frame_idx]
            else:
                record = self.track(state, group, frame_idx, frame, reverse)
                group.non_cond[frame_idx] = record
            group.visited(frame_idx)
            masks.append(record.pred_masks[:, 0])
            scores.append(record.object_score[:, 0])
        size = self.tracker.low_res_size
        if not masks:
            return torch.zeros(0, size, size), torch.zeros(0)
        filled = fill_holes(torch.cat(masks)[:, None], self.th.fill_hole_area)[:, 0]
        return filled, torch.cat(scores)

    def track(
        self,
        state: VideoState,
        group: Group,
        frame_idx: int,
        frame: TrackerFrame,
        reverse: bool = False,
    ) -> Record:
        """Meta's ``track_step`` on a tracked frame of one group (memory selection on);
        ``reverse``: the memories are of later frames, pointer distances counted backward."""
        batch = len(group.obj_ids)
        selected, unselected = _closest_cond(frame_idx, group.cond)
        valid = _frame_filter(group.non_cond, frame_idx, state.num_frames, reverse)
        memories: list[tuple[Tensor, int]] = []
        for record in selected.values():
            assert record.maskmem is not None
            memories.append((record.maskmem, NUM_MASKMEM - 1))
        for t_pos in range(1, NUM_MASKMEM):
            t_rel = NUM_MASKMEM - t_pos
            if t_rel > len(valid):
                continue
            prev = valid[-t_rel]
            past = group.non_cond.get(prev, unselected.get(prev))
            if past is not None and past.maskmem is not None:
                memories.append((past.maskmem, NUM_MASKMEM - t_pos - 1))
        max_ptrs = min(state.num_frames, MAX_OBJ_PTRS)
        sign = -1 if reverse else 1
        pointers = [
            ((frame_idx - t) * sign, record.obj_ptr)
            for t, record in selected.items()
            if (t >= frame_idx if reverse else t <= frame_idx)
        ]
        for t_diff in range(1, max_ptrs):
            if -t_diff <= -len(valid):
                break
            t = valid[-t_diff]
            past = group.non_cond.get(t, unselected.get(t))
            if past is not None:
                pointers.append((t_diff, past.obj_ptr))
        pix = self.tracker.condition(frame, batch, memories, pointers, max_ptrs)
        out = self.tracker.track(pix, frame)
        record = Record(out.low_res, out.obj_ptr, out.object_score, out.iou)
        record.eff_iou = memory_score(out.object_score, out.iou)
        return record

    def recondition(
        self,
        state: VideoState,
        frame_idx: int,
        frame: TrackerFrame,
        det: Detections,
        targets: dict[int, int],
        trk_ids: np.ndarray,
        trk_scores: Tensor,
    ) -> None:
        """Sure detections become new conditioning masks of their tracks (whose tracker
        object-score logit is above 0.8), as Meta's ``_recondition_masklets``."""
        touched: dict[int, dict[int, Tensor]] = {}
        for obj, d in targets.items():
            index = int(np.nonzero(trk_ids == obj)[0][0])
            if not float(trk_scores[index]) > 0.8:
                continue
            group, _ = state.group_of(obj)
            mask = self._input_mask(det.masks[d : d + 1])[0]
            touched.setdefault(id(group), {})[obj] = mask
        for group in state.groups:
            if id(group) in touched:
                self._condition_group(state, group, frame_idx, frame, touched[id(group)])

    def _input_mask(self, logits: Tensor) -> Tensor:
        """Detector logits (N, L, L) -> bool masks (N, 16G, 16G) (Meta: bilinear, > 0)."""
        size = self.tracker.input_mask_size
        up = F.interpolate(logits[:, None], size=(size, size), mode="bilinear", align_corners=False)
        return up[:, 0] > 0

    def _condition_group(
        self,
        state: VideoState,
        group: Group,
        frame_idx: int,
        frame: TrackerFrame,
        masks: dict[int, Tensor],
    ) -> None:
        """Mask inputs for some of a group's objects on a frame, then Meta's preflight: the
        frame becomes a conditioning frame of the whole group, its memory encoded from the
        masks (binarised, pixel-wise non-overlapping)."""
        size = self.tracker.low_res_size
        batch = len(group.obj_ids)
        previous = group.cond.get(frame_idx) or group.non_cond.get(frame_idx)
        pred = torch.full((batch, 1, size, size), NO_OBJ_SCORE)
        ptr = torch.full((batch, 256), NO_OBJ_SCORE)
        score = torch.full((batch, 1), 10.0)
        iou = torch.zeros((batch, 1))
        # Each mask prompt, in order, takes its pixels from the video-size masks of the
        # prompts before it on this frame (Meta's add_new_mask).
        video_res: dict[int, Tensor] = {}
        for obj, mask in masks.items():
            row = group.obj_ids.index(obj)
            out = self.tracker.mask_as_output(frame, mask[None, None].float())
            video = self._video_res(state, mask)
            for other, logits in video_res.items():
                video_res[other] = torch.where(video > 0, NO_OBJ_SCORE, logits)
            video_res[obj] = video
            ptr[row], score[row], iou[row] = out.obj_ptr[0], out.object_score[0], out.iou[0]
            group.inputs.setdefault(frame_idx, set()).add(obj)
        for row, obj in enumerate(group.obj_ids):
            if obj in video_res:
                pred[row] = _resize(video_res[obj], size, antialias=True)[0]
            elif previous is not None:
                pred[row] = previous.pred_masks[row]
                ptr[row], score[row] = previous.obj_ptr[row], previous.object_score[row]
                iou[row] = previous.iou[row]
        high_res = F.interpolate(
            pred,
            size=(self.tracker.image_size,) * 2,
            mode="bilinear",
            align_corners=False,
        )
        high_res = _non_overlapping(high_res)
        memory = self.tracker.encode_memory(frame, high_res, score, binarize=True)
        group.cond[frame_idx] = Record(pred, ptr, score, iou, memory.to(torch.bfloat16))
        group.non_cond.pop(frame_idx, None)
        group.clear_around(frame_idx)

    def _video_res(self, state: VideoState, mask: Tensor) -> Tensor:
        """A bool mask prompt (S, S) at the video's size as +-1024 logits (1, 1, H, W):
        Meta's output for a mask-prompted frame."""
        video = F.interpolate(
            mask[None, None].float(),
            size=(state.height, state.width),
            mode="bilinear",
            align_corners=False,
            antialias=True,
        )
        return torch.where(video > 0.5, -NO_OBJ_SCORE, NO_OBJ_SCORE)

    def add_objects(
        self,
        state: VideoState,
        frame_idx: int,
        frame: TrackerFrame,
        obj_ids: list[int],
        det_masks: Tensor,
    ) -> None:
        """New detections become one new group, each detection mask its object's
        conditioning mask on this frame."""
        group = Group(list(obj_ids))
        masks = self._input_mask(det_masks)
        self._condition_group(
            state, group, frame_idx, frame, dict(zip(obj_ids, masks, strict=True))
        )
        state.groups.append(group)

    def remove_object(self, state: VideoState, obj: int) -> None:
        """Meta's ``remove_object``: the group loses the object's rows; a frame only it had
        a mask on stops being a conditioning frame; an emptied group goes."""
        group, row = state.group_of(obj)
        if len(group.obj_ids) == 1:
            state.groups.remove(group)
            return
        keep = [i for i in range(len(group.obj_ids)) if i != row]
        for clicked in group.clicks.values():
            clicked.discard(obj)
        for frame_idx in [f for f, ids in group.inputs.items() if obj in ids]:
            group.inputs[frame_idx].discard(obj)
            if not group.inputs[frame_idx]:
                del group.inputs[frame_idx]
                record = group.cond.pop(frame_idx, None)
                if record is not None:
                    group.non_cond[frame_idx] = record
        group.obj_ids.remove(obj)
        group.cond = {f: r.rows(keep) for f, r in group.cond.items()}
        group.non_cond = {f: r.rows(keep) for f, r in group.non_cond.items()}
        if not group.cond:
            state.groups.remove(group)  # Meta resets such a state; nothing is tracked

    def suppress_occluded(
        self,
        state: VideoState,
        frame_idx: int,
        trk_masks: Tensor,
        trk_ids: np.ndarray,
        removed_now: set[int],
        reverse: bool = False,
    ) -> Tensor:
        """Meta's ``_suppress_overlapping_based_on_recent_occlusion``: hidden masks set to
        -10 (in the outputs too), last-occluded frames updated."""
        binary = trk_masks > 0
        previous = state.last_occluded
        last = torch.tensor(
            [
                previous.get(obj, ALWAYS_OCCLUDED if obj in removed_now else NEVER_OCCLUDED)
                for obj in trk_ids.tolist()
            ],
            dtype=torch.long,
        )
        hide = occlusion_suppressed(binary, last, reverse, self.th.occlusion_iou)
        occluded = ~binary.any(dim=(1, 2)) | hide
        last = torch.where(occluded, frame_idx, last)
        state.last_occluded = {
            obj: int(v) for obj, v in zip(trk_ids.tolist(), last.tolist(), strict=True)
        }
        for obj in removed_now:
            state.last_occluded.pop(obj, None)
        trk_masks = trk_masks.clone()
        trk_masks[hide] = NO_OBJ_LOGIT
        return trk_masks

    def update_memories(
        self, state: VideoState, frame_idx: int, frame: TrackerFrame, trk_masks: Tensor
    ) -> None:
        """Every tracked object's memory on this frame from its (cleaned) mask, after
        Meta's area-shrinkage suppression across all objects."""
        size = self.tracker.input_mask_size
        high_res = F.interpolate(
            trk_masks[:, None], size=(size, size), mode="bilinear", align_corners=False
        )
        non_overlap = _non_overlapping(high_res)
        before = (high_res > 0).sum(dim=(-1, -2)).clamp(min=1.0)
        after = (non_overlap > 0).sum(dim=(-1, -2))
        keep = (after / before) >= 0.3
        high_res = torch.where(keep[..., None, None], high_res, high_res.clamp(max=-10.0))
        scores = torch.where((high_res > 0).any(dim=(-1, -2)), 10.0, -10.0)
        start = 0
        for group in state.groups:
            count = len(group.obj_ids)
            part = slice(start, start + count)
            memory = self.tracker.encode_memory(frame, high_res[part], scores[part], False)
            record = group.cond.get(frame_idx) or group.non_cond.get(frame_idx)
            assert record is not None
            record.maskmem = memory.to(torch.bfloat16)
            start += count

    # -- outputs -----------------------------------------------------------------------------

    def outputs(
        self,
        state: VideoState,
        trk_ids: np.ndarray,
        trk_masks: Tensor,
        det: Detections,
        new_dets: np.ndarray,
        new_ids: np.ndarray,
    ) -> dict[int, Tensor]:
        size = (state.height, state.width)
        out: dict[int, Tensor] = {}
        if trk_masks.shape[0]:
            up = F.interpolate(trk_masks[:, None], size=size, mode="bilinear", align_corners=False)
            for obj, mask in zip(trk_ids.tolist(), up[:, 0] > 0, strict=True):
                out[obj] = mask
        if len(new_dets):
            filled = fill_holes(det.masks[new_dets][:, None], self.th.fill_hole_area)
            up = F.interpolate(filled, size=size, mode="bilinear", align_corners=False)
            for obj, mask in zip(new_ids.tolist(), up[:, 0] > 0, strict=True):
                out[obj] = mask
        return out

    def finish(self, state: VideoState, item: _Pending, hide_removed: bool = True) -> FrameResult:
        """Meta's ``_postprocess_output``: removed ids (``hide_removed``: a propagation's,
        not a fetch's or a click's, whose cached masks are already without them) and empty
        masks dropped, overlaps given to the object with the higher tracker score."""
        hidden = state.hot.removed if hide_removed else set()
        ids = sorted(obj for obj in item.masks if obj not in hidden)
        ids = [obj for obj in ids if bool(item.masks[obj].any())]
        height, width = state.height, state.width
        if not ids:
            return FrameResult(item.frame, [], [], np.zeros((0, height, width), bool), [])
        masks = torch.stack([item.masks[obj] for obj in ids])
        boxes = _boxes(masks)
        if len(ids) > 1:
            # Meta's object-wise non-overlap: each pixel goes to the first object with the
            # highest tracker score claiming it (background 0: a score <= 0 claims none).
            scores = torch.tensor([item.tracker_scores.get(obj, 0.0) for obj in ids])
            claim = torch.where(masks, scores[:, None, None], 0.0)
            owner = claim.argmax(dim=0, keepdim=True)
            keep = owner == torch.arange(len(ids))[:, None, None]
            masks = masks & keep & (claim > 0)
        return FrameResult(
            item.frame,
            ids,
            [item.scores[obj] for obj in ids],
            masks.numpy(),
            boxes,
        )

    def trim(self, state: VideoState, frame_idx: int, reverse: bool = False) -> None:
        """Forget what propagation past ``frame_idx`` (in its direction) never reads:
        conditioning frames but the 4 nearest the frames to come, tracked frames outside
        the reach of memory selection (the 15 nearest selectable ones and this frame).
        With ``keep_start`` a forward pass also keeps what the backward pass after it
        reads: the 4 earliest conditioning frames, the 15 earliest selectable ones. Scores
        of frames other than ``frame_idx`` go too (each answer holds its own copy)."""
        reach = min(state.num_frames, MAX_OBJ_PTRS) - 1
        for t in [t for t in state.tracker_scores if t != frame_idx]:
            del state.tracker_scores[t]

        def selectable(group: Group, t: int, backward: bool) -> bool:
            # Meta's forward frame_filter never looks at frame 0, the backward one at all
            score = group.non_cond[t].eff_iou or 0.0
            return (backward or t > 0) and score > MEMORY_SELECTION_THRESH

        for group in state.groups:
            ordered = sorted(group.cond, reverse=reverse)
            keep_cond = set(ordered[-MAX_COND_FRAMES:])
            if state.keep_start and not reverse:
                keep_cond |= set(ordered[:MAX_COND_FRAMES])
            for t in [t for t in group.cond if t not in keep_cond]:
                del group.cond[t]
            nearest = sorted(group.non_cond, reverse=not reverse)
            keep = {t for t in nearest if selectable(group, t, reverse)}
            keep = set([t for t in nearest if t in keep][:reach]) | {frame_idx}
            if state.keep_start and not reverse:
                earliest = [t for t in sorted(group.non_cond) if selectable(group, t, True)]
                keep |= set(earliest[:reach])
            for t in [t for t in group.non_cond if t not in keep]:
                del group.non_cond[t]


def unpack_masks(state: VideoState, packed: dict[int, np.ndarray]) -> dict[int, Tensor]:
    """Cached masks (packed bits) -> bool (H, W) tensors."""
    size = state.height * state.width
    return {
        obj: torch.from_numpy(
            np.unpackbits(bits, count=size).reshape(state.height, state.width).astype(bool)
        )
        for obj, bits in packed.items()
    }


def _resize(video: Tensor, size: int, antialias: bool) -> Tensor:
    return F.interpolate(
        video.float(), size=(size, size), mode="bilinear", align_corners=False, antialias=antialias
    )


def _non_overlapping(masks: Tensor) -> Tensor:
    """Meta's pixel-wise non-overlap: where objects overlap, all but the highest logit are
    clamped to -10 or below."""
    if masks.shape[0] <= 1:
        return masks
    best = masks.argmax(dim=0, keepdim=True)
    keep = best == torch.arange(masks.shape[0])[:, None, None, None]
    return torch.where(keep, masks, masks.clamp(max=-10.0))


def _boxes(masks: Tensor) -> list[tuple[float, float, float, float]]:
    out = []
    for mask in masks:
        ys, xs = torch.nonzero(mask, as_tuple=True)
        out.append((float(xs.min()), float(ys.min()), float(xs.max()), float(ys.max())))
    return out


def _closest_cond(
    frame_idx: int, cond: dict[int, Record]
) -> tuple[dict[int, Record], dict[int, Record]]:
    """Meta's ``select_closest_cond_frames`` (at most 4)."""
    if len(cond) <= MAX_COND_FRAMES:
        return cond, {}
    selected: dict[int, Record] = {}
    before = max((t for t in cond if t < frame_idx), default=None)
    if before is not None:
        selected[before] = cond[before]
    after = min((t for t in cond if t >= frame_idx), default=None)
    if after is not None:
        selected[after] = cond[after]
    remain = MAX_COND_FRAMES - len(selected)
    others = sorted((t for t in cond if t not in selected), key=lambda x: abs(x - frame_idx))
    for t in others[:remain]:
        selected[t] = cond[t]
    return selected, {t: r for t, r in cond.items() if t not in selected}


def _frame_filter(
    non_cond: dict[int, Record], frame_idx: int, num_frames: int, reverse: bool = False
) -> list[int]:
    """Meta's ``frame_filter``: tracked frames already passed (earlier ones, later ones in
    reverse) whose memory score is above the threshold, nearest 15 at most, farthest
    first; the frame just passed always last. Forward it never looks at frame 0."""
    if frame_idx == (num_frames - 1 if reverse else 0):
        return []
    max_num = min(num_frames, MAX_OBJ_PTRS)
    valid: list[int] = []
    near = frame_idx + 1 if reverse else frame_idx - 1
    candidates = range(near, num_frames) if reverse else range(near, 0, -1)
    for i in candidates:
        record = non_cond.get(i)
        if record is None or record.eff_iou is None:
            continue
        if record.eff_iou > MEMORY_SELECTION_THRESH:
            valid.insert(0, i)
        if len(valid) >= max_num - 1:
            break
    if near not in valid:
        valid.append(near)
    return valid


__all__ = [
    "FrameResult",
    "Group",
    "Record",
    "Sam3VideoPredictor",
    "VideoState",
    "hotstart_release",
    "memory_score",
    "unpack_masks",
]
