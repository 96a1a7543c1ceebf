"""VideoPredictor: Meta's SAM2VideoPredictor semantics over a caller-owned VideoState.

The predictor holds the model and its settings, nothing about any video: every call takes
the state it works on. The flow is Meta's: prompts (points, a box, a mask) on any frame
for any object give that frame's masks at once; ``propagate`` then encodes the prompted
frames' memories ("preflight") and tracks every object frame by frame, forward or in
reverse, yielding each frame's masks as soon as they are computed. A prompt added after
propagating (a correction) is answered at once and taken into account by the next
``propagate``. All objects tracked on a frame run as one batch: memory attention once per
shape of memory bank (each object reading its own frames), the heads and the memory
encoder once.
"""

from __future__ import annotations

import sys
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from sam2serve.engine.prompts import Prompt, PromptError, prompt_arrays
from sam2serve.engine.runtime_identity import RuntimeIdentity
from sam2serve.engine.tf32 import tf32_policy
from sam2serve.engine.video.frames import preprocess_frame
from sam2serve.engine.video.memory import (
    MemorySelection,
    bank_shape,
    gather_memories,
    select_memories,
)
from sam2serve.engine.video.model import VideoModel
from sam2serve.engine.video.retention import Retention
from sam2serve.engine.video.sources import FrameSource, as_source
from sam2serve.engine.video.state import (
    FeatureCache,
    FrameOutput,
    ObjectTrack,
    PointPrompt,
    VideoState,
)
from sam2serve.modeling.sam2_video import NO_OBJ_SCORE, FrameFeatures, HeadsOutput

# Meta clamps a previous mask's logits before feeding them back as a mask prompt.
PREV_MASK_CLAMP = 32.0


class VideoPromptError(ValueError):
    """A prompt or request that cannot be applied to a video; the message names it."""


@dataclass
class FrameMasks:
    """Masks of all objects on one frame, at the video's resolution."""

    frame_idx: int
    obj_ids: list[int]
    mask_logits: torch.Tensor  # (N, 1, H, W) float32; N = len(obj_ids)

    @property
    def masks(self) -> torch.Tensor:
        """(N, H, W) bool: logits > 0."""
        return self.mask_logits[:, 0] > 0.0


def default_objects_per_call(device: torch.device) -> int:
    """How many tracked objects one frame step batches on ``device``: all of them on an
    accelerator, where one batched call beats a loop of small ones; one at a time on a
    CPU, where one object's frame step already keeps the cores busy and a batch's
    activations (8 x 4096 x 2048 floats in the memory attention's MLP alone at 8 objects)
    leave the caches, so the memory-bound steps slow down (docs/benchmarks.md, "Objects
    per call on a CPU"). A tracker built from a mode takes its CPU class's measured row
    instead (:func:`sam2serve.runtime.video.objects_per_call_for`)."""
    return 1 if device.type == "cpu" else sys.maxsize


class VideoPredictor:
    def __init__(
        self,
        model: VideoModel,
        *,
        feature_cache_frames: int = 2,
        storage_device: str | torch.device = "cpu",
        encoder_autocast_dtype: torch.dtype | None = None,
        memory_attention_dtype: torch.dtype | None = None,
        runtime: RuntimeIdentity | None = None,
        allow_tf32: bool = False,
        static_bank: tuple[int, int] | None = None,
        objects_per_call: int | None = None,
    ) -> None:
        """``feature_cache_frames``: frames whose encoder features each state keeps (LRU;
        Meta keeps 1). ``storage_device``: where memories and masks are stored ("cpu"
        offloads them from a GPU, as Meta's offload_state_to_cpu).
        ``encoder_autocast_dtype`` / ``memory_attention_dtype``: run the image encoder /
        the memory attention under autocast to that dtype (None: the encoder in its
        weights' dtype, the attention in float32); what they give the heads, the heads,
        the memory encoder and everything stored are as without them. ``runtime``: the
        RuntimeSpec it was built for (None when built by hand); ``allow_tf32``: whether its
        CUDA fp32 work may run in TF32 where the process allows it (False keeps TF32 off
        for its calls: :mod:`sam2serve.engine.tf32`). Set from a mode by
        ``sam2serve.runtime.video``, when it is built. ``static_bank`` (memory slots,
        pointer slots): memory banks padded to that shape, the padding masked (the same
        answers; a compiled tracker's: :mod:`sam2serve.engine.video.compiled`).
        ``objects_per_call``: the most tracked objects one frame step runs as a batch
        (None: the device's :func:`default_objects_per_call`); more objects run in
        consecutive batches of that size, with the same answers."""
        if feature_cache_frames < 1:
            raise ValueError(f"feature_cache_frames must be at least 1, got {feature_cache_frames}")
        if objects_per_call is not None and objects_per_call < 1:
            raise ValueError(f"objects_per_call must be at least 1, got {objects_per_call}")
        self.model = model
        self.config = model.video_config
        self.feature_cache_frames = feature_cache_frames
        self.storage_device = torch.device(storage_device)
        self.memory_dtype = getattr(torch, self.config.memory_dtype_name)
        self.encoder_autocast_dtype = encoder_autocast_dtype
        self.memory_attention_dtype = memory_attention_dtype
        self.runtime = runtime
        self.allow_tf32 = allow_tf32
        self.static_bank = static_bank
        self.objects_per_call = (
            default_objects_per_call(model.device) if objects_per_call is None else objects_per_call
        )

    @property
    def device(self) -> torch.device:
        return self.model.device

    # -- state ------------------------------------------------------------------------------

    def init_state(
        self, frames: FrameSource | Sequence[np.ndarray], *, retention: str = "exact"
    ) -> VideoState:
        """A new state for ``frames``: uint8 (H, W, 3) arrays of one size (kept, not
        copied) or a FrameSource (a file decoded on demand, live frames); features are
        computed when a frame is first needed. ``retention``: "exact" keeps every tracked
        frame's output (Meta's), "bounded" only what the memory reads next
        (:mod:`sam2serve.engine.video.retention`)."""
        source = as_source(frames)
        return VideoState(
            source=source,
            height=source.height,
            width=source.width,
            device=self.device,
            storage_device=self.storage_device,
            features=FeatureCache(self.feature_cache_frames),
            retention=Retention(retention),
        )

    def reset(self, state: VideoState) -> None:
        """Forget every object, prompt and result (the frames and features stay)."""
        state.objects.clear()
        state.retention.forget()

    @torch.inference_mode()
    @tf32_policy
    def frame_features(self, state: VideoState, frame_idx: int) -> FrameFeatures:
        features = state.features.get(frame_idx)
        if features is None:
            frame = state.source.frame(frame_idx)  # uint8: crosses to the device as is
            image = preprocess_frame(frame, self.model.image_size, state.device)
            features = self.model.encode_frames(image.unsqueeze(0), self.encoder_autocast_dtype)
            state.features.put(frame_idx, features)
        return features

    # -- prompts ----------------------------------------------------------------------------

    @torch.inference_mode()
    def add_points(
        self,
        state: VideoState,
        frame_idx: int,
        obj_id: int,
        points: np.ndarray | Sequence[Sequence[float]] | None = None,
        labels: np.ndarray | Sequence[int] | None = None,
        *,
        box: np.ndarray | Sequence[float] | None = None,
        clear_old_points: bool = True,
        normalize_coords: bool = True,
    ) -> FrameMasks:
        """Clicks (points (P, 2) x, y in video pixels; labels 1 positive / 0 negative)
        and/or a box (x0, y0, x1, y1) for ``obj_id`` on ``frame_idx`` (Meta's
        add_new_points_or_box): :meth:`add_prompt` with these arrays as a Prompt."""
        try:
            prompt = Prompt.from_arrays(points, labels, box)
        except PromptError as exc:
            raise VideoPromptError(str(exc)) from None
        return self.add_prompt(
            state,
            frame_idx,
            obj_id,
            prompt,
            clear_old_points=clear_old_points,
            normalize_coords=normalize_coords,
        )

    @torch.inference_mode()
    def add_prompt(
        self,
        state: VideoState,
        frame_idx: int,
        obj_id: int,
        prompt: Prompt,
        *,
        clear_old_points: bool = True,
        normalize_coords: bool = True,
    ) -> FrameMasks:
        """``prompt`` (clicks and/or a box, in video pixels; ``normalize_coords=False``:
        already in [0, 1]) for ``obj_id`` on ``frame_idx``; with ``clear_old_points=False``
        its clicks join the object's earlier clicks on that frame (a box must come first).
        Returns all objects' masks on that frame."""
        self._check_frame(state, frame_idx)
        if prompt.box is not None and not clear_old_points:
            raise VideoPromptError(
                "a box must come before any click on its frame: pass clear_old_points=True"
            )
        coords_array, labels_array = prompt_arrays([prompt])  # (1, P, 2), (1, P)
        coords = torch.from_numpy(coords_array)
        if normalize_coords:
            coords = coords / torch.tensor([state.width, state.height], dtype=torch.float32)
        coords = (coords * self.model.image_size).to(state.device)
        point_labels = torch.from_numpy(labels_array).to(state.device)
        track = self._track_for(state, obj_id)
        previous = None if clear_old_points else track.point_inputs.get(frame_idx)
        if previous is not None:
            coords = torch.cat([previous.coords, coords], dim=1)
            point_labels = torch.cat([previous.labels, point_labels], dim=1)
        point_prompt = PointPrompt(coords, point_labels)
        track.point_inputs[frame_idx] = point_prompt
        track.mask_inputs.pop(frame_idx, None)
        return self._prompt_frame(state, track, frame_idx, points=point_prompt, mask=None)

    @torch.inference_mode()
    def add_mask(
        self, state: VideoState, frame_idx: int, obj_id: int, mask: np.ndarray | torch.Tensor
    ) -> FrameMasks:
        """A binary mask (H, W) of ``obj_id`` on ``frame_idx`` (any size; resized to the
        model's 1024x1024 and re-binarized, as Meta's add_new_mask)."""
        self._check_frame(state, frame_idx)
        mask_tensor = torch.as_tensor(np.asarray(mask) if not torch.is_tensor(mask) else mask)
        if mask_tensor.dim() != 2:
            raise VideoPromptError(f"mask must be 2-D (H, W), got shape {tuple(mask_tensor.shape)}")
        mask_input = mask_tensor.bool()[None, None].float().to(state.device)
        size = self.model.image_size
        if mask_input.shape[-2:] != (size, size):
            mask_input = F.interpolate(
                mask_input, size=(size, size), mode="bilinear", align_corners=False, antialias=True
            )
            mask_input = (mask_input >= 0.5).float()
        track = self._track_for(state, obj_id)
        track.mask_inputs[frame_idx] = mask_input
        track.point_inputs.pop(frame_idx, None)
        return self._prompt_frame(state, track, frame_idx, points=None, mask=mask_input)

    def _prompt_frame(
        self,
        state: VideoState,
        track: ObjectTrack,
        frame_idx: int,
        *,
        points: PointPrompt | None,
        mask: torch.Tensor | None,
    ) -> FrameMasks:
        """Run ``track``'s new prompt on ``frame_idx`` (clicks or a mask) and keep the output
        as a temporary conditioning (or correction) output until propagation. Clicks also
        see the object's previous mask on that frame, as Meta feeds it back."""
        if frame_idx not in track.frames_tracked and state.retention.was_dropped(
            track.obj_id, frame_idx
        ):
            raise VideoPromptError(
                f"obj_id {track.obj_id} was tracked on frame {frame_idx}, and this state keeps "
                "only what the memory reads next (retention 'bounded'): that frame's output "
                "was dropped, so a correction there cannot be answered as Meta's predictor "
                "would; prompt a recent frame, or track with retention 'exact'"
            )
        is_init_cond = frame_idx not in track.frames_tracked
        reverse = False if is_init_cond else track.frames_tracked[frame_idx]
        is_cond = is_init_cond or self.config.add_all_frames_to_correct_as_cond
        prev_logits = None
        prev = track.latest_output(frame_idx, is_cond) if points is not None else None
        if prev is not None:
            prev_logits = prev.pred_masks.to(state.device).clamp(-PREV_MASK_CLAMP, PREV_MASK_CLAMP)
        outputs, _ = self._track_frame(
            state,
            [track],
            frame_idx,
            is_init_cond=is_init_cond,
            reverse=reverse,
            points=points,
            mask=mask,
            prev_mask_logits=prev_logits,
            run_memory_encoder=False,
        )
        track.temp_outputs(is_cond)[frame_idx] = outputs[0]
        return self._frame_masks(state, frame_idx, is_cond)

    @torch.inference_mode()
    def clear_prompts(
        self, state: VideoState, frame_idx: int, obj_id: int, need_output: bool = True
    ) -> FrameMasks | None:
        """Remove ``obj_id``'s prompts on ``frame_idx`` (Meta's clear_all_prompts_in_frame):
        a prompted frame's result becomes an ordinary tracked one."""
        self._check_frame(state, frame_idx)
        track = self._track_for(state, obj_id)
        track.point_inputs.pop(frame_idx, None)
        track.mask_inputs.pop(frame_idx, None)
        track.temp_cond_outputs.pop(frame_idx, None)
        track.temp_non_cond_outputs.pop(frame_idx, None)
        out = track.cond_outputs.pop(frame_idx, None)
        if out is not None:
            track.non_cond_outputs[frame_idx] = out
            track.frames_tracked.pop(frame_idx, None)
        if not need_output:
            return None
        is_cond = any(frame_idx in t.temp_cond_outputs for t in state.objects.values())
        return self._frame_masks(state, frame_idx, is_cond)

    @torch.inference_mode()
    def remove_object(
        self, state: VideoState, obj_id: int, *, strict: bool = False
    ) -> tuple[list[int], list[FrameMasks]]:
        """Drop ``obj_id``; returns the remaining ids and the re-rendered masks of the
        frames where it had prompts (Meta's remove_object)."""
        if obj_id not in state.objects:
            if strict:
                raise VideoPromptError(f"no object with id {obj_id}; existing ids: {state.obj_ids}")
            return state.obj_ids, []
        if len(state.objects) == 1:
            self.reset(state)
            return state.obj_ids, []
        track = state.objects[obj_id]
        prompted = sorted({*track.point_inputs, *track.mask_inputs})
        for frame_idx in prompted:
            self.clear_prompts(state, frame_idx, obj_id, need_output=False)
        del state.objects[obj_id]
        state.retention.forget(obj_id)
        updated = []
        for frame_idx in prompted:
            is_cond = any(frame_idx in t.temp_cond_outputs for t in state.objects.values())
            updated.append(self._frame_masks(state, frame_idx, is_cond))
        return state.obj_ids, updated

    # -- propagation -----------------------------------------------------------------------

    @torch.inference_mode()
    def propagate(
        self,
        state: VideoState,
        start_frame_idx: int | None = None,
        max_frame_num_to_track: int | None = None,
        reverse: bool = False,
    ) -> Generator[FrameMasks, None, None]:
        """Track every object through the video, yielding each frame's masks in order:
        from ``start_frame_idx`` (default: the first prompted frame) forward to the end, or
        in reverse to frame 0, at most ``max_frame_num_to_track`` frames further."""
        self._preflight(state)
        num_frames = state.num_frames
        if start_frame_idx is None:
            start_frame_idx = min(t for track in state.objects.values() for t in track.cond_outputs)
        self._check_frame(state, start_frame_idx)
        if max_frame_num_to_track is None:
            max_frame_num_to_track = num_frames
        if reverse:
            end = max(start_frame_idx - max_frame_num_to_track, 0)
            order = range(start_frame_idx, end - 1, -1) if start_frame_idx > 0 else range(0)
        else:
            end = min(start_frame_idx + max_frame_num_to_track, num_frames - 1)
            order = range(start_frame_idx, end + 1)
        for frame_idx in order:
            yield self._propagate_frame(state, frame_idx, reverse)

    def _propagate_frame(self, state: VideoState, frame_idx: int, reverse: bool) -> FrameMasks:
        """Every object on one frame: a prompted object's stored output; all the tracked
        ones through one :meth:`_track_frame` (one batch), their banks grouped by shape."""
        tracks = list(state.objects.values())
        masks: list[torch.Tensor | None] = [None] * len(tracks)
        groups: dict[Any, list[tuple[int, MemorySelection]]] = {}
        for i, track in enumerate(tracks):
            if frame_idx in track.cond_outputs:
                masks[i] = track.cond_outputs[frame_idx].pred_masks.to(state.device)
            else:
                selection = select_memories(
                    track, frame_idx, reverse, self._horizon(state), self.config
                )
                groups.setdefault(self._batch_key(selection), []).append((i, selection))
        members = [member for group in groups.values() for member in group]
        step = self.objects_per_call
        for start in range(0, len(members), step):
            chunk = members[start : start + step]
            outputs, low_res = self._track_frame(
                state,
                [tracks[i] for i, _ in chunk],
                frame_idx,
                is_init_cond=False,
                reverse=reverse,
                points=None,
                mask=None,
                prev_mask_logits=None,
                run_memory_encoder=True,
                selection=tuple(selection for _, selection in chunk),
            )
            for row, ((i, _), out) in enumerate(zip(chunk, outputs, strict=True)):
                tracks[i].non_cond_outputs[frame_idx] = out
                masks[i] = low_res[row : row + 1]
        for track in tracks:
            track.frames_tracked[frame_idx] = reverse
        state.apply_retention(frame_idx, reverse, self.config)
        stacked = torch.cat([m for m in masks if m is not None])
        return FrameMasks(frame_idx, state.obj_ids, self._to_video_size(state, stacked))

    def _batch_key(self, selection: MemorySelection) -> Any:
        """Objects with equal keys share a memory-attention call: banks of one shape where
        the model reads banks per object (SAM2Video), else the very same bank."""
        if self.model.per_object_banks:
            return bank_shape(selection)
        return selection

    # -- live --------------------------------------------------------------------------------

    @torch.inference_mode()
    def commit_prompts(self, state: VideoState) -> None:
        """Encode the memories of the prompts added since the last propagation now (what
        ``propagate`` does first): a live state calls it after a prompt, while the
        prompted frame is still held."""
        self._preflight(state)

    @torch.inference_mode()
    def track_next(self, state: VideoState, frame_idx: int) -> FrameMasks:
        """Track every object on ``frame_idx`` forward from what the state holds (a live
        frame just appended): its masks, as ``propagate`` would yield them. With no object
        yet, no masks (N = 0)."""
        self._check_frame(state, frame_idx)
        if not state.objects:
            empty = torch.zeros((0, 1, state.height, state.width), dtype=torch.float32)
            return FrameMasks(frame_idx, [], empty)
        self._preflight(state)
        return self._propagate_frame(state, frame_idx, reverse=False)

    @tf32_policy
    def _preflight(self, state: VideoState) -> None:
        """Encode the memories of prompts added since the last propagation and move them
        into the objects' outputs (Meta's propagate_in_video_preflight)."""
        if not state.objects:
            raise VideoPromptError("no object has a prompt yet: add points, a box or a mask first")
        for track in state.objects.values():
            for cond in (False, True):
                pending = track.temp_outputs(cond)
                for frame_idx, out in pending.items():
                    if out.maskmem_features is None:
                        frame = self.frame_features(state, frame_idx)
                        memory = self.model.encode_memory(
                            frame,
                            out.pred_masks.to(state.device),
                            out.object_score_logits.to(state.device),
                            from_points=True,
                        )
                        out.maskmem_features = self._store(memory.to(self.memory_dtype))
                    track.outputs(cond)[frame_idx] = out
                    if self.config.clear_non_cond_mem_around_input:
                        self._clear_memory_around(state, frame_idx, track)
                pending.clear()
            if not track.cond_outputs:
                raise VideoPromptError(
                    f"object {track.obj_id} has no prompt on any frame; add one first"
                )
            for frame_idx in track.cond_outputs:
                track.non_cond_outputs.pop(frame_idx, None)

    def _clear_memory_around(self, state: VideoState, frame_idx: int, track: ObjectTrack) -> None:
        reach = self.config.memory_temporal_stride_for_eval * self.config.num_maskmem
        for t in range(frame_idx - reach, frame_idx + reach + 1):
            track.non_cond_outputs.pop(t, None)

    # -- one frame --------------------------------------------------------------------------

    @tf32_policy
    def _track_frame(
        self,
        state: VideoState,
        tracks: list[ObjectTrack],
        frame_idx: int,
        *,
        is_init_cond: bool,
        reverse: bool,
        points: PointPrompt | None,
        mask: torch.Tensor | None,
        prev_mask_logits: torch.Tensor | None,
        run_memory_encoder: bool,
        selection: MemorySelection | Sequence[MemorySelection] | None = None,
    ) -> tuple[list[FrameOutput], torch.Tensor]:
        """Meta's track_step for B objects on one frame (B = 1 with a prompt), as one
        batch: ``selection`` is every object's memory bank (one for all, or one per object;
        None: selected here). Objects whose banks have one :meth:`_batch_key` run through
        memory attention together (consecutive ones: the caller orders them), then all of
        them through the heads and the memory encoder at once: per object what Meta's
        per-object loop computes.

        Returns one FrameOutput per object (stored on the storage device) and the low-res
        logits (B, 1, 256, 256) on the compute device.
        """
        model = self.model
        batch = len(tracks)
        frame = self.frame_features(state, frame_idx)
        if mask is not None and self.config.use_mask_input_as_output_without_sam:
            heads: HeadsOutput = model.mask_as_output(frame, batch, mask)
        else:
            if is_init_cond:
                pix_feat = model.condition_without_memory(frame).expand(batch, -1, -1, -1)
            else:
                if selection is None:
                    selection = [
                        select_memories(
                            track, frame_idx, reverse, self._horizon(state), self.config
                        )
                        for track in tracks
                    ]
                pix_feat = self._condition(state, frame, tracks, selection)
            num_points = 0 if points is None else points.labels.shape[1]
            heads = model.forward_heads(
                pix_feat,
                frame.high_res_feats,
                None if points is None else points.coords,
                None if points is None else points.labels,
                prev_mask_logits if mask is None else mask,
                model.use_multimask(is_init_cond, num_points),
            )
        memory = None
        if run_memory_encoder:
            memory = model.encode_memory(
                frame, heads.low_res_masks, heads.object_score_logits, points is not None
            )
            memory = self._store(memory.to(self.memory_dtype))
        pred_masks = self._store(heads.low_res_masks)
        outputs = [
            FrameOutput(
                pred_masks=pred_masks[i : i + 1],
                obj_ptr=heads.obj_ptr[i : i + 1],
                object_score_logits=heads.object_score_logits[i : i + 1],
                maskmem_features=None if memory is None else memory[i : i + 1],
            )
            for i in range(batch)
        ]
        return outputs, heads.low_res_masks

    def _condition(
        self,
        state: VideoState,
        frame: FrameFeatures,
        tracks: list[ObjectTrack],
        selection: MemorySelection | Sequence[MemorySelection],
    ) -> torch.Tensor:
        """(B, C, 64, 64): each object's features attended to its own memory bank, one
        memory-attention call per run of objects with one :meth:`_batch_key`."""
        selections = (
            [selection] * len(tracks) if isinstance(selection, MemorySelection) else selection
        )
        memory_pos = self.model.memory_position(state.device)
        parts, start = [], 0
        while start < len(tracks):
            key = self._batch_key(selections[start])
            end = start + 1
            while end < len(tracks) and self._batch_key(selections[end]) == key:
                end += 1
            memories, pointers = gather_memories(
                tracks[start:end], selections[start:end], state.device
            )
            parts.append(
                self.model.condition_on_memory(
                    frame,
                    end - start,
                    memories,
                    memory_pos,
                    pointers,
                    self.memory_attention_dtype,
                    self.static_bank,
                )
            )
            start = end
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    # -- helpers ----------------------------------------------------------------------------

    def _horizon(self, state: VideoState) -> int:
        """The frame count the memory selection sees: the video's, or for a video still
        growing (live) any count past the pointer reach, as a long clip's."""
        if state.source.final:
            return state.num_frames
        return max(state.num_frames, self.config.max_obj_ptrs_in_encoder)

    def _store(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(self.storage_device, non_blocking=True)

    def _frame_masks(self, state: VideoState, frame_idx: int, cond: bool) -> FrameMasks:
        """All objects' latest masks on a frame at video size (absent: NO_OBJ_SCORE)."""
        logits = torch.full(
            (len(state.objects), 1, state.height, state.width),
            NO_OBJ_SCORE,
            dtype=torch.float32,
            device=state.device,
        )
        for i, track in enumerate(state.objects.values()):
            out = track.latest_output(frame_idx, cond)
            if out is not None:
                logits[i : i + 1] = self._to_video_size(state, out.pred_masks.to(state.device))
        return FrameMasks(frame_idx, state.obj_ids, logits)

    def _to_video_size(self, state: VideoState, low_res: torch.Tensor) -> torch.Tensor:
        size = (state.height, state.width)
        if low_res.shape[-2:] == size:
            return low_res
        return F.interpolate(low_res, size=size, mode="bilinear", align_corners=False)

    def _track_for(self, state: VideoState, obj_id: int) -> ObjectTrack:
        if isinstance(obj_id, bool) or not isinstance(obj_id, (int, np.integer)):
            raise VideoPromptError(f"object id must be an integer, got {obj_id!r}")
        obj_id = int(obj_id)
        if obj_id not in state.objects:
            state.objects[obj_id] = ObjectTrack(obj_id)
        return state.objects[obj_id]

    def _check_frame(self, state: VideoState, frame_idx: int) -> None:
        if not isinstance(frame_idx, (int, np.integer)) or not 0 <= frame_idx < state.num_frames:
            raise VideoPromptError(
                f"frame index {frame_idx!r} is out of range: the video has "
                f"{state.num_frames} frames (0..{state.num_frames - 1})"
            )
