"""What a video state keeps of the frames it has tracked: one policy per state (the state
applies it after each tracked frame: :meth:`~sam2serve.engine.video.state.VideoState.apply_retention`).

- ``exact`` (the default, Meta's): every tracked frame's output stays (memory features,
  low-res mask logits, object pointer: 0.75 MiB per object and frame at SAM 2.1's sizes),
  so any later prompt, correction or propagation sees what Meta's predictor would.
- ``bounded``: while propagating, an object keeps its prompted ("conditioning") frames and
  only the outputs of the last :func:`memory_window` frames behind the one just tracked:
  all that SAM 2's memory bank reads for the next frame (the ``num_maskmem - 1`` previous
  memories at the eval stride, and up to ``max_obj_ptrs_in_encoder - 1`` previous object
  pointers). Older outputs are dropped, so held state does not grow with the clip.

One forward (or one reverse) pass from the prompted frames gives the same masks in both
modes: nothing a frame reads has been dropped. What can differ in bounded mode:

- a correction (a prompt for an object on a frame it was tracked on) whose output was
  dropped: Meta feeds that frame's previous mask back with the clicks; the engine refuses
  it (:meth:`Retention.was_dropped`; the predictor raises VideoPromptError) instead of
  answering differently;
- a second pass over frames already tracked (e.g. a reverse pass from a frame after a
  forward one): its first frames would read the other pass's memories of frames just
  beyond the start, which were dropped; it tracks from the prompts alone there
  (docs/video.md measures by how much the masks differ).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from sam2serve.config import VideoConfig

RETENTION_MODES = ("exact", "bounded")


def memory_window(cfg: VideoConfig) -> int:
    """Frames behind the current one whose outputs the next frame's memory bank may read."""
    return max(cfg.num_maskmem * cfg.memory_temporal_stride_for_eval, cfg.max_obj_ptrs_in_encoder)


@dataclass
class Retention:
    """A state's policy (``mode``: exact or bounded) and, bounded, what it dropped."""

    mode: str = "exact"
    # obj_id -> (first, last): the span of frames whose tracked outputs were dropped.
    dropped: dict[int, tuple[int, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.mode not in RETENTION_MODES:
            raise ValueError(f"retention must be one of {RETENTION_MODES}, got {self.mode!r}")

    @property
    def bounded(self) -> bool:
        return self.mode == "bounded"

    def is_behind(self, frame: int, frame_idx: int, reverse: bool, cfg: VideoConfig) -> bool:
        """Whether, bounded, ``frame``'s tracked output is out of reach of every frame after
        ``frame_idx`` in this pass's direction: :func:`memory_window` frames or more behind."""
        window = memory_window(cfg)
        return self.bounded and (
            frame >= frame_idx + window if reverse else frame <= frame_idx - window
        )

    def record_dropped(self, obj_id: int, frames: Sequence[int]) -> None:
        """Note that ``obj_id``'s tracked outputs on ``frames`` were dropped."""
        if not frames:
            return
        first, last = self.dropped.get(obj_id, (min(frames), max(frames)))
        self.dropped[obj_id] = (min(first, *frames), max(last, *frames))

    def was_dropped(self, obj_id: int, frame_idx: int) -> bool:
        """Whether ``obj_id``'s tracked output on ``frame_idx`` may have been dropped."""
        span = self.dropped.get(obj_id)
        return span is not None and span[0] <= frame_idx <= span[1]

    def forget(self, obj_id: int | None = None) -> None:
        """Forget what was dropped for ``obj_id`` (None: every object)."""
        if obj_id is None:
            self.dropped.clear()
        else:
            self.dropped.pop(obj_id, None)


__all__ = ["RETENTION_MODES", "Retention", "memory_window"]
