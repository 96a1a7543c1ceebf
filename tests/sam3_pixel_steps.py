"""SAM 3's video predictor with its networks replaced by a frame's pixels, for tests of
what is built around it (pushing frames, the live protocol): the scheduling, hot start's
holding back, ``finish`` and the state are the real predictor's; a frame costs
microseconds instead of the reduced networks' seconds on a CPU."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from sam2serve.concepts.engine import ExemplarBox
from sam2serve.concepts.video_association import VideoThresholds
from sam2serve.concepts.video_predictor import Sam3VideoPredictor, VideoState, _Pending


class PixelSteps(Sam3VideoPredictor):
    """Frames whose objects are written in them: green value k > 0 is object k (score
    k / 10), blue value k marks object k removed by hot start. Each step's frame index is
    logged (add_prompt's too)."""

    def __init__(self, thresholds: VideoThresholds) -> None:
        super().__init__(None, None, None, None, thresholds)  # type: ignore[arg-type]  # no networks
        self.steps: list[int] = []

    def start(  # type: ignore[override]  # no phrase encoding
        self,
        num_frames: int,
        height: int,
        width: int,
        phrase: str | None,
        boxes: Sequence[ExemplarBox] = (),
    ) -> VideoState:
        return VideoState(num_frames, height, width)

    def encode(self, frame):  # type: ignore[override]  # the pixels stand for the encodings
        return frame, None

    def step(self, state, frame_idx, encoding, frame, reverse=False):  # type: ignore[override]
        self.steps.append(frame_idx)
        green, blue = encoding[..., 1], encoding[..., 2]
        masks = {int(k): torch.from_numpy(green == k) for k in np.unique(green) if k}
        for k in masks:
            state.scores.setdefault(k, k / 10)
        state.hot.removed.update(int(k) for k in np.unique(blue) if k)
        tracker = {k: float(frame_idx % 3 + k) for k in masks}
        return _Pending(frame_idx, masks, dict(state.scores), tracker)


def label(frames: list[np.ndarray], seed: int = 0) -> list[np.ndarray]:
    """The frames with 0-3 overlapping labelled blocks each written in green (blue
    cleared), now and then one marked removed in blue."""
    rng = np.random.default_rng(seed)
    out = []
    for frame in frames:
        frame = frame.copy()
        height, width = frame.shape[:2]
        frame[..., 1:] = 0
        for value in rng.choice(np.arange(1, 6), int(rng.integers(0, 4)), replace=False):
            y, x = rng.integers(0, height - 4), rng.integers(0, width - 4)
            frame[y : y + 5, x : x + 6, 1] = value
        if rng.random() < 0.2:
            frame[0, 0, 2] = rng.integers(1, 6)
        out.append(frame)
    return out


def clip(count: int, height: int, width: int, seed: int = 0) -> list[np.ndarray]:
    return label([np.zeros((height, width, 3), np.uint8)] * count, seed)
