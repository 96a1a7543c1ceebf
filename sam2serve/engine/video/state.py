"""The inference state of one video: a value the caller owns (one per video/session).

It holds the frames (a :class:`~sam2serve.engine.video.sources.FrameSource`: arrays, a
file decoded on demand, or live frames), a retention policy (what it keeps of tracked
frames: :mod:`sam2serve.engine.video.retention`), a small LRU cache of frame features, and per object its prompts and
outputs. Nothing about a video lives on the predictor, so one predictor serves any number
of videos (one at a time per state: a state is not safe to mutate from two threads).

Memory held (SAM 2.1, per object and tracked frame, on ``storage_device``): the memory
features (64x64x64 bfloat16, 512 KiB), the low-res mask logits (256x256 float32,
256 KiB) and the object pointer (1 KiB) - as Meta's predictor keeps. Frame features are
recomputed on demand and only ``feature_cache_frames`` of them are kept (16 MiB each).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from sam2serve.config import VideoConfig
from sam2serve.engine.video.model import VideoModel
from sam2serve.engine.video.retention import Retention
from sam2serve.engine.video.sources import FrameSource
from sam2serve.modeling.sam2_video import FrameFeatures


@dataclass
class PointPrompt:
    """Clicks (and box corners, labels 2/3, first) of one object on one frame."""

    coords: torch.Tensor  # (1, P, 2) float32, in the model's 1024x1024 input frame
    labels: torch.Tensor  # (1, P) int32


@dataclass
class FrameOutput:
    """One object's result on one frame: what later frames and the output need."""

    pred_masks: torch.Tensor  # (1, 1, 256, 256) low-res logits
    obj_ptr: torch.Tensor  # (1, C)
    object_score_logits: torch.Tensor  # (1, 1)
    maskmem_features: torch.Tensor | None  # (1, mem_dim, 64, 64) bfloat16; None until encoded


@dataclass
class ObjectTrack:
    """One object: prompts per frame, outputs of prompted ("cond") and tracked frames, and
    the not-yet-consolidated outputs of prompts added since the last propagation."""

    obj_id: int
    point_inputs: dict[int, PointPrompt] = field(default_factory=dict)
    mask_inputs: dict[int, torch.Tensor] = field(default_factory=dict)
    cond_outputs: dict[int, FrameOutput] = field(default_factory=dict)
    non_cond_outputs: dict[int, FrameOutput] = field(default_factory=dict)
    temp_cond_outputs: dict[int, FrameOutput] = field(default_factory=dict)
    temp_non_cond_outputs: dict[int, FrameOutput] = field(default_factory=dict)
    frames_tracked: dict[int, bool] = field(default_factory=dict)  # frame -> reverse

    def outputs(self, cond: bool) -> dict[int, FrameOutput]:
        return self.cond_outputs if cond else self.non_cond_outputs

    def temp_outputs(self, cond: bool) -> dict[int, FrameOutput]:
        return self.temp_cond_outputs if cond else self.temp_non_cond_outputs

    def latest_output(self, frame_idx: int, cond: bool) -> FrameOutput | None:
        """The newest output on a frame: a pending prompt's first, then stored ones."""
        for outputs in (self.temp_outputs(cond), self.cond_outputs, self.non_cond_outputs):
            if frame_idx in outputs:
                return outputs[frame_idx]
        return None


class FeatureCache:
    """The features of at most ``capacity`` frames, least recently used evicted."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"feature cache capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self._items: OrderedDict[int, FrameFeatures] = OrderedDict()

    def get(self, frame_idx: int) -> FrameFeatures | None:
        item = self._items.get(frame_idx)
        if item is not None:
            self._items.move_to_end(frame_idx)
        return item

    def put(self, frame_idx: int, features: FrameFeatures) -> None:
        self._items[frame_idx] = features
        self._items.move_to_end(frame_idx)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


@dataclass
class VideoState:
    """Everything about one video's tracking session; created by VideoPredictor.init_state."""

    source: FrameSource  # the frames, uint8 (H, W, 3), read when their features are needed
    height: int
    width: int
    device: torch.device  # where the model computes
    storage_device: torch.device  # where memories and masks are kept
    features: FeatureCache
    objects: dict[int, ObjectTrack] = field(default_factory=dict)  # insertion order
    retention: Retention = field(default_factory=Retention)

    @property
    def frames(self) -> FrameSource:
        """The frames (``frames[i]``, ``len(frames)``, iteration): the source."""
        return self.source

    @property
    def num_frames(self) -> int:
        return len(self.source)

    @property
    def obj_ids(self) -> list[int]:
        return list(self.objects)

    def apply_retention(self, frame_idx: int, reverse: bool, cfg: VideoConfig) -> None:
        """After tracking ``frame_idx``, drop (bounded retention) every object's tracked
        outputs and tracked-frame marks that no later frame of this pass reads; prompted
        frames stay. What was dropped is recorded (:meth:`Retention.was_dropped`)."""
        retention = self.retention
        if not retention.bounded:
            return
        for track in self.objects.values():
            old = [
                t for t in track.non_cond_outputs if retention.is_behind(t, frame_idx, reverse, cfg)
            ]
            old += [
                t
                for t in track.frames_tracked
                if retention.is_behind(t, frame_idx, reverse, cfg)
                and t not in track.cond_outputs
                and t not in track.non_cond_outputs
            ]
            for t in old:
                track.non_cond_outputs.pop(t, None)
                track.frames_tracked.pop(t, None)
            retention.record_dropped(track.obj_id, old)

    def retained_entries(self) -> int:
        """Per-frame entries the tracking holds now (outputs, tracked-frame marks, cached
        features): what bounded retention keeps from growing with the clip. The frames the
        source holds are its own (``source.held_frames()``)."""
        total = len(self.features)
        for track in self.objects.values():
            total += len(track.cond_outputs) + len(track.non_cond_outputs)
            total += len(track.temp_cond_outputs) + len(track.temp_non_cond_outputs)
            total += len(track.frames_tracked)
        return total

    def memory_bytes(self) -> int:
        """Bytes of the tensors held for the objects (memories, masks, pointers, prompts)."""
        total = 0
        for track in self.objects.values():
            for outputs in (
                track.cond_outputs,
                track.non_cond_outputs,
                track.temp_cond_outputs,
                track.temp_non_cond_outputs,
            ):
                for out in outputs.values():
                    tensors = [out.pred_masks, out.obj_ptr, out.object_score_logits]
                    if out.maskmem_features is not None:
                        tensors.append(out.maskmem_features)
                    total += sum(t.numel() * t.element_size() for t in tensors)
            total += sum(m.numel() * m.element_size() for m in track.mask_inputs.values())
        return total


def object_frame_bytes(model: VideoModel) -> int:
    """Bytes one object holds for each frame it is tracked on (what ``memory_bytes``
    counts per output): memory features, low-res mask logits, object pointer and score."""
    memory_dtype = getattr(torch, model.video_config.memory_dtype_name)
    side = model.image_size // 16  # the memory's feature map (64 at 1024)
    low_res = model.image_size // 4  # the decoder's mask logits (256 at 1024)
    hidden = model.config.d_model  # the object pointer's width
    memory: int = model.video_config.mem_dim * side * side * memory_dtype.itemsize
    return memory + low_res * low_res * 4 + hidden * 4 + 4
