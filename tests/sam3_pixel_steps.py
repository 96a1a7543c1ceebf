"""SAM 3's video predictor with its networks replaced by a frame's pixels, for tests of
what is built around it (pushing frames, the live protocol): the scheduling, hot start's
holding back, ``finish`` and the state are the real predictor's; a frame costs
microseconds instead of the reduced networks' seconds on a CPU."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

import numpy as np
import torch

from sam2serve.concepts.engine import ExemplarBox
from sam2serve.concepts.video_association import VideoThresholds
from sam2serve.concepts.video_predictor import Sam3VideoPredictor, VideoState, _Pending


class PixelSteps(Sam3VideoPredictor):
    """Frames whose objects are written in them: green value k > 0 is object k (score
    k / 10), blue value k marks object k removed; hot start's rules run on them (an
    object absent from a frame is unmatched there, the two lowest present share a
    detection: tracks only, an object's first frame makes it). Each step's frame index is logged (add_prompt's too)."""

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

    def step(self, state, frame_idx, encoding, frame, reverse=False):  # type: ignore[override]  # pixels for encodings
        self.steps.append(frame_idx)
        green, blue = encoding[..., 1], encoding[..., 2]
        masks = {int(k): torch.from_numpy(green == k) for k in np.unique(green) if k}
        # hot start's own bookkeeping: an object known but absent is unmatched, the first
        # two present share a detection (duplicates)
        gone = state.hot.removed  # a removed id is never used again (SAM 3's ids grow)
        tracks = [k for k in state.scores if k not in gone]
        present = [k for k in sorted(masks) if k in tracks]
        assoc = SimpleNamespace(
            det_to_tracks={0: np.array(present[:2])} if len(present) > 1 else {},
            unmatched=np.array([k for k in tracks if k not in masks], np.int64),
        )
        new = [k for k in sorted(masks) if k not in state.scores and k not in gone]
        state.hot.update(frame_idx, reverse, assoc, np.array(new, np.int64), self.th)
        for k in masks:
            if k not in gone:
                state.scores.setdefault(k, k / 10)
        state.hot.removed.update(int(k) for k in np.unique(blue) if k)
        tracker = {k: float(frame_idx % 3 + k) for k in masks}
        return _Pending(frame_idx, masks, dict(state.scores), tracker)


def label(frames: list[np.ndarray], seed: int = 0) -> list[np.ndarray]:
    """The frames with labelled blocks written in green (blue cleared): object 1 on every
    frame, 0-2 of objects 2-5 beside it (overlapping), now and then one of those marked
    removed in blue."""
    rng = np.random.default_rng(seed)
    out = []
    for frame in frames:
        frame = frame.copy()
        height, width = frame.shape[:2]
        frame[..., 1:] = 0
        others = rng.choice(np.arange(2, 6), int(rng.integers(0, 3)), replace=False)
        for value in [1, *others.tolist()]:
            y, x = rng.integers(0, height - 4), rng.integers(0, width - 4)
            frame[y : y + 5, x : x + 6, 1] = value
        if rng.random() < 0.2:
            frame[0, 0, 2] = rng.integers(2, 6)
        out.append(frame)
    return out


def clip(count: int, height: int, width: int, seed: int = 0) -> list[np.ndarray]:
    return label([np.zeros((height, width, 3), np.uint8)] * count, seed)
